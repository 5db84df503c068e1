"""Runners and their kernels forked from one process that has imported what every kernel imports (Linux).

A kernel started the ordinary way spends about 2 s of processor time before
a notebook's first cell runs: a new Python, then IPython and ipykernel, then
torch, numpy and every ``devcourse`` module, which the guard imports
(:mod:`autograder.inside.guard`). Where the sandbox has its namespaces (Linux), the
local pool starts one *zygote* per grading run, and each Dask worker one for
its life (``python -m autograder.run.zygote``, at the first job), that imports
those once and from then on only forks::

    grader ── zygote ── runner ─┬─ launcher ── init ── kernel
                                └─ launcher (kept for a second kernel, see autograder.run.runner.run)

* The zygote holds nothing of any job. It is started with the kernel's
  environment (:func:`autograder.run.kernel.kernel_env`), none of the grader's
  other variables; it imports modules of the Python environment and
  ``devcourse`` only, all of which every kernel sees anyway; and all it is
  told of a runner is whether it is a warm one. The grader hands each
  runner its log and its standard input, on which the job's path and the
  grader's environment come first (then ``go``, for a warm runner).
* A runner first forks the launchers of its kernels, before it reads the
  path of its job, so no kernel holds anything of the job, or of the
  grader's environment, in its memory;
  then it runs the job as ``python -m autograder.run.runner`` would. When its
  kernel manager starts a kernel, a launcher is handed what ``Popen`` would
  have been (command, environment, folder, a session of its own, standard
  input at its end) and builds the sandbox as :mod:`autograder.inside.launcher`
  always does.
* The kernel, forked by the sandbox's init after the limits and the change
  of user, runs ``ipykernel_launcher`` in its own process with what a fresh
  one has: its ``sys.path`` (its working copy first), environment, signal
  handlers, ``sys.argv``, freshly seeded ``random``, numpy and torch (CPU)
  generators and a new ``multiprocessing`` key; the grader's own modules and the import and
  source caches are dropped.

Each process also takes the command line it would have had
(:func:`retitle`), so ``ps`` shows runners, launchers and kernels as before.
What still differs from a kernel started fresh: Python's hash seed (one per
run, so a ``set`` of strings iterates in the same order in every kernel of
it); the order of the warning filters (those ipykernel's shell adds come
after torch's and numpy's, which match other warnings); and the pages the
zygote filled, which every kernel shares copy-on-write: the runner's
count of a submission's memory leaves out the sandbox's own processes
(launcher and init), which hold those pages too
(:func:`autograder.run.watch.tree_usage`).

Every process of the chain dies with its parent (``PR_SET_PDEATHSIG``): the
zygote with the grader, a runner with the zygote, a launcher with its
runner. The grader signals its runners through the zygote, which is the one
that reaps them, so no signal can reach a process that took the number of a
runner already gone.

Without namespaces (macOS, a Linux that forbids them, ``--no-sandbox``) and
with ``--no-zygote``, runners and kernels start fresh.
"""

from __future__ import annotations

import atexit
import collections
import ctypes
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

from autograder import SKIPPED_IMPORTS
from autograder.inside import launcher
from devcourse.warmstart import TITLE_ROOM, ForkedProcess, refresh, retitle

