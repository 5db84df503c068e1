"""The caller's side of :mod:`autograder.run.forkserver`: :class:`ForkServer` starts one and asks it
to fork.

The grader's zygote (:class:`autograder.run.zygote.Zygote`) and the course's warm starts
(``devcourse.warmstart.WarmStarter``) are its callers; each names the function its children run.
Requests and replies are JSON on a socket pair, with the children's standard streams passed as file
descriptors.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.reduction import sendfds
from pathlib import Path
from typing import Callable, Sequence

from autograder.inside.launcher import SPARE_SOCKET
from autograder.run.forkserver import MESSAGE_BYTES, TITLE_ROOM

__all__ = [
    "FORK_TIMEOUT_S",
    "READY_TIMEOUT_S",
    "ForkServer",
    "ForkServerUnavailable",
    "ForkedProcess",
]

READY_TIMEOUT_S = 120.0  # the server's imports, with room to spare on a busy machine
FORK_TIMEOUT_S = 60.0  # a fork takes milliseconds


class ForkServerUnavailable(RuntimeError):
    """The server cannot fork (it could not start or import its preload list, or it ended)."""


class ForkedProcess:
    """A process the server forked, with what callers use of ``Popen``: ``pid``, ``returncode``,
    ``poll`` and ``wait``. Its end is reported by the server, which reaps it."""

    kind = "process"  # how a timeout names it

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None
        self._ended = threading.Event()

    def _end(self, code: int) -> None:
        self.returncode = code
        self._ended.set()

    def _lost(self, closed: bool) -> None:
        """Its server died: nobody reaps it now. It leads a session of its own (as
        ``devcourse.warmstart``'s does), which is killed."""
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self._end(-signal.SIGKILL)

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"{self.kind} {self.pid}", timeout)
        return self.returncode


