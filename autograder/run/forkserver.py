"""One fork server for the grader's runners and kernels and a course's launchers: it imports once,
then forks (Linux).

``python -m autograder.run.forkserver``, started by :class:`autograder.run.forkclient.ForkServer`,
imports its preload list and forks a child per request; the child runs the ``module:function`` the
request names (:mod:`autograder.run.forked`, a course's launcher such as ``devcourse.warmstart``)
and ends as Python ends a program (:func:`end`). It imports nothing but the standard library, so a
course that builds on the grader uses it.
"""

from __future__ import annotations

import atexit
import ctypes
import gc
import json
import os
import select
import signal
import socket
import sys
import threading

# multiprocessing.forkserver itself cannot serve: its children are Processes (no atexit, no fresh
# __main__), one server per interpreter, a failed preload ignored; its file-descriptor transport
# serves.
from multiprocessing.reduction import recvfds
from pathlib import Path
from typing import NoReturn, Sequence

__all__ = ["end", "ending", "exit_code", "refresh", "retitle", "serve", "server_pid", "usable"]

TITLE_ROOM = 8192  # bytes of command line every forked process can write its own into (see retitle)
MESSAGE_BYTES = 1 << 20  # the most one message between a server and its caller holds
_PR_SET_PDEATHSIG = 1
_SIGNALS = (
    signal.SIGTERM,
    signal.SIGHUP,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGCHLD,
    signal.SIGALRM,
    signal.SIGQUIT,
    signal.SIGINT,
    signal.SIGPIPE,
    signal.SIGXFSZ,
)

# What a server knows, for the processes it forks: containers changed in place, never rebound.
# its signal handlers as it started: those its caller gives a process it starts
STARTED_WITH: dict[int, object] = {}
FRESH_PATH: list[str] = []  # sys.path of a Python started as it was, but the first entry
PRELOADED: set[str] = set()  # the modules it holds once it has imported its preload list
# what importing them set in os.environ (debugpy's PYDEVD_USE_FRAME_EVAL), as a fresh import does
PRELOAD_ENV: dict[str, str] = {}
_SERVER: dict[str, int] = {}  # "pid": the server's
_ENDING: dict[int, int] = {}  # process id -> the exit code end() gave it
_KEPT: list = []  # the frames a process ending through end() leaves


def usable() -> str:
    """Why a fork server cannot be used on this machine; "" where it can."""
    if sys.platform != "linux":
        return f"it needs Linux, this is {sys.platform}"
    if not hasattr(os, "pidfd_open"):
        return "this Python has no pidfd_open"
    try:
        os.close(os.pidfd_open(os.getpid()))
    except OSError as error:
        return f"this Linux has no pidfd_open ({error})"
    return ""


def retitle(args: Sequence[str]) -> None:
    """Make this process's command line (``/proc/self/cmdline``, what ``ps`` shows) read ``args``.

    A forked process keeps its parent's. It is written over the memory that held the command line
    this process was started with, and cut to fit there: a server starts with :data:`TITLE_ROOM`
    bytes of it. Does nothing where ``/proc`` is missing.
    """
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        # arg_start and arg_end, fields 48 and 49 of proc(5)
        start, stop = int(fields[45]), int(fields[46])
    except (OSError, IndexError, ValueError):
        return
    if stop - start < 2:
        return
    data = b"\0".join(arg.encode(errors="replace") for arg in args)[: stop - start - 1]
    ctypes.memmove(start, data + b"\0" * (stop - start - len(data)), stop - start)


def refresh(command: Sequence[str], first_path: str, fresh_path: Sequence[str]) -> None:
    """What a forked process does to look like ``command`` started fresh, before it runs it.

    Its command line, ``sys.argv`` (``command`` less the interpreter and, for ``python -m``, the
    ``-m``), ``sys.orig_argv``, ``sys.path`` (``first_path``, then ``fresh_path``: a fresh
    Python's entries after its first), the import and source caches, ``tempfile``'s folder (read
    from the environment again), and every generator a fresh process seeds: Python's ``random``,
    numpy's (where imported), torch's CPU generator and ``multiprocessing``'s key.
    """
    import importlib
    import linecache
    import random
    import tempfile

    retitle(command)
    sys.orig_argv = list(command)
    sys.argv = list(command[2:] if command[1:2] == ["-m"] else command[1:])
    sys.path[:] = [first_path, *fresh_path]
    sys.dont_write_bytecode = bool(os.environ.get("PYTHONDONTWRITEBYTECODE"))
    sys.path_importer_cache.clear()
    importlib.invalidate_caches()
    linecache.clearcache()
    tempfile.tempdir = None
    random.seed()
    if "numpy.random" in sys.modules:  # numpy imports it at its first use, seeded then
        sys.modules["numpy.random"].seed()
    # the CPU's generator, as a fresh torch seeds it; others seed at their first use
    if "torch" in sys.modules:
        sys.modules["torch"].default_generator.seed()
    if "multiprocessing.process" in sys.modules:
        sys.modules["multiprocessing.process"].current_process().authkey = os.urandom(32)


