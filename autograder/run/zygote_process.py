"""The zygote's own process and what it forks: runners whose kernels' launchers are forked ahead, and kernels.

Started by :class:`autograder.run.zygote.Zygote` as ``python -m autograder.run.zygote_process``; see that class
for what the zygote holds, what each forked process gets and how they end.
"""

from __future__ import annotations

import atexit
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

from autograder.inside import launcher
from autograder.run.startup import SKIPPED_IMPORTS, skip_unused_imports
from autograder.run.zygote import _MESSAGE, LAUNCHER
from devcourse.warmstart import refresh, retitle

_PR_SET_DUMPABLE = 4
_FRESH_PATH: list[str] = []  # sys.path of a Python started with the kernel's environment, but its first entry
_PRELOADED: set[str] = set()  # the modules in the zygote once it has imported what kernels import
_LAUNCHER_ONLY = ("resource",)  # imported on the way to a kernel (the launcher's limits); not by a fresh kernel


def preload(packages: list[str]) -> None:
    """Import what every grading kernel imports before a submission's first cell (ipykernel, IPython and the
    course's kernel ``packages``, as the guard imports them), and nothing of the grader's."""
    import importlib
    import pkgutil

    # In the order a fresh kernel imports them (ipykernel as it starts, then the guard), so that the warning
    # filters they add come in the same order.
    import ipykernel.ipkernel  # noqa: F401
    import ipykernel.kernelapp  # noqa: F401
    import ipykernel.zmqshell  # noqa: F401
    import IPython  # noqa: F401

    for package in packages:
        module = importlib.import_module(package.removesuffix(".*"))
        if package.endswith(".*"):
            for info in pkgutil.iter_modules(module.__path__):
                importlib.import_module(f"{module.__name__}.{info.name}")
    torch = sys.modules.get("torch")
    if torch is not None and (torch.cuda.is_initialized() or _in_bad_fork_for_cuda()):
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


def serve(sock_fd: int, grader: int, packages: list[str]) -> None:
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
        preload(packages)
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
    if len(sys.argv) != 5 or not (sys.argv[1].isdigit() and sys.argv[2].isdigit()):
        sys.exit("usage: python -m autograder.run.zygote_process SOCKET_FD GRADER_PID PACKAGES_JSON ROOM "
                 "(started by the grader)")
    skip_unused_imports()
    retitle([sys.executable, "-m", "autograder.run.zygote_process", sys.argv[1], sys.argv[2]])
    serve(int(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3]))
    # Without the interpreter's teardown of torch, numpy and IPython (which the grader would wait
    # for when it closes the zygote): nothing of the zygote's needs it, as for the runners it forks.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
