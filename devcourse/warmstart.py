"""Start Python scripts in processes forked from one that has already imported torch (Linux).

Every new process that imports torch pays the import before its first line; the course's checks
start many small runs (07's exercises, 09's FSDP ranks, through
:func:`devcourse.distributed.start_ranks`). :func:`starter` gives a :class:`WarmStarter`, a
:mod:`autograder.run.forkserver` that imports torch once and forks processes that run
:func:`run_script`; elsewhere than Linux callers start processes the ordinary way.
"""

from __future__ import annotations

import json
import os
import runpy
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

if TYPE_CHECKING:
    from autograder.run.forkclient import ForkedProcess

__all__ = ["WarmStarter", "run_script", "starter"]

_RUNPY = getattr(runpy, "__file__", "")  # where runpy's frames come from when it is not frozen
# a server that has started nothing for this long, and runs nothing, ends (it holds torch's memory)
IDLE_S = 300.0
PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.nn.parallel",
    "torch.utils.data",
    "torch.distributed.fsdp",
    "simdevice",
    "devcourse.models",
    "devcourse.warmstart",
)


def _fork_server():
    """The grader's fork server and its client, imported at first use: every grading kernel imports
    this module, and the grader's own modules stay out of a kernel that does not start anything
    warm."""
    from autograder.run import forkclient, forkserver

    return forkclient, forkserver


class WarmStarter:
    """A server that has imported :data:`PRELOAD` and forks processes that run scripts.

    Raises ``RuntimeError`` when the server cannot start or import them; a server that dies later
    ends every process it started (killed, ``returncode`` -9) and refuses to start more. A server
    left idle for :data:`IDLE_S` ends (:func:`starter` then starts a new one when one is needed).
    While it lives it is one more process, whose memory the autograder counts toward a submission's
    limit like that of any process a notebook starts. It imports torch but never touches the GPU, so
    on a CUDA machine each process starts CUDA itself, as a fresh one does. In a grading kernel
    forked warm, the sandbox forks the server with torch already imported (``from_sandbox`` of
    :class:`autograder.run.forkclient.ForkServer`).
    """

    def __init__(self, env: dict[str, str]):
        self.env = dict(env)
        self._lock = threading.Lock()
        self._idle: threading.Timer | None = None
        forkclient, _ = _fork_server()
        self.server = forkclient.ForkServer(
            self.env, preload=PRELOAD, name="warmstart", new_session=True, from_sandbox=True
        )
        self.server.start()
        self.server.ready.wait(forkclient.READY_TIMEOUT_S)
        if not self.server.ready.is_set() or self.server.problem:
            problem = self.server.problem or f"no answer within {forkclient.READY_TIMEOUT_S:g} s"
            self.close()
            raise RuntimeError(f"the process server could not start: {problem}")
        self._wait_idle()

    @property
    def alive(self) -> bool:
        """Whether the server can start processes."""
        return self.server.alive

    def start(
        self, command: Sequence[str], env: dict[str, str], cwd: str | Path | None, log: str | Path
    ) -> ForkedProcess:
        """Run ``command`` (``[sys.executable, SCRIPT, *ARGS]`` or ``[sys.executable, "-m", MODULE,
        *ARGS]``) in a forked process; its output is appended to ``log``.

        The process gets what ``python SCRIPT ARGS`` would have had: a session of its own, ``cwd``,
        ``env``, standard output and error appended to ``log``, standard input from ``/dev/null``,
        ``sys.argv``, ``sys.path`` (the script's folder first; for a module the working folder), the
        command line ``ps`` shows (:func:`autograder.run.forkserver.retitle`), the signal handlers
        the server started with, and Python's, numpy's and torch's CPU generators seeded afresh. The
        script runs as ``__main__`` (a module through ``runpy``, as ``python -m`` runs it); its exit
        code, or minus the signal that ended it, is what :meth:`ForkedProcess.poll` returns. What
        still differs from a fresh process: the server's modules are already imported, the hash seed
        is the server's, and its pages are shared copy-on-write.
        """
        if not _forkable(command):
            raise ValueError(
                "only `python SCRIPT ARGS` and `python -m MODULE ARGS` can be forked, "
                f"not {list(command)!r}"
            )
        args = {
            "command": list(command),
            "env": dict(env),
            "cwd": os.path.abspath(cwd or os.getcwd()),
        }
        with self._lock:
            if not self.alive:
                raise RuntimeError("the process server has ended")
            null = os.open(os.devnull, os.O_RDONLY)
            out = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
            try:
                process = self.server.fork("devcourse.warmstart:run_script", args, [null, out, out])
            except _fork_server()[0].ForkServerUnavailable as error:
                if self.alive:  # a fork takes milliseconds: this server is stuck
                    self.close()
                raise RuntimeError(
                    f"the process server could not start {command[1]}: {error}"
                ) from None
            finally:
                os.close(null)
                os.close(out)
            self._wait_idle()
        return process

    def close(self) -> None:
        """End the server; a process it started that still runs is killed, as nothing would reap
        it."""
        if self._idle is not None:
            self._idle.cancel()
        self.server.close()

    def _wait_idle(self) -> None:
        """(Re)start the count of :data:`IDLE_S`; call it with ``_lock`` held, or before the server
        is shared."""
        if self._idle is not None:
            self._idle.cancel()
        self._idle = threading.Timer(IDLE_S, self._end_if_idle)
        self._idle.daemon = True
        self._idle.start()

    def _end_if_idle(self) -> None:
        with self._lock:
            if any(process.returncode is None for process in list(self.server.processes.values())):
                self._wait_idle()
            elif self.alive:
                self.close()