def exit_code(done: SystemExit) -> int:
    """The exit code Python gives a program that ends with ``done`` (a message is printed, as Python
    prints it)."""
    if done.code is None or isinstance(done.code, int):
        return done.code or 0
    print(done.code, file=sys.stderr)
    return 1


def end(code: int) -> NoReturn:
    """End this forked process as Python ends a program: exit ``code``, or die of signal ``-code``.

    SystemExit goes up to the top of the stack (a frame on the way that handles it lets it pass
    while :func:`ending`), the interpreter waits for the process's threads and runs its atexit
    handlers, each once; the last of them, registered as the server started, then exits without
    tearing the modules down. What the frames on the way hold is kept until then: an object there
    may own a file descriptor this process closed by number, since used for another file.
    """
    import inspect

    _ENDING[os.getpid()] = code
    _KEPT.append(inspect.currentframe())
    raise SystemExit(code if code >= 0 else 128 - code)


def ending() -> bool:
    """Whether this process is ending through :func:`end`: a SystemExit caught now must be raised
    again."""
    return os.getpid() in _ENDING


def _finish() -> None:
    code = _ENDING.get(os.getpid())
    if code is None:  # not a process that end() ends: Python goes on ending it
        return
    sys.stdout.flush()
    sys.stderr.flush()
    if code < 0:  # as Python ends on a KeyboardInterrupt nobody caught
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code if code >= 0 else 128 - code)


def die_with_parent(parent: int) -> None:
    """Have SIGKILL sent to this process when the thread of ``parent`` that started it ends; if it
    has, exit now."""
    if ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        os._exit(128 + signal.SIGKILL)


def close_all_but(keep: set[int]) -> None:
    """Close every file descriptor from 3 up but ``keep``."""
    start = 3
    for fd in sorted(k for k in keep if k >= 3):
        os.closerange(start, fd)
        start = fd + 1
    os.closerange(start, os.sysconf("SC_OPEN_MAX"))


# --------------------------------------------------------------------------------------------------
# The server's side


def preload(names: Sequence[str]) -> None:
    """Import ``names`` in order: ``module``; ``package.*``, the package and each of its modules;
    ``module:function``, the module, then ``function()``. A server must not start CUDA: a child
    forked after that could not use it."""
    import importlib

    before = dict(os.environ)
    for name in names:
        module_name, _, function = name.partition(":")
        module = importlib.import_module(module_name.removesuffix(".*"))
        if module_name.endswith(".*"):
            import pkgutil

            for info in pkgutil.iter_modules(module.__path__):
                importlib.import_module(f"{module.__name__}.{info.name}")
        if function:
            getattr(module, function)()
    torch = sys.modules.get("torch")
    gpu_build = torch is not None and bool(torch.version.cuda or torch.version.hip)
    if torch is not None and (torch.cuda.is_initialized() or gpu_build and _in_bad_fork_for_cuda()):
        raise RuntimeError(
            "CUDA was started while importing; a process forked from here could not use it"
        )
    PRELOADED.update(sys.modules)
    PRELOAD_ENV.update({k: v for k, v in os.environ.items() if before.get(k) != v})
    # Out of the collector's reach: a collection in a child would write to every object's header
    # and so copy every page it shares with the server (the case gc.freeze's documentation gives).
    gc.freeze()


def _in_bad_fork_for_cuda() -> bool:
    """Whether a process forked from this one could not use CUDA (torch marks its children so once
    this one has asked the CUDA runtime anything, even the number of devices); not asked of a
    CPU-only build."""
    pid = os.fork()
    if pid == 0:
        import torch

        os._exit(1 if torch.cuda._is_in_bad_fork() else 0)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status) != 0


def main(args: Sequence[str]) -> None:
    """The server: ``SOCKET_FD SPEC_JSON ROOM`` (see
    :meth:`autograder.run.forkclient.ForkServer.start`)."""
    # before anything registers a handler: the last to run in a child (see end)
    atexit.register(_finish)
    spec = json.loads(args[1])
    STARTED_WITH.update(
        {
            signum: handler
            for signum in _SIGNALS
            if (handler := signal.getsignal(signum)) is not None
        }
    )
    if spec["die_with"]:
        die_with_parent(spec["die_with"])
    FRESH_PATH[:] = sys.path[1:]
    serve(socket.socket(fileno=int(args[0])), spec["name"], spec["preload"])


