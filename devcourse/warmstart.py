"""Start Python scripts in processes forked from one that has already imported torch (Linux).

Every new process that imports torch pays the import before its first line; the course's checks start many
small runs (07's exercises, 09's FSDP ranks, through :func:`devcourse.distributed.start_ranks`).
:func:`starter` gives a :class:`WarmStarter`, a server (``python -m devcourse.warmstart``) that imports torch
once and then only forks; elsewhere than Linux callers start processes the ordinary way.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Callable, Sequence

__all__ = ["ForkedProcess", "WarmStarter", "retitle", "starter"]

TITLE_ROOM = 8192  # bytes of command line every forked process can write its own into (see retitle)
READY_TIMEOUT_S = 120.0  # the server's imports, with room to spare on a busy machine
IDLE_S = 300.0  # a server that has started nothing for this long, and runs nothing, ends (it holds torch's memory)
PRELOAD = ("torch", "torch.distributed", "torch.nn.parallel", "torch.utils.data", "torch.distributed.fsdp",
           "devcourse.simdevice", "devcourse.models")


def retitle(args: Sequence[str]) -> None:
    """Make this process's command line (``/proc/self/cmdline``, what ``ps`` shows) read ``args``.

    A forked process keeps its parent's. It is written over the memory that held the command line
    this process was started with, and cut to fit there: servers that fork start with
    :data:`TITLE_ROOM` bytes of it. Does nothing where ``/proc`` is missing.
    """
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start and arg_end, fields 48 and 49 of proc(5)
    except (OSError, IndexError, ValueError):
        return
    if end - start < 2:
        return
    data = b"\0".join(arg.encode(errors="replace") for arg in args)[:end - start - 1]
    ctypes.memmove(start, data + b"\0" * (end - start - len(data)), end - start)


def refresh(command: Sequence[str], first_path: str, fresh_path: Sequence[str]) -> None:
    """What a process forked from a server does to look like ``command`` started fresh, before it runs it.

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
    if "torch" in sys.modules:  # the CPU's generator, as a fresh torch seeds it; others seed at their first use
        sys.modules["torch"].default_generator.seed()
    if "multiprocessing.process" in sys.modules:
        sys.modules["multiprocessing.process"].current_process().authkey = os.urandom(32)


# ---------------------------------------------------------------------------------------------------------------
# The caller's side


class ForkedProcess:
    """A process the server forked, with what :mod:`devcourse.distributed` uses of ``Popen``:
    ``pid``, ``returncode``, ``poll`` and ``wait``. Signal it with ``os.killpg(pid, ...)``: it leads a
    session of its own."""

    kind = "process"  # how a timeout names it

    def __init__(self, pid: int):
        self.pid = pid
        self.returncode: int | None = None
        self._ended = threading.Event()

    def _end(self, code: int) -> None:
        self.returncode = code
        self._ended.set()

    def poll(self) -> int | None:
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"{self.kind} {self.pid}", timeout)
        return self.returncode