READY_TIMEOUT_S = 120.0  # the zygote's imports; far more than the 2 to 3 s they take
FORK_TIMEOUT_S = 60.0  # a fork takes milliseconds
LAUNCHER = os.path.realpath(launcher.__file__)
_MESSAGE = 1 << 20
_PR_SET_DUMPABLE = 4
_FRESH_PATH: list[str] = []  # sys.path of a Python started with the kernel's environment, but its first entry
_PRELOADED: set[str] = set()  # the modules in the zygote once it has imported what kernels import
_LAUNCHER_ONLY = ("resource",)  # imported on the way to a kernel (the launcher's limits); not by a fresh kernel


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
    that gives it when the zygote starts; ``cwd`` its folder. The last lines the zygote printed are kept
    (``output``) and quoted when it fails.
    """

    def __init__(self, env, cwd: Path):
        self.env, self.cwd = env, cwd
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
                    [sys.executable, "-m", "autograder.run.zygote", str(theirs.fileno()), str(os.getpid()),
                     "-" * TITLE_ROOM],
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


# ---------------------------------------------------------------------------------------------------------------
# The zygote


def preload() -> None:
    """Import what every grading kernel imports before a submission's first cell, and nothing of the grader's."""
    import importlib
    import pkgutil

    # In the order a fresh kernel imports them (ipykernel as it starts, then the guard), so that the warning
    # filters they add come in the same order.
    import ipykernel.ipkernel  # noqa: F401
    import ipykernel.kernelapp  # noqa: F401
    import ipykernel.zmqshell  # noqa: F401
    import IPython  # noqa: F401
    import numpy  # noqa: F401
    import torch
    import torch.nn  # noqa: F401
    import torch.testing  # noqa: F401
    from torch._subclasses import fake_tensor  # noqa: F401

    import devcourse

    for info in pkgutil.iter_modules(devcourse.__path__):
        importlib.import_module(f"devcourse.{info.name}")
    if torch.cuda.is_initialized() or _in_bad_fork_for_cuda():
        raise RuntimeError("CUDA was started while importing; a kernel forked from here could not use it")
    _PRELOADED.update(sys.modules)


def _in_bad_fork_for_cuda() -> bool:
    """Whether a process forked from this one could not use CUDA (torch marks its children so once this one
    has asked the CUDA runtime anything, even the number of devices); always False on a CPU-only build."""
    pid = os.fork()
    if pid == 0:
        import torch

        os._exit(1 if torch.cuda._is_in_bad_fork() else 0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) != 0


def serve(sock_fd: int, grader: int) -> None:
    """The zygote's loop: fork a runner when asked, pass on signals to runners, report each runner's end."""
    _STARTED_WITH.update({signum: handler for signum in _SIGNALS if (handler := signal.getsignal(signum)) is not None})
    # A runner handles these three, so its kernel starts with Python's defaults for them, whatever the grader
    # ignored; and the grader, which may start the zygote before it handles them itself, hands its runners
    # the defaults too. Forked, both start with those.
    _STARTED_WITH.update({signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL,
                          signal.SIGHUP: signal.SIG_DFL})
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the process group: the runners end their jobs
    launcher.die_with_parent(grader, signal.SIGKILL)
    sock = socket.socket(fileno=sock_fd)
    _FRESH_PATH[:] = sys.path[1:]
    try:
        preload()
    except BaseException as error:  # noqa: BLE001 - the grader starts its runners fresh, and says why
        sock.send(json.dumps({"failed": f"{type(error).__name__}: {error}"}).encode())
        return
    if threading.active_count() != 1:
        sock.send(json.dumps({"failed": "a thread was started while importing; forking would copy it"}).encode())
        return
    sock.send(b'{"ready": true}')
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    running: dict[int, int] = {}  # pidfd -> runner pid
    while True:
        for fd, _ in poller.poll():
            if fd in running:
                pid = running.pop(fd)
                poller.unregister(fd)
                os.close(fd)
                _, status = os.waitpid(pid, 0)
                sock.send(json.dumps({"ended": pid, "code": os.waitstatus_to_exitcode(status)}).encode())
                continue
            data, fds, _, _ = socket.recv_fds(sock, _MESSAGE, 2)
            if not data:
                return  # the grader closed: runners still here end with this process
            request = json.loads(data)
            if request["op"] == "signal":
                if request["pid"] in running.values():  # not reaped yet: the number is still that runner's
                    os.kill(request["pid"], request["signal"])
                continue
            try:
                pid = _fork_runner(fds, request["warm"], grader)
                pidfd = os.pidfd_open(pid)
                running[pidfd] = pid
                poller.register(pidfd, select.POLLIN)
                sock.send(json.dumps({"id": request["id"], "pid": pid}).encode())
            except OSError as error:
                sock.send(json.dumps({"id": request["id"], "error": f"{type(error).__name__}: {error}"}).encode())
            finally:
                for passed in fds:
                    os.close(passed)


_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2, signal.SIGCHLD, signal.SIGALRM,
            signal.SIGQUIT, signal.SIGINT, signal.SIGPIPE, signal.SIGXFSZ)
_STARTED_WITH: dict[int, object] = {}  # the zygote's handlers as it started, before it changed any


def _python_signals() -> None:
    """The signal handlers a Python process started by the grader starts with: the zygote's own at its start.

    The zygote is such a process, and records them before it changes any (:func:`serve`; every runner and
    kernel is forked from it after that): Python's defaults, except that a signal the grader ignores (as
    under ``nohup`` or ``&`` in a script) is ignored in a process it starts, forked or fresh; SIGINT,
    SIGTERM and SIGHUP, which the grader and the runners handle, are at their defaults in both.
    """
    for signum, handler in _STARTED_WITH.items():
        signal.signal(signum, handler)


def _close_all_but(keep: set[int]) -> None:
    highest = os.sysconf("SC_OPEN_MAX")
    start = 3
    for fd in sorted(k for k in keep if k >= 3):
        os.closerange(start, fd)
        start = fd + 1
    os.closerange(start, highest)


def _fork_runner(fds: list[int], warm: bool, grader: int) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    zygote = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    try:
        os.dup2(fds[0], 0)
        os.dup2(fds[1], 1)
        os.dup2(fds[1], 2)
        _close_all_but(set())
        _python_signals()
        launcher.die_with_parent(zygote, signal.SIGKILL)
        code = _be_runner(warm, grader)
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException:  # noqa: BLE001 - into the runner's log, as a runner started fresh would print it
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _be_runner(warm: bool, grader: int) -> int:
    """A runner: its kernels' launchers first, then its job (whose path comes on standard input)."""
    retitle([sys.executable, "-m", "autograder.run.runner", "(forked, its job to come)"])
    templates = [_Template.fork(), _Template.fork()]
    line = sys.stdin.readline()
    if not line.strip():  # taken back before it began
        return 0
    given = json.loads(line)
    os.environ.clear()  # the grader's, as a runner started fresh has it
    os.environ.update(given["env"])
    job_file = given["job"]
    retitle([sys.executable, "-m", "autograder.run.runner", job_file, str(grader), *(["--warm"] if warm else [])])
    from autograder.run import runner

    try:
        runner.start(job_file, warm, launchers=templates)
    finally:
        for template in templates:
            template.discard()
    return 0