class ForkServer:
    """The caller's handle on one server: started by :meth:`start` (or at the first :meth:`fork`),
    ended by :meth:`close`.

    ``env`` is the server's environment (every child's until it sets its own), or a function that
    gives it as the server starts; ``cwd`` its folder; ``preload`` what it imports
    (:func:`autograder.run.forkserver.preload`); ``name`` what ``ps`` shows after ``-m
    autograder.run.forkserver``. With ``die_with_parent`` the server dies with this process; with
    ``new_session`` it leads a session of its own, so Linux shares the processor with it as with
    another user's work (autogroups), not out of its caller's share. The last lines it printed are
    kept (``output``) and quoted when it fails. With ``from_sandbox``, in a grading kernel forked
    warm, the sandbox's init forks the server ready-imported
    (:func:`autograder.run.forked.run_server_here`); elsewhere, or where that one cannot serve, it
    starts fresh.
    """

    unavailable = ForkServerUnavailable

    def __init__(
        self,
        env,
        cwd: str | Path | None = None,
        preload: Sequence[str] = (),
        name: str = "",
        die_with_parent: bool = False,
        new_session: bool = False,
        from_sandbox: bool = False,
    ):
        self.env, self.cwd, self.preload, self.name = env, cwd, list(preload), name
        self.die_with_parent, self.new_session = die_with_parent, new_session
        self.from_sandbox = from_sandbox and not die_with_parent
        self.output: collections.deque[str] = collections.deque(maxlen=20)
        self.lock = threading.Lock()
        self.started = self.closed = False
        self.ready = threading.Event()
        self.problem = ""
        self.sock: socket.socket | None = None
        self.process: subprocess.Popen | None = None
        # request -> [Event, make, the process or an error's text]
        self.waiting: dict[int, list] = {}
        self.processes: dict[int, ForkedProcess] = {}
        self.requests = 0

    @property
    def alive(self) -> bool:
        """Whether the server can still fork (or, not yet ready, may)."""
        return not (self.closed or self.problem)

    def start(self) -> None:
        """Start the server now, if it has not started, without waiting for its imports."""
        with self.lock:
            if not self.started and not self.closed:
                self.started = True
                self._start()

    def _start(self) -> None:
        if callable(self.env):
            self.env = self.env()
        spec = {
            "name": self.name,
            "preload": self.preload,
            "die_with": os.getpid() if self.die_with_parent else 0,
        }

        # the server's parent thread for as long as it lives (PR_SET_PDEATHSIG)
        def keeper() -> None:
            if self.from_sandbox and self._from_sandbox(spec):
                if self.closed:  # closed while it started: nothing of it is wanted
                    self.process.kill()
                self._read()
                self.process.wait()
                return
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            self.sock = ours
            try:
                self.process = subprocess.Popen(
                    [
                        sys.executable,
                        "-m",
                        "autograder.run.forkserver",
                        str(theirs.fileno()),
                        json.dumps(spec),
                        "-" * TITLE_ROOM,
                    ],
                    pass_fds=(theirs.fileno(),),
                    env=self.env,
                    cwd=self.cwd,
                    start_new_session=self.new_session,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                    errors="replace",
                )
            except OSError as error:
                self._gone(f"it could not start: {error}")
                return
            finally:
                theirs.close()
            if self.closed:  # closed while it started: nothing of it is wanted
                self.process.kill()
            self._keep_output(self.process.stdout)
            self._read()
            self.process.wait()

        threading.Thread(target=keeper, name=self.name or "forkserver", daemon=True).start()

    def _from_sandbox(self, spec: dict) -> bool:
        """Ask the sandbox's init for the server; whether it is ready (otherwise nothing of it is
        left)."""
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        read_end, write_end = os.pipe()
        try:
            sock.connect(SPARE_SOCKET)
            cwd = os.fspath(self.cwd) if self.cwd is not None else os.getcwd()
            given = {**spec, "env": self.env, "cwd": cwd, "new_session": self.new_session}
            socket.send_fds(sock, [json.dumps(given).encode()], [write_end])
            sock.settimeout(READY_TIMEOUT_S)
            said = json.loads(sock.recv(MESSAGE_BYTES) or b"{}")
            sock.settimeout(None)
        except (OSError, ValueError):
            said = {}
        os.close(write_end)
        stdout = os.fdopen(read_end, errors="replace")
        if not said.get("ready"):
            self.output.append(f"the sandbox's server: {said.get('failed') or 'none'}")
            sock.close()
            stdout.close()
            return False
        with self.lock:
            self.sock, self.process = sock, _Spare(said["pid"])
        self._keep_output(stdout)
        self.ready.set()
        return True

    def _keep_output(self, stdout) -> None:
        def keep() -> None:
            for line in stdout:
                if line.strip():
                    self.output.append(line.rstrip())

        threading.Thread(target=keep, name=f"{self.name}-output", daemon=True).start()

    def _said(self) -> str:
        time.sleep(0.2)  # what it printed last, as it ended, reaches the pipe first
        return " | ".join(list(self.output)[-3:]) or "nothing"

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(MESSAGE_BYTES)
            except OSError:
                data = b""
            if not data:
                self._gone(f"it ended (its last output: {self._said()})")
                return
            message = json.loads(data)
            if "ready" in message:
                self.ready.set()
            elif "failed" in message:
                self._gone(f"its imports failed: {message['failed']}")
                return
            elif "ended" in message:
                with self.lock:
                    process = self.processes.pop(message["ended"], None)
                if process is not None:
                    process._end(message["code"])
            else:
                with self.lock:  # made here, before any "ended" of it can be read
                    waiter = self.waiting.get(message["id"])
                    if waiter is not None and "pid" in message:
                        waiter[2] = self.processes[message["pid"]] = waiter[1](message["pid"])
                    elif waiter is not None:
                        waiter[2] = message.get("error", "no answer")
                if waiter is not None:
                    waiter[0].set()

    def _gone(self, why: str) -> None:
        with self.lock:
            if not self.closed:
                self.problem = self.problem or why
            processes, self.processes = list(self.processes.values()), {}
            waiters = list(self.waiting.values())
        for process in processes:
            process._lost(self.closed)
        for waiter in waiters:
            waiter[0].set()
        self.ready.set()

    def fork(
        self,
        entry: str,
        args: dict,
        fds: Sequence[int] = (),
        make: Callable[[int], ForkedProcess] = ForkedProcess,
    ) -> ForkedProcess:
        """A child that runs ``entry`` (``module:function``, called with ``args``) with ``fds`` as
        its standard input, output and error; ``make(pid)`` is what is returned. Raises
        :attr:`unavailable` when the server cannot fork."""
        self.start()
        if not self.ready.wait(READY_TIMEOUT_S) and not self.problem:
            self.problem = f"its imports took more than {READY_TIMEOUT_S:g} s"
        with self.lock:
            if self.problem or self.closed:
                raise self.unavailable(self.problem or "it was closed")
            self.requests += 1
            request = self.requests
            waiter = self.waiting[request] = [threading.Event(), make, None]
            try:
                self.sock.send(
                    json.dumps(
                        {"op": "fork", "id": request, "entry": entry, "args": args, "fds": len(fds)}
                    ).encode()
                )
                if fds:
                    sendfds(self.sock, list(fds))
            except OSError as error:
                self.waiting.pop(request)
                raise self.unavailable(f"it could not be asked ({error})") from None
        if not waiter[0].wait(FORK_TIMEOUT_S):  # stuck: nothing later waits for it
            self.problem = self.problem or f"it did not answer within {FORK_TIMEOUT_S:g} s"
        with self.lock:
            self.waiting.pop(request, None)
        if not isinstance(waiter[2], ForkedProcess):
            raise self.unavailable(self.problem or f"it could not fork: {waiter[2]}")
        return waiter[2]

    def signal(self, pid: int, signum: int) -> None:
        """Send ``signum`` to ``pid``, a child the server has not reaped yet (so no other process
        has its number)."""
        with self.lock:
            if self.sock is None or self.problem:
                return
            try:
                self.sock.send(
                    json.dumps({"op": "signal", "pid": pid, "signal": int(signum)}).encode()
                )
            except OSError:
                pass

    def close(self) -> None:
        """End the server; what becomes of its children is theirs to say (a child tied to it ends
        with it)."""
        with self.lock:
            sock, process = self.sock, self.process
            self.closed = True
        # still importing: no child of it exists
        if process is not None and not self.ready.is_set():
            process.kill()
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if process is not None:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if sock is not None:
            sock.close()


class _Spare:
    """What :meth:`ForkServer.close` uses of a server's ``Popen`` (``wait``, ``kill``), for one the
    sandbox's init forked (not this process's child: its end is seen through a pidfd, open while
    this object lives, as two threads may wait on it)."""

    def __init__(self, pid: int):
        self.pid, self.pidfd = pid, os.pidfd_open(pid)

    def wait(self, timeout: float | None = None) -> None:
        if not select.select([self.pidfd], [], [], timeout)[0]:
            raise subprocess.TimeoutExpired("the sandbox's process server", timeout)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            signal.pidfd_send_signal(self.pidfd, signal.SIGKILL)

    def __del__(self) -> None:
        os.close(self.pidfd)