class WarmStarter:
    """A server that has imported :data:`PRELOAD` and forks processes that run scripts.

    Raises ``RuntimeError`` when the server cannot start or import them; a server that dies later
    ends every process it started (killed, ``returncode`` -9) and refuses to start more. A server
    left idle for :data:`IDLE_S` ends (:func:`starter` then starts a new one when one is needed).
    While it lives it is one more process, whose memory the autograder counts toward a submission's
    limit like that of any process a notebook starts. It imports torch but never touches the GPU, so
    on a CUDA machine each process starts CUDA itself, as a fresh one does.
    """

    def __init__(self, env: dict[str, str]):
        self.env = dict(env)
        self._lock = threading.Lock()
        self._processes: dict[int, ForkedProcess] = {}
        self._replies: list[dict] = []
        self._replied = threading.Condition()
        self._ended = self._closed = False
        self._idle: threading.Timer | None = None
        self._server = subprocess.Popen(
            [sys.executable, "-m", "devcourse.warmstart", "-" * TITLE_ROOM],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=self.env, start_new_session=True)
        threading.Thread(target=self._read, name="warmstart", daemon=True).start()
        ready = self._reply(READY_TIMEOUT_S)
        if "ready" not in ready:
            self.close()
            raise RuntimeError(f"the process server could not start: {ready.get('failed', 'it ended')}")
        self.fresh_path: list[str] = ready["ready"]
        self._wait_idle()

    @property
    def alive(self) -> bool:
        """Whether the server can start processes."""
        return not (self._ended or self._closed)

    def start(self, command: Sequence[str], env: dict[str, str], cwd: str | Path | None,
              log: str | Path) -> ForkedProcess:
        """Run ``command`` (``[sys.executable, SCRIPT, *ARGS]`` or ``[sys.executable, "-m", MODULE, *ARGS]``)
        in a forked process; its output is appended to ``log``.

        The process gets what ``python SCRIPT ARGS`` would have had: a session of its own, ``cwd``, ``env``,
        standard output and error appended to ``log``, standard input from ``/dev/null``, ``sys.argv``,
        ``sys.path`` (the script's folder first; for a module the working folder), the command line ``ps``
        shows (:func:`retitle`), and Python's, numpy's and torch's CPU generators seeded afresh. The script
        runs as ``__main__`` (a module through ``runpy``, as ``python -m`` runs it); its exit code, or minus
        the signal that ended it, is what :meth:`ForkedProcess.poll` returns. What still differs from a
        fresh process: the server's modules are already imported, the hash seed is the server's, and its
        pages are shared copy-on-write.
        """
        if not _forkable(command):
            raise ValueError("only `python SCRIPT ARGS` and `python -m MODULE ARGS` can be forked, "
                             f"not {list(command)!r}")
        request = {"command": list(command), "env": dict(env), "cwd": os.path.abspath(cwd or os.getcwd()),
                   "log": os.path.abspath(log)}
        with self._lock:
            if not self.alive:
                raise RuntimeError("the process server has ended")
            try:
                self._server.stdin.write(json.dumps(request).encode() + b"\n")
                self._server.stdin.flush()
            except OSError as error:
                raise RuntimeError(f"the process server has ended ({error})") from None
            reply = self._reply(30.0)
            if "started" not in reply and self.alive:  # a fork takes milliseconds: this server is stuck
                self.close()
            elif self.alive:
                self._wait_idle()
        if "started" not in reply:
            raise RuntimeError(f"the process server could not start {command[1]}: {reply.get('failed', 'it ended')}")
        return reply["process"]

    def close(self) -> None:
        """End the server (the processes it started go on, as ``Popen``'s would)."""
        self._closed = True
        if self._idle is not None:
            self._idle.cancel()
        if self._server.poll() is None:
            try:
                self._server.stdin.close()
            except OSError:
                pass
            try:
                self._server.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._server.kill()
                self._server.wait()

    def _wait_idle(self) -> None:
        """(Re)start the count of :data:`IDLE_S`; call it with ``_lock`` held, or before the server is shared."""
        if self._idle is not None:
            self._idle.cancel()
        self._idle = threading.Timer(IDLE_S, self._end_if_idle)
        self._idle.daemon = True
        self._idle.start()

    def _end_if_idle(self) -> None:
        with self._lock:
            if any(process.returncode is None for process in list(self._processes.values())):
                self._wait_idle()
            elif self.alive:
                self.close()

    def _reply(self, timeout: float) -> dict:
        with self._replied:
            if not self._replied.wait_for(lambda: self._replies or not self.alive, timeout):
                return {"failed": f"no answer within {timeout:g} s"}
            return self._replies.pop(0) if self._replies else {"failed": "it ended"}

    def _read(self) -> None:
        for line in self._server.stdout:
            message = json.loads(line)
            if "started" in message:  # made here, before any "ended" of it can be read
                message["process"] = self._processes[message["started"]] = ForkedProcess(message["started"])
            if "ended" in message:
                process = self._processes.pop(message["ended"], None)
                if process is not None:
                    process._end(message["code"])
            else:
                with self._replied:
                    self._replies.append(message)
                    self._replied.notify_all()
        with self._replied:
            self._ended = True
            self._replied.notify_all()
        for process in list(self._processes.values()):  # orphans nobody would reap for us: end them
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            process._end(-signal.SIGKILL)
        self._processes.clear()


# The server in use, as (its environment's key, the server or None if it failed), under "server". A dict changed
# in place, never a global rebound: the grader's guard puts every attribute of the course's modules back as it
# was before each test, which would set a rebound global back to None and leave its server running, unused, while
# the next run starts another (each holds torch in the submission's memory, and costs a torch import).
_CURRENT: dict[str, tuple[str, WarmStarter | None]] = {}
_CURRENT_LOCK = threading.Lock()


# Read when a process first uses a device, never while torch is imported (torch.cuda reads
# CUDA_VISIBLE_DEVICES in functions only): a process forked with another value sees its own.
AT_FIRST_USE = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def starter(env: dict[str, str]) -> WarmStarter | None:
    """The server for processes started with ``env``; None where forking is not used: elsewhere than Linux
    (macOS's system libraries forbid forking a process that has started them), with
    ``DEVCOURSE_NO_WARMSTART`` set, or when the server could not start. Callers then start processes the
    ordinary way.

    One server at a time: a call with another ``env`` ends the old one and starts a new one, unless
    only the variables of :data:`AT_FIRST_USE` differ (07 hides the GPUs from some runs). A server
    that could not start is not tried again for the same ``env``.
    """
    if sys.platform != "linux" or os.environ.get("DEVCOURSE_NO_WARMSTART"):
        return None
    key = json.dumps({name: value for name, value in env.items() if name not in AT_FIRST_USE}, sort_keys=True)
    with _CURRENT_LOCK:
        if "server" in _CURRENT:
            current_key, current = _CURRENT["server"]
            if current_key == key and (current is None or current.alive):
                return current
            if current is not None:
                current.close()
        try:
            server = WarmStarter(env)
        except (OSError, RuntimeError):
            server = None
        _CURRENT["server"] = (key, server)
        return server