# The server in use, as (its environment's key, the server or None if it failed), under "server". A
# dict changed in place, never a global rebound: the grader's guard puts every attribute of the
# course's modules back as it was before each test, which would set a rebound global back to None
# and leave its server running, unused, while the next run starts another (each holds torch in the
# submission's memory, and costs a torch import).
_CURRENT: dict[str, tuple[str, WarmStarter | None]] = {}
_CURRENT_LOCK = threading.Lock()


# Read when a process first uses a device, never while torch is imported (torch.cuda reads
# CUDA_VISIBLE_DEVICES in functions only): a process forked with another value sees its own.
AT_FIRST_USE = ("CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES", "ROCR_VISIBLE_DEVICES")


def starter(env: dict[str, str]) -> WarmStarter | None:
    """The server for processes started with ``env``; None where forking is not used: elsewhere than
    Linux (macOS's system libraries forbid forking a process that has started them), with
    ``DEVCOURSE_NO_WARMSTART`` set, or when the server could not start. Callers then start processes
    the ordinary way.

    One server at a time: a call with another ``env`` ends the old one and starts a new one, unless
    only the variables of :data:`AT_FIRST_USE` differ (07 hides the GPUs from some runs). A server
    that could not start is not tried again for the same ``env``.
    """
    if os.environ.get("DEVCOURSE_NO_WARMSTART") or _fork_server()[1].usable():
        return None
    key = json.dumps(
        {name: value for name, value in env.items() if name not in AT_FIRST_USE}, sort_keys=True
    )
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


# --------------------------------------------------------------------------------------------------
# The forked process's side


def run_script(args: dict) -> int:
    """In a process the server forked: become ``python SCRIPT ARGS`` (see :meth:`WarmStarter.start`)
    and run it; its exit code, or minus the signal Python would have died of."""
    os.setsid()
    os.chdir(args["cwd"])
    os.environ.clear()
    os.environ.update(args["env"])
    command = args["command"]
    _, forkserver = _fork_server()
    # as `python -m`: the working folder first on the path, the module found there
    if command[1] == "-m":
        forkserver.refresh(command, os.getcwd(), forkserver.FRESH_PATH)
        return _main(_run_module, command[2])
    script = os.path.abspath(command[1])
    forkserver.refresh(command, os.path.dirname(script), forkserver.FRESH_PATH)
    return _main(_run_path, script)


def _forkable(command: Sequence[str]) -> bool:
    """Whether ``command`` is ``python SCRIPT ARGS`` or ``python -m MODULE ARGS``, what the server
    can become."""
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
    """Run module ``name`` as ``__main__``, as ``python -m`` does (``runpy`` finds it on the path
    and puts its file in ``sys.argv[0]``). A module the server imported is dropped from
    ``sys.modules`` first: runpy would run it all the same, but warn that it had been imported,
    which a fresh process never does."""
    import importlib.util

    sys.modules.pop(name, None)
    try:
        found = importlib.util.find_spec(name)
    except ImportError:
        found = None
    if found is None:  # what `python -m` says and exits with
        sys.exit(f"{sys.executable}: No module named {name}")
    runpy.run_module(name, run_name="__main__", alter_sys=True)


def _main(run: Callable[[str], None], target: str) -> int:
    """``run(target)`` (:func:`_run_path` or :func:`_run_module`), and the exit code Python would
    have ended with (minus a signal it would have died of); an exception is printed as Python prints
    it: without this module's frames. The atexit handlers run after, as the process ends
    (:func:`autograder.run.forkserver.end`)."""
    import traceback

    try:
        run(target)
        code = 0
    except SystemExit as done:
        code = _fork_server()[1].exit_code(done)
    except BaseException as error:  # noqa: BLE001 - printed as Python prints it, without this frame
        # run's frame, then the script's (or runpy's, under `python -m`)
        tb = error.__traceback__.tb_next
        tb = tb.tb_next if tb is not None else None
        while tb is not None and tb.tb_frame.f_code.co_filename in ("<frozen runpy>", _RUNPY):
            # runpy's frames, which a fresh `python -m` shows otherwise named, left out
            tb = tb.tb_next
        traceback.print_exception(type(error), error, tb)
        code = -signal.SIGINT if isinstance(error, KeyboardInterrupt) else 1
    return code