def serve(sock: socket.socket, name: str, names: Sequence[str], problem: str = "") -> NoReturn:
    """Be the server ``name`` on ``sock``: import ``names``, say whether it is ready (or why not:
    ``problem``, or what the imports raised), serve until the caller closes, exit."""
    retitle([sys.executable, "-m", "autograder.run.forkserver", name])
    _SERVER["pid"] = os.getpid()
    # Ctrl-C reaches the caller's process group: its children decide
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        if not problem:
            preload(names)
    except BaseException as error:  # noqa: BLE001 - the caller starts its processes the ordinary way, and says why
        problem = f"{type(error).__name__}: {error}"
    if not problem and threading.active_count() != 1:
        problem = "a thread was started while importing; forking would copy it"
    if problem:
        sock.send(json.dumps({"failed": problem}).encode())
    else:
        sock.send(json.dumps({"ready": True, "pid": os.getpid()}).encode())
        _serve(sock)  # in a child, it ends by SystemExit, which goes on up (see end)
    # Without the interpreter's teardown of what it imported, which the caller would wait for as it
    # closes it
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _serve(sock: socket.socket) -> None:
    """Fork a child when asked, pass on signals to children, report each child's end; until the
    caller closes."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    running: dict[int, int] = {}  # pidfd -> child pid
    while True:
        for fd, _ in poller.poll():
            if fd in running:
                pid = running.pop(fd)
                poller.unregister(fd)
                os.close(fd)
                _, status = os.waitpid(pid, 0)
                sock.send(
                    json.dumps({"ended": pid, "code": os.waitstatus_to_exitcode(status)}).encode()
                )
                continue
            data = sock.recv(MESSAGE_BYTES)
            if not data:
                return  # the caller closed
            request = json.loads(data)
            if request["op"] == "signal":
                # not reaped yet: the number is still that child's
                if request["pid"] in running.values():
                    os.kill(request["pid"], request["signal"])
                continue
            try:
                fds = recvfds(sock, request["fds"]) if request["fds"] else []
            except EOFError:
                return
            pid = _fork(request, fds, sock)
            if isinstance(pid, str):
                sock.send(json.dumps({"id": request["id"], "error": pid}).encode())
                continue
            pidfd = os.pidfd_open(pid)
            running[pidfd] = pid
            poller.register(pidfd, select.POLLIN)
            sock.send(json.dumps({"id": request["id"], "pid": pid}).encode())


def _fork(request: dict, fds: list[int], sock: socket.socket) -> int | str:
    """The child's pid, or why there is none; the child runs :func:`_child`."""
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        pid = os.fork()
    except OSError as error:
        pid = f"{type(error).__name__}: {error}"
    if pid == 0:
        sock.detach()  # closed with the rest; its socket object must not close another file later
        _child(request, fds)
    for fd in fds:
        os.close(fd)
    return pid


def _child(request: dict, fds: list[int]) -> NoReturn:
    """In the forked process: the handlers it started with, ``fds`` as its standard input, output
    and error, nothing else open; then the request's entry, and :func:`end` with what it returns."""
    code = 1
    try:
        for signum, handler in STARTED_WITH.items():
            signal.signal(signum, handler)
        for target, fd in enumerate(fds[:3]):
            os.dup2(fd, target)
        close_all_but(set())
        module, _, function = request["entry"].partition(":")
        import importlib

        code = getattr(importlib.import_module(module), function)(request["args"])
    except SystemExit as done:
        if ending():  # a process forked below: it ends at the top of its stack
            raise
        code = exit_code(done)
    except BaseException:  # noqa: BLE001 - into the child's standard error, as Python would print it
        import traceback

        traceback.print_exc()
    end(code if isinstance(code, int) else 0)


def server_pid() -> int:
    """In a process a server forked: the server's process id."""
    return _SERVER["pid"]


if __name__ == "__main__":
    if len(sys.argv) != 4 or not sys.argv[1].isdigit():
        sys.exit(
            "usage: python -m autograder.run.forkserver SOCKET_FD SPEC_JSON ROOM (started by a"
            " ForkServer)"
        )
    # one copy of the module's state: the one its children import
    from autograder.run import forkserver

    forkserver.main(sys.argv[1:])
