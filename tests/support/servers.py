"""Servers of the tests' own: a free local port, a process's last lines, and a PostgreSQL
cluster."""

from __future__ import annotations

import glob
import os
import pwd
import signal
import socket
import subprocess
import time
from pathlib import Path

from support.system import missing

from autograder.run import sandbox

PASSWORD = "s3cret-for-the-test"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def postgres_binaries() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if not found:
        missing(
            "PostgreSQL is not installed: `make postgres` installs Debian's postgresql package "
            "(make test does it first)."
        )
    return Path(found[-1]).parent


def postgres_cluster(binaries: Path, home: Path):
    """Initialise a cluster in ``home`` and run its server; yields its URL and port, stops it
    afterwards.

    The server is a child of this process (no ``pg_ctl``, which detaches it) and gets SIGINT, a fast
    shutdown, when this process ends, however it ends: a test run that is killed leaves no server
    behind.
    """
    data, sockets, log = home / "data", home / "sockets", home / "server.log"
    sockets.mkdir()
    (home / "pw").write_text(PASSWORD + "\n")
    # PostgreSQL refuses to run as root; Debian's package creates the `postgres` user for it.
    as_user: list[str] = []
    user = None
    if os.geteuid() == 0:
        user = pwd.getpwnam("postgres")
        home.chmod(0o755)
        for path in [home, sockets, home / "pw"]:  # the server writes its data and log next to them
            os.chown(path, user.pw_uid, user.pw_gid)
        as_user = ["runuser", "-u", "postgres", "--"]

    def run(*command: str) -> None:
        done = subprocess.run([*as_user, *command], capture_output=True, text=True, cwd=home)
        assert done.returncode == 0, f"{command[0]} failed:\n{done.stdout}\n{done.stderr}\n" + (
            log.read_text() if log.exists() else ""
        )

    port = free_port()
    run(
        str(binaries / "initdb"),
        "-D",
        str(data),
        "-U",
        "grader",
        f"--pwfile={home / 'pw'}",
        "--auth-local=trust",
        "--auth-host=scram-sha-256",
        "--no-sync",
    )
    with open(log, "w") as handle:
        if user:
            os.chown(log, user.pw_uid, user.pw_gid)
        server = subprocess.Popen(
            sandbox.tethered(
                [
                    str(binaries / "postgres"),
                    "-D",
                    str(data),
                    "-p",
                    str(port),
                    "-k",
                    str(sockets),
                    "-c",
                    "listen_addresses=127.0.0.1",
                    "-c",
                    "fsync=off",
                ],
                signal.SIGINT,
                uid=user.pw_uid if user else None,
                gid=user.pw_gid if user else None,
            ),
            cwd=home,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        import psycopg

        deadline = time.monotonic() + 60
        while True:
            assert server.poll() is None, (
                f"postgres exited with {server.returncode}:\n{log.read_text()}"
            )
            try:
                admin = psycopg.connect(
                    host="127.0.0.1",
                    port=port,
                    user="grader",
                    password=PASSWORD,
                    dbname="postgres",
                    autocommit=True,
                    connect_timeout=5,
                )
                break
            except psycopg.OperationalError:
                assert time.monotonic() < deadline, (
                    f"postgres did not answer within 60 s:\n{log.read_text()}"
                )
                time.sleep(0.2)
        with admin:
            admin.execute("CREATE DATABASE gradebook")
        yield {
            "url": f"postgresql://grader:{PASSWORD}@127.0.0.1:{port}/gradebook",
            "port": port,
            "pid": server.pid,
        }
    finally:
        server.send_signal(signal.SIGINT)  # fast shutdown: ends the sessions, writes nothing more
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