# ---------------------------------------------------------------------------------------------------------------
# The server's side


def _serve(requests: int, replies: int) -> None:
    def send(message: dict) -> None:
        os.write(replies, json.dumps(message).encode() + b"\n")

    import importlib

    fresh_path = list(sys.path[1:])  # those of `python SCRIPT`, after the script's folder
    try:
        for name in PRELOAD:
            importlib.import_module(name)
    except BaseException as error:  # noqa: BLE001 - told to the caller, who starts processes the ordinary way
        send({"failed": f"importing {name}: {error!r}"})
        return
    if threading.active_count() != 1:
        send({"failed": "a Python thread was started while importing; a fork would copy it"})
        return
    wakeup_read, wakeup_write = os.pipe()
    os.set_blocking(wakeup_write, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wakeup_write)
    send({"ready": fresh_path})
    pending = b""
    while True:
        readable, _, _ = select.select([requests, wakeup_read], [], [])
        if wakeup_read in readable:
            os.read(wakeup_read, 4096)
        while True:  # reap every process that ended
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            send({"ended": pid, "code": os.waitstatus_to_exitcode(status)})
        if requests in readable:
            data = os.read(requests, 1 << 20)
            if not data:  # the caller ended or closed us
                return
            pending += data
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                try:
                    pid = os.fork()
                except OSError as error:
                    send({"failed": f"fork: {error}"})
                    continue
                if pid == 0:
                    for fd in (requests, replies, wakeup_read, wakeup_write):
                        os.close(fd)
                    _run_script(request, fresh_path)  # never returns
                send({"started": pid})


def _run_script(request: dict, fresh_path: list[str]) -> None:
    """In the forked process: become ``python SCRIPT ARGS`` (see the module) and run it; never returns."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.setsid()
        log = os.open(request["log"], os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        os.close(null)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        command = request["command"]
        if command[1] == "-m":  # as `python -m`: the working folder first on the path, the module found there
            refresh(command, os.getcwd(), fresh_path)
            code = _main(_run_module, command[2])
        else:
            script = os.path.abspath(command[1])
            refresh(command, os.path.dirname(script), fresh_path)
            code = _main(_run_path, script)
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            if code < 0:  # ended by a signal, as Python ends on a KeyboardInterrupt nobody caught
                signal.signal(-code, signal.SIG_DFL)
                os.kill(os.getpid(), -code)
        finally:
            os._exit(code if code >= 0 else 128 - code)


def _forkable(command: Sequence[str]) -> bool:
    """Whether ``command`` is ``python SCRIPT ARGS`` or ``python -m MODULE ARGS``, what the server can become."""
    command = list(command)
    if command[:1] != [sys.executable] or len(command) < 2:
        return False
    if command[1] == "-m":
        return len(command) >= 3 and not command[2].startswith("-")
    return not command[1].startswith("-")


def _run_path(script: str) -> None:
    """Run ``script`` as ``__main__``, as ``python SCRIPT`` does."""
    import types

    module = types.ModuleType("__main__")
    module.__file__ = script
    module.__builtins__ = __builtins__
    sys.modules["__main__"] = module
    with open(script, "rb") as file:
        code = compile(file.read(), script, "exec")
    exec(code, module.__dict__)


def _run_module(name: str) -> None:
    """Run module ``name`` as ``__main__``, as ``python -m`` does (``runpy`` finds it on the path and puts its
    file in ``sys.argv[0]``). A module the server imported is dropped from ``sys.modules`` first: runpy would
    run it all the same, but warn that it had been imported, which a fresh process never does."""
    import runpy

    sys.modules.pop(name, None)
    runpy._run_module_as_main(name)  # what `python -m` calls; runpy.run_module differs (no __main__ swap)


def _main(run: Callable[[str], None], target: str) -> int:
    """``run(target)`` (:func:`_run_path` or :func:`_run_module`), and the exit code Python would have ended
    with; an exception is printed as Python prints it: without this module's frames."""
    import atexit
    import traceback

    try:
        run(target)
        code = 0
    except SystemExit as done:
        if done.code is None or isinstance(done.code, int):
            code = done.code or 0
        else:
            print(done.code, file=sys.stderr)
            code = 1
    except BaseException as error:  # noqa: BLE001 - printed as Python prints it, without this frame
        tb = error.__traceback__.tb_next  # run's frame, then the script's (or runpy's, as under `python -m`)
        traceback.print_exception(type(error), error, tb.tb_next if tb is not None else None)
        code = -signal.SIGINT if isinstance(error, KeyboardInterrupt) else 1
    atexit._run_exitfuncs()
    return code


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m devcourse.warmstart ROOM (started by devcourse.warmstart.WarmStarter)")
    retitle([sys.executable, "-m", "devcourse.warmstart"])
    # Replies go out on a copy of standard output; standard output itself goes where errors go, so that
    # nothing an import prints can be read as a reply.
    replies = os.dup(1)
    requests = os.dup(0)
    os.dup2(2, 1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    _serve(requests, replies)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
