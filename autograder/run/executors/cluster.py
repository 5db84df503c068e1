"""A Dask cluster seen from outside: is a scheduler there, start one or a worker as a process, what
ran where."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from autograder.course.config import tool_env
from autograder.course.paths import HOME
from autograder.run.executors.base import ClusterError

CONNECT_TIMEOUT_S = 5
RAN_ON = "ran_on.txt"  # in a job's folder after a cluster ran it: the worker's name and address


def one_line(error: BaseException) -> str:
    """An exception's message in one line, at most 200 characters."""
    text = " ".join(str(error).split())
    return text if len(text) <= 200 else text[:197] + "..."


def unanswered(address: str, error: BaseException) -> ClusterError:
    """The error for a scheduler that did not answer: refused, timed out, or not speaking Dask."""
    return ClusterError(
        f"no Dask scheduler answered at {address} within {CONNECT_TIMEOUT_S} s "
        f"({type(error).__name__}: {one_line(error)}); nothing was graded"
    )


def apart(make):
    """``make()`` in a thread of its own, its result or its exception here.

    Dask's client and ``asyncio.run`` refuse a thread whose event loop is
    running, as the main thread of a Jupyter kernel's is (an instructor who
    grades from a notebook) or one a test left behind; the client, once made,
    runs its own loop in its own thread and is used from any.
    """
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="dask-start") as pool:
        return pool.submit(make).result()


def check_scheduler(address: str) -> None:
    """Raise :class:`ClusterError` unless a Dask scheduler answers at ``tcp://HOST:PORT`` within 5
    s."""
    import asyncio
    from urllib.parse import urlsplit

    parts = urlsplit(address if "://" in address else "tcp://" + address)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "tcp" or not parts.hostname or not port:
        raise ClusterError(f"a Dask scheduler's address is tcp://HOST:PORT; got {address!r}")

    async def identity() -> dict:
        from distributed.comm import connect

        comm = await connect(address, timeout=CONNECT_TIMEOUT_S)
        try:
            await comm.write({"op": "identity", "reply": True})
            return await comm.read()
        finally:
            comm.abort()

    try:
        # refused: at once
        socket.create_connection((parts.hostname, port), timeout=CONNECT_TIMEOUT_S).close()
        answer = apart(lambda: asyncio.run(asyncio.wait_for(identity(), CONNECT_TIMEOUT_S)))
    except Exception as error:  # noqa: BLE001 - refused, timed out, or a peer that does not speak Dask
        raise unanswered(address, error) from None
    if not isinstance(answer, dict) or answer.get("type") != "Scheduler":
        raise ClusterError(
            f"what answered at {address} is not a Dask scheduler; nothing was graded"
        )


def start_process(
    command: list[str], log: Path, env: dict | None = None, cwd: Path = HOME
) -> subprocess.Popen:
    """``command`` (a scheduler, a worker) as a process of its own session, writing to ``log``.

    It gets SIGTERM when this process ends, however that happens
    (:func:`autograder.run.sandbox.tethered`); ``env`` defaults to
    :func:`autograder.course.config.tool_env`. End it with :func:`stop_group`.
    """
    from autograder.run.sandbox import tethered

    with log.open("w") as handle:
        return subprocess.Popen(
            tethered(command, signal.SIGTERM),
            cwd=cwd,
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=env or tool_env(),
            start_new_session=True,
        )


def wait_for_workers(client, names: set[str], timeout_s: float = 60) -> None:
    """Wait until workers of each of ``names`` have joined ``client``'s scheduler; RuntimeError
    after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not names <= {worker["name"] for worker in client.scheduler_info()["workers"].values()}:
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"workers {sorted(names)} did not join the scheduler within {timeout_s:g} s"
            )
        time.sleep(0.2)


def runner_sees() -> dict:
    """What a process that this Dask worker starts (a runner is one) sees: its host's name, the job
    id of the Slurm job it is in (or None), ``CUDA_VISIBLE_DEVICES`` and the GPUs torch finds there.
    Submit it to a worker; for checks of a cluster's set-up (gpu-check, slurm-check). On a machine
    without a GPU it reports 0 GPUs and no name.
    """
    import json

    code = (
        "import json, os, socket, torch; print(json.dumps({'host': socket.gethostname(), "
        "'SLURM_JOB_ID': os.environ.get('SLURM_JOB_ID'), "
        "'CUDA_VISIBLE_DEVICES': os.environ.get('CUDA_VISIBLE_DEVICES'), "
        "'device_count': torch.cuda.device_count(), "
        "'name': torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    return json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr[-500:]}


def jobs_per_worker(workdir: Path) -> dict[str, int]:
    """How many of the jobs in a grading work folder each worker ran, by the name in their
    :data:`RAN_ON`."""
    counts: dict[str, int] = {}
    for path in sorted(workdir.glob(f"jobs/*/*/*/{RAN_ON}")):
        name = path.read_text().split()[0]
        counts[name] = counts.get(name, 0) + 1
    return counts


def start_scheduler(
    log: Path, env: dict | None = None, timeout_s: float = 60
) -> tuple[subprocess.Popen, str]:
    """A ``dask scheduler`` on a free port of 127.0.0.1, as a process of its own; returns it and its
    address.

    It writes to ``log``, runs in a session of its own and gets SIGTERM when this process ends,
    however that happens (:func:`start_process`). Returns once it accepts connections; raises
    RuntimeError, with the end of its log, if it ended or did not within ``timeout_s``. For checks
    and tests on one machine; end it with :func:`stop_group`.
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = start_process(
        [
            sys.executable,
            "-m",
            "distributed.cli.dask_scheduler",
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--no-dashboard",
        ],
        log,
        env,
    )
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process, f"tcp://127.0.0.1:{port}"
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                stop_group(process)
                raise RuntimeError(
                    f"the Dask scheduler did not start within {timeout_s:g} s:\n"
                    f"{log.read_text(errors='replace')[-2000:]}"
                ) from None
            time.sleep(0.2)


def stop_group(process: subprocess.Popen, timeout_s: float = 15) -> None:
    """SIGTERM ``process`` (a server, a scheduler, a worker), then SIGKILL its process group if it
    has not ended."""
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
