"""What the zygote's processes run: runners whose kernels' launchers are forked ahead, and kernels.

:class:`autograder.run.zygote.Zygote` asks its fork server (:mod:`.forkserver`) to fork a child that
runs :func:`runner`; see that class for what the zygote holds, what each forked process gets and how
they end.
"""

from __future__ import annotations

import ctypes
import io
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from autograder.inside import launcher
from autograder.run.startup import SKIPPED_IMPORTS
from autograder.run import forkserver
from autograder.run.forkserver import refresh, retitle

LAUNCHER = os.path.realpath(launcher.__file__)
_PR_SET_DUMPABLE = 4
_MESSAGE = 1 << 20
# imported on the way to a kernel (the launcher's limits); not by a fresh kernel
_LAUNCHER_ONLY = ("resource",)
RUNNER_ONLY: set[str] = set()  # the modules preload_runner imported, which no kernel imports


def preload_runner() -> None:
    """The zygote's last import: the runner's modules, with nbformat's schema validator compiled,
    which each runner would otherwise import and compile after its fork. Being last, what it
    imports is the runners' alone (:data:`RUNNER_ONLY`): a kernel or a process server forked from
    the zygote leaves it out of ``sys.modules``, as it leaves the grader's own."""
    before = set(sys.modules)
    import nbformat

    from autograder.run import runner  # noqa: F401

    nbformat.validator.get_validator(4, nbformat.v4.nbformat_minor)
    RUNNER_ONLY.update(set(sys.modules) - before)


def python_signals() -> None:
    """The signal handlers a Python process started by the grader starts with: the zygote's own at
    its start.

    The zygote is such a process, and records them before it changes any
    (:data:`.forkserver.STARTED_WITH`; every runner and kernel is forked from it after that):
    Python's defaults, except that a signal the grader ignores (as under ``nohup`` or ``&`` in a
    script) is ignored in a process it starts, forked or fresh. SIGINT, SIGTERM and SIGHUP, which
    the grader and the runners handle, are at their defaults in both: the grader may start the
    zygote before it handles them itself.
    """
    handlers = {
        **forkserver.STARTED_WITH,
        signal.SIGINT: signal.default_int_handler,
        signal.SIGTERM: signal.SIG_DFL,
        signal.SIGHUP: signal.SIG_DFL,
    }
    for signum, handler in handlers.items():
        signal.signal(signum, handler)


def runner(args: dict) -> int:
    """A runner, forked by the zygote (its standard input and output as the grader passed them):
    tied to the zygote, its kernels' launchers forked first, then its job, whose path comes on
    standard input."""
    python_signals()
    launcher.die_with_parent(forkserver.server_pid(), signal.SIGKILL)
    return _be_runner(args["warm"], args["grader"])


def checked(args: dict) -> int:
    """In a child of the zygote: what the course's profile ``args["profile"]`` names of this machine
    (:meth:`autograder.run.zygote.Zygote.checked`), as JSON on standard output."""
    from autograder.course.profile import checked_on
    from autograder.settings import Settings

    devices, not_checked = checked_on(Settings(profile=args["profile"]))
    sys.stdout.write(json.dumps({"devices": devices, "not_checked": list(not_checked)}))
    sys.stdout.flush()
    return 0


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
    retitle(
        [
            sys.executable,
            "-m",
            "autograder.run.runner",
            job_file,
            str(grader),
            *(["--warm"] if warm else []),
        ]
    )
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
            code = _be_launcher(theirs, parent)
        except SystemExit as done:
            # its kernel, forked below: it ends at the top of its stack, as Python ends
            if forkserver.ending():
                raise
            code = forkserver.exit_code(done)
        except BaseException:  # noqa: BLE001
            import traceback

            traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)

    def start(
        self, cmd: list[str], env: dict[str, str], cwd: str | None, output: int | None = None
    ) -> ForkedChild:
        """Have the launcher run ``cmd``, its standard output and error to ``output`` (a file
        descriptor) if given."""
        try:
            request = json.dumps({"cmd": cmd, "env": env, "cwd": cwd}).encode()
            socket.send_fds(self.sock, [request], [output] if output is not None else [])
            answer = self.sock.recv(_MESSAGE)
        finally:
            self.sock.close()
        if answer != b"ok":
            ForkedChild(self.pid, cmd).wait()
            raise OSError(
                "the kernel's launcher could not start:"
                f" {answer.decode(errors='replace') or 'it ended'}"
            )
        return ForkedChild(self.pid, cmd)

    def discard(self) -> None:
        """Not needed: it ends at the end of its input."""
        if self.sock.fileno() != -1:
            self.sock.close()
            try:
                os.waitpid(self.pid, 0)
            except ChildProcessError:
                pass


