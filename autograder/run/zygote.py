"""Runners and their kernels forked from one process that has imported what every kernel imports (Linux).

The local pool (one zygote per grading run) and each Dask worker (one for its life) start
``python -m autograder.run.zygote_process`` through :class:`Zygote`; it imports the kernels' packages once and
from then on only forks (grader ── zygote ── runner ── launcher ── init ── kernel). Without namespaces and with
``--no-zygote``, runners and kernels start fresh.
"""

from __future__ import annotations

import collections
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from autograder.inside import launcher
from devcourse.warmstart import TITLE_ROOM, ForkedProcess

READY_TIMEOUT_S = 120.0  # the zygote's imports, with room to spare on a busy machine
FORK_TIMEOUT_S = 60.0  # a fork takes milliseconds
LAUNCHER = os.path.realpath(launcher.__file__)
_MESSAGE = 1 << 20


class ZygoteUnavailable(RuntimeError):
    """The zygote cannot fork runners (it could not start, or it ended): runners start fresh instead."""


def usable() -> str:
    """Why a zygote cannot be used on this machine; "" where it can."""
    if sys.platform != "linux":
        return f"it needs Linux, this is {sys.platform}"
    if not hasattr(os, "pidfd_open") or not hasattr(socket, "send_fds"):
        return "this Python has no pidfd_open or send_fds"
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError as error:
        return f"this Linux has no pidfd_open ({error})"
    return ""


# ---------------------------------------------------------------------------------------------------------------
# The grader's side