class ForkedChild:
    """A launcher a runner forked, with what jupyter_client uses of a kernel's ``Popen``."""

    def __init__(self, pid: int, args: list[str]):
        self.pid, self.args = pid, args
        self.stdin = self.stdout = self.stderr = None
        self.returncode: int | None = None
        self.lock = threading.Lock()

    def poll(self) -> int | None:
        with self.lock:
            if self.returncode is None:
                try:
                    pid, status = os.waitpid(self.pid, os.WNOHANG)
                except ChildProcessError:
                    pid, status = self.pid, 0
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
            return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.001
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(pause)
            pause = min(pause * 2, 0.05)
        return self.returncode

    def send_signal(self, signum: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class _Template:
    """A launcher forked ahead of its kernel: it waits for what ``Popen`` would be given."""

    def __init__(self, pid: int, sock: socket.socket):
        self.pid, self.sock = pid, sock

    @staticmethod
    def fork() -> "_Template":
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        parent = os.getpid()
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid:
            theirs.close()
            return _Template(pid, ours)
        code = 1
        try:
            launcher.die_with_parent(parent, signal.SIGKILL)
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for its runner, which decides; the launcher
            # it becomes sets its own handler
            retitle([sys.executable, "-I", LAUNCHER, "(forked, its kernel to come)"])
            _close_all_but({theirs.fileno()})
            read_end, write_end = os.pipe()  # standard input at its end, as Popen's closed pipe leaves it
            os.dup2(read_end, 0)
            os.close(read_end)
            os.close(write_end)
            data = theirs.recv(_MESSAGE)
            if not data:  # not needed
                os._exit(0)
            request = json.loads(data)
            try:
                os.setsid()  # start_new_session, as jupyter_client asks
                if request["cwd"]:
                    os.chdir(request["cwd"])
            except OSError as error:
                theirs.send(f"{type(error).__name__}: {error}".encode())
                os._exit(1)
            os.environ.clear()
            os.environ.update(request["env"])
            theirs.send(b"ok")
            theirs.close()
            code = _launch(request["cmd"])
        except SystemExit as done:
            code = done.code if isinstance(done.code, int) else 1
        except BaseException:  # noqa: BLE001
            import traceback

            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def start(self, cmd: list[str], env: dict[str, str], cwd: str | None) -> ForkedChild:
        try:
            self.sock.send(json.dumps({"cmd": cmd, "env": env, "cwd": cwd}).encode())
            answer = self.sock.recv(_MESSAGE)
        finally:
            self.sock.close()
        if answer != b"ok":
            ForkedChild(self.pid, cmd).wait()
            raise OSError(f"the kernel's launcher could not start: {answer.decode(errors='replace') or 'it ended'}")
        return ForkedChild(self.pid, cmd)

    def discard(self) -> None:
        """Not needed: it ends at the end of its input."""
        if self.sock.fileno() != -1:
            self.sock.close()
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass


def _launch(cmd: list[str]) -> int:
    """What the launcher's command line asks (:func:`autograder.run.sandbox.wrap`), in this process."""
    retitle(cmd)
    if len(cmd) > 6 and cmd[1:3] == ["-I", LAUNCHER] and cmd[5] == "--" and cmd[4].isdigit():
        return launcher.launch(cmd[3], int(cmd[4]), cmd[6:], start=run_kernel_here)
    os.execvpe(cmd[0], cmd, os.environ)


def run_kernel_here(command: list[str]) -> None:
    """The kernel: ``python -m ipykernel_launcher ...`` run in this forked process, as a fresh one would run it.

    Returns (and the caller execs ``command``) for any other command.
    """
    if command[:3] != [sys.executable, "-m", "ipykernel_launcher"]:
        return
    import runpy

    _python_signals()
    # A change of user leaves a process undumpable (its /proc files the superuser's) until it execs a program;
    # a fresh kernel has exec'd Python, so it is dumpable again.
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)
    for name in [name for name in sys.modules if name == "autograder" or name.startswith("autograder.")
                 or (name in _LAUNCHER_ONLY and name not in _PRELOADED)
                 or (name in SKIPPED_IMPORTS and sys.modules[name] is None)]:
        del sys.modules[name]
    refresh(command, os.getcwd(), _FRESH_PATH)
    code = 0
    try:
        runpy.run_module("ipykernel_launcher", run_name="__main__", alter_sys=True)
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException:  # noqa: BLE001 - as Python itself would print it
        import traceback

        traceback.print_exc()
        code = 1
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    if len(sys.argv) != 4 or not (sys.argv[1].isdigit() and sys.argv[2].isdigit()):
        sys.exit("usage: python -m autograder.run.zygote SOCKET_FD GRADER_PID ROOM (started by the grader)")
    retitle([sys.executable, "-m", "autograder.run.zygote", sys.argv[1], sys.argv[2]])
    serve(int(sys.argv[1]), int(sys.argv[2]))
    # Without the interpreter's teardown of torch, numpy and IPython (about 0.5 s, which the grader waits
    # for when it closes the zygote): nothing of the zygote's needs it, as for the runners it forks.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