def _be_launcher(sock: socket.socket, parent: int) -> int:
    """A launcher forked ahead: it waits on ``sock`` for what ``Popen`` would be given, then is what
    it asks."""
    launcher.die_with_parent(parent, signal.SIGKILL)
    # Ctrl-C is for its runner, which decides; the launcher
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # it becomes sets its own handler
    retitle([sys.executable, "-I", LAUNCHER, "(forked, its kernel to come)"])
    forkserver.close_all_but({sock.fileno()})
    read_end, write_end = os.pipe()  # standard input at its end, as Popen's closed pipe leaves it
    os.dup2(read_end, 0)
    os.close(read_end)
    os.close(write_end)
    data, fds, _, _ = socket.recv_fds(sock, _MESSAGE, 1)
    if not data:  # not needed
        os._exit(0)
    for fd in fds:  # the kernel's output, as Popen's stdout and stderr would give it
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
    request = json.loads(data)
    try:
        os.setsid()  # start_new_session, as jupyter_client asks
        if request["cwd"]:
            os.chdir(request["cwd"])
    except OSError as error:
        sock.send(f"{type(error).__name__}: {error}".encode())
        os._exit(1)
    os.environ.clear()
    os.environ.update(request["env"])
    sock.send(b"ok")
    sock.close()
    return _launch(request["cmd"])


def _launch(cmd: list[str]) -> int:
    """What the launcher's command line asks (:func:`autograder.run.sandbox.wrap`), in this
    process."""
    retitle(cmd)
    if len(cmd) > 6 and cmd[1:3] == ["-I", LAUNCHER] and cmd[5] == "--" and cmd[4].isdigit():
        return launcher.launch(
            cmd[3], int(cmd[4]), cmd[6:], start=run_kernel_here, spare=run_server_here
        )
    os.execvpe(cmd[0], cmd, os.environ)


def run_kernel_here(command: list[str]) -> None:
    """The kernel: ``python -m ipykernel_launcher ...`` run in this forked process, as a fresh one
    would run it, and ended as Python ends it (:func:`autograder.run.forkserver.end`: its atexit
    handlers run, once).

    Returns (and the caller execs ``command``) for any other command.
    """
    if command[:3] != [sys.executable, "-m", "ipykernel_launcher"]:
        return
    import runpy

    python_signals()
    # A change of user leaves a process undumpable (its /proc files the superuser's) until it execs
    # a program; a fresh kernel has exec'd Python, so it is dumpable again.
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)
    _forget_the_grader()
    refresh(command, os.getcwd(), forkserver.FRESH_PATH)
    for key, value in forkserver.PRELOAD_ENV.items():  # a fresh kernel's imports set them
        os.environ.setdefault(key, value)
    code = 0
    try:
        runpy.run_module("ipykernel_launcher", run_name="__main__", alter_sys=True)
    except SystemExit as done:
        code = forkserver.exit_code(done)
    except BaseException:  # noqa: BLE001 - as Python itself would print it
        import traceback

        traceback.print_exc()
        code = 1
    forkserver.end(code)