class ForkedRunner(ForkedProcess):
    """A runner the zygote forked, with what the grader uses of a runner's ``Popen``: ``stdin``, ``wait``,
    ``poll``, ``terminate``, ``kill`` (the first three as :class:`devcourse.warmstart.ForkedProcess` has them)."""

    kind = "runner"

    def __init__(self, zygote: "Zygote", pid: int, stdin):
        super().__init__(pid)
        self.zygote, self.stdin = zygote, stdin
        self.lost = False  # it died with its zygote: its job was not done

    def send_signal(self, signum: int) -> None:
        if not self._ended.is_set():
            self.zygote.signal(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote:
    """The grader's handle on its zygote: started by :meth:`start` or at the first :meth:`spawn`, ended by
    :meth:`close`.

    ``env`` is the kernel's environment (the zygote's and every runner's until it has its job), or a function
    that gives it when the zygote starts; ``cwd`` its folder; ``packages`` what the course's kernels import
    (:class:`autograder.course.profile.KernelSetup`), which the zygote imports ahead. The last lines the zygote
    printed are kept (``output``) and quoted when it fails.

    The zygote holds nothing of any job: it starts with the kernel's environment only
    (:func:`autograder.run.kernel.kernel_env`), imports only the Python environment's modules and the course's
    packages, and is told of a runner only whether it is warm. A runner forks its kernels' launchers before it
    reads its job's path (so no kernel holds anything of the job or the grader's environment), then runs the job
    as ``python -m autograder.run.runner`` would; a launcher builds the sandbox as
    :mod:`autograder.inside.launcher` always does. A kernel gets what a fresh one has (``sys.path``,
    environment, signal handlers, ``sys.argv``, freshly seeded generators, a new ``multiprocessing`` key, the
    command line :func:`devcourse.warmstart.retitle` gives), less the grader's modules and caches. Still
    shared with the zygote: Python's hash seed, the order of warning filters, and its pages copy-on-write
    (left out of a submission's memory count through the sandbox's own processes,
    :func:`autograder.run.watch.tree_usage`). Each process dies with its parent (``PR_SET_PDEATHSIG``), and
    runners are signalled through the zygote, which reaps them, so no signal reaches a reused process id.
    """

    def __init__(self, env, cwd: Path, packages: tuple[str, ...] = ()):
        self.env, self.cwd, self.packages = env, cwd, tuple(packages)
        self.output: collections.deque[str] = collections.deque(maxlen=20)
        self.lock = threading.Lock()
        self.started = self.closed = False
        self.ready = threading.Event()
        self.problem = ""
        self.sock: socket.socket | None = None
        self.process: subprocess.Popen | None = None
        self.waiting: dict[int, list] = {}  # request -> [Event, ForkedRunner or error text]
        self.runners: dict[int, ForkedRunner] = {}
        self.requests = 0
        self.stdins: dict[int, object] = {}  # request -> the write end of its runner's standard input

    def start(self) -> None:
        """Start the zygote now, if it has not started, without waiting for its imports: a grader that
        starts it before its own set-up has it ready by the time the first job needs a runner."""
        with self.lock:
            if not self.started and not self.closed:
                self.started = True
                self._start()

    def _start(self) -> None:
        if callable(self.env):
            self.env = self.env()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = ours

        def keeper() -> None:  # the zygote's parent thread for as long as it lives (PR_SET_PDEATHSIG)
            try:
                self.process = subprocess.Popen(
                    [sys.executable, "-m", "autograder.run.zygote_process", str(theirs.fileno()), str(os.getpid()),
                     json.dumps(self.packages), "-" * TITLE_ROOM],
                    pass_fds=(theirs.fileno(),), env=self.env, cwd=self.cwd, stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
            except OSError as error:
                self._gone(f"it could not start: {error}")
                return
            finally:
                theirs.close()
            if self.closed:  # closed while it started: nothing of it is wanted
                self.process.kill()
            threading.Thread(target=self._keep_output, name="zygote-output", daemon=True).start()
            self._read()
            self.process.wait()

        threading.Thread(target=keeper, name="zygote", daemon=True).start()

    def _keep_output(self) -> None:
        for line in self.process.stdout:
            if line.strip():
                self.output.append(line.rstrip())

    def _said(self) -> str:
        time.sleep(0.2)  # what it printed last, as it ended, reaches the pipe first
        return " | ".join(list(self.output)[-3:]) or "nothing"

    def _read(self) -> None:
        while True:
            try:
                data = self.sock.recv(_MESSAGE)
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
                    runner = self.runners.pop(message["ended"], None)
                if runner is not None:
                    runner._end(message["code"])
            else:
                with self.lock:
                    waiter = self.waiting.get(message["id"])
                    if waiter is not None and "pid" in message:
                        runner = ForkedRunner(self, message["pid"], self.stdins.pop(message["id"]))
                        self.runners[runner.pid] = runner
                        waiter[1] = runner
                    elif waiter is not None:
                        waiter[1] = message.get("error", "no answer")
                if waiter is not None:
                    waiter[0].set()

    def _gone(self, why: str) -> None:
        with self.lock:
            if not self.closed:
                self.problem = self.problem or why
            runners, self.runners = list(self.runners.values()), {}
            waiters = list(self.waiting.values())
        for runner in runners:  # each died with the zygote (PR_SET_PDEATHSIG), its job not done
            runner.lost = not self.closed
            runner._end(-signal.SIGKILL)
        for waiter in waiters:
            waiter[0].set()
        self.ready.set()

    def spawn(self, job_file: Path, log_fd: int, warm: bool, env: dict[str, str]) -> ForkedRunner:
        """A runner for ``job_file``, its output to ``log_fd``, its environment ``env`` (given to it once it has
        forked its kernels' launchers); a warm one waits for ``go`` on its ``stdin``.

        Raises :class:`ZygoteUnavailable` when the zygote cannot fork it.
        """
        self.start()
        if not self.ready.wait(READY_TIMEOUT_S) and not self.problem:
            self.problem = f"its imports took more than {READY_TIMEOUT_S:g} s"
        if self.problem or self.closed:
            raise ZygoteUnavailable(self.problem or "it was closed")
        read_end, write_end = os.pipe()
        stdin = os.fdopen(write_end, "w")
        try:
            with self.lock:
                self.requests += 1
                request = self.requests
                waiter = self.waiting[request] = [threading.Event(), None]
                self.stdins[request] = stdin
                socket.send_fds(self.sock, [json.dumps({"op": "fork", "id": request, "warm": warm}).encode()],
                                [read_end, log_fd])
        except OSError as error:
            stdin.close()
            raise ZygoteUnavailable(f"it could not be asked ({error})") from None
        finally:
            os.close(read_end)
        if not waiter[0].wait(FORK_TIMEOUT_S):  # stuck: no later job waits for it
            self.problem = self.problem or f"it did not answer within {FORK_TIMEOUT_S:g} s"
        with self.lock:
            self.waiting.pop(request, None)
            self.stdins.pop(request, None)
        if not isinstance(waiter[1], ForkedRunner):
            stdin.close()
            raise ZygoteUnavailable(self.problem or f"it could not fork a runner: {waiter[1]}")
        runner = waiter[1]
        try:  # the job comes first on the runner's input: it reads it once its kernels' launchers exist
            stdin.write(json.dumps({"job": str(job_file), "env": env}) + "\n")
            stdin.flush()
            if not warm:
                stdin.close()
                runner.stdin = None
        except OSError:
            pass  # it ended already; its end is reported as any other
        return runner

    def signal(self, pid: int, signum: int) -> None:
        with self.lock:
            if self.sock is None or self.problem:
                return
            try:
                self.sock.send(json.dumps({"op": "signal", "pid": pid, "signal": int(signum)}).encode())
            except OSError:
                pass

    def close(self) -> None:
        """End the zygote (its runners, if any are left, end with it)."""
        with self.lock:
            sock, process = self.sock, self.process
            self.closed = True
        if process is not None and not self.ready.is_set():  # still importing: no runner of it exists
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