def _forget_the_grader(keep: tuple[str, ...] = ()) -> None:
    """Drop from ``sys.modules`` the grader's modules (but ``keep``), the runners'
    (:data:`RUNNER_ONLY`) and what only a launcher imported: a process started fresh has none of
    them."""
    for name in [
        name
        for name in sys.modules
        if (name.partition(".")[0] == "autograder" and name not in keep)
        or name in RUNNER_ONLY
        or (name in _LAUNCHER_ONLY and name not in forkserver.PRELOADED)
        or (name in SKIPPED_IMPORTS and sys.modules[name] is None)
    ]:
        _UNLISTED.append(sys.modules.pop(name))


# Modules left out of sys.modules, kept alive: freeing them would write to their objects, and so
# copy the pages this process shares with the zygote.
_UNLISTED: list = []


# Variables read as a process starts, by Python, the C runtime and libtorch's logging (others, such
# as TORCHINDUCTOR_CACHE_DIR, which torch.compile sets in the kernel, are read at use): a server
# forked warm serves only a caller whose environment has them as the zygote had them.
AT_START = ("PYTHON", "LD_", "MALLOC_", "OMP_", "MKL_", "KMP_", "GOMP_", "TORCH_CPP_")


def run_server_here(conn: socket.socket) -> None:
    """A fork server for a caller in the sandbox (:class:`autograder.run.forkclient.ForkServer`
    with ``from_sandbox``), forked by the sandbox's init and made as its kernel was
    (:mod:`autograder.inside.launcher`): it holds what the kernel was forked with, so it is ready in
    milliseconds where a server started fresh imports for seconds.

    The caller sends what it would start a server with (name, imports, environment, folder,
    session) and the file its output goes to; then it is that server, as
    :func:`autograder.run.forkserver.main` is, with the modules a fresh one holds and the zygote's
    (the grader's own left out). It says it cannot serve where a variable :data:`AT_START` names
    differs from the kernel's environment as the zygote imported with it (``PYTHONUNBUFFERED`` is
    applied): the caller then starts one fresh. It never returns.
    """
    python_signals()
    ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_DUMPABLE, 1, 0, 0, 0)  # as after an exec
    data, fds, _, _ = socket.recv_fds(conn, _MESSAGE, 1)
    if not data:
        os._exit(0)
    for fd in fds:
        os.dup2(fd, 1)
        os.dup2(fd, 2)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    forkserver.close_all_but({conn.fileno()})
    _forget_the_grader(keep=("autograder", "autograder.run", "autograder.run.forkserver"))
    spec = json.loads(data)
    env = spec["env"]
    differ = sorted(
        name
        for name in {*os.environ, *env}
        if name.startswith(AT_START)
        and name != "PYTHONUNBUFFERED"
        and os.environ.get(name) != env.get(name)
    )
    problem = f"its environment differs in {', '.join(differ)}" if differ else ""
    os.environ.clear()
    os.environ.update(env)
    try:
        if spec.get("cwd"):
            os.chdir(spec["cwd"])
        if spec.get("new_session"):
            os.setsid()
    except OSError as error:
        problem = problem or f"{type(error).__name__}: {error}"
    _python_stdio(unbuffered=bool(env.get("PYTHONUNBUFFERED")))
    forkserver.serve(conn, spec["name"], spec["preload"], problem)


def _python_stdio(unbuffered: bool) -> None:
    """``sys.stdout`` and ``sys.stderr`` on descriptors 1 and 2 as Python makes them as it starts,
    with ``-u`` (``PYTHONUNBUFFERED``) or without."""
    for fd, name in ((1, "stdout"), (2, "stderr")):
        old = getattr(sys, name)
        old.flush()
        raw = io.FileIO(fd, "w", closefd=False)
        raw.name = f"<{name}>"
        stream = io.TextIOWrapper(
            raw if unbuffered else io.BufferedWriter(raw),
            encoding=old.encoding,
            errors=old.errors,
            line_buffering=not unbuffered and (fd == 2 or raw.isatty()),
            write_through=unbuffered,
        )
        setattr(sys, name, stream)
        setattr(sys, f"__{name}__", stream)
