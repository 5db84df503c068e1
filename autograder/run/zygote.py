"""Runners and their kernels forked from one process that has imported what every kernel imports
(Linux).

The local pool (one zygote per grading run) and each Dask worker (one for its life) start a fork
server (:mod:`.forkserver`) through :class:`Zygote`; it imports the kernels' packages once and from
then on only forks runners that run :func:`autograder.run.forked.runner` (grader ── zygote ── runner
── launcher ── init ── kernel). Without namespaces and with ``--no-zygote``, runners and kernels
start fresh.
"""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import time
from pathlib import Path

from autograder.run.forkclient import ForkedProcess, ForkServer, ForkServerUnavailable
from autograder.run.forkserver import usable

__all__ = ["ForkedRunner", "Zygote", "ZygoteUnavailable", "usable"]

ANSWER_TIMEOUT_S = 60  # for a child's answer (:meth:`Zygote.checked`), its imports done

# What a fresh kernel imports as it starts, in that order (ipykernel, then the guard), so that the
# warning filters they add come in the same order; first, what the runners need of the grader.
PRELOAD = (
    "autograder.run.startup:skip_unused_imports",
    "autograder.run.forked",
    "ipykernel.ipkernel",
    "ipykernel.kernelapp",
    "ipykernel.zmqshell",
    "IPython",
    "ipykernel.debugger",  # which the kernel imports as it starts, debugpy with it
)


# Last: what only runners use (the kernels it forks leave it out, see autograder.run.forked)
RUNNER = "autograder.run.forked:preload_runner"


class ZygoteUnavailable(ForkServerUnavailable):
    """The zygote cannot fork runners (it could not start, or it ended): runners start fresh
    instead."""


class ForkedRunner(ForkedProcess):
    """A runner the zygote forked, with what the grader uses of a runner's ``Popen``: ``stdin``,
    ``wait``, ``poll``, ``terminate``, ``kill`` (the first three as
    :class:`autograder.run.forkclient.ForkedProcess` has them)."""

    kind = "runner"

    def __init__(self, zygote: "Zygote", pid: int, stdin):
        super().__init__(pid)
        self.zygote, self.stdin = zygote, stdin
        self.lost = False  # it died with its zygote: its job was not done

    def _lost(self, closed: bool) -> None:
        self.lost = not closed  # it died with the zygote (PR_SET_PDEATHSIG), its job not done
        self._end(-signal.SIGKILL)

    def send_signal(self, signum: int) -> None:
        if not self._ended.is_set():
            self.zygote.signal(self.pid, signum)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class Zygote(ForkServer):
    """The grader's handle on its zygote: started by :meth:`start` or at the first :meth:`spawn`,
    ended by :meth:`close`.

    ``env`` is the kernel's environment (the zygote's and every runner's until it has its job), or a
    function that gives it when the zygote starts; ``cwd`` its folder; ``packages`` what the
    course's kernels import (:class:`autograder.course.profile.KernelSetup`), which the zygote
    imports ahead, after :data:`PRELOAD`. The last lines the zygote printed are kept (``output``)
    and quoted when it fails.

    The zygote holds nothing of any job: it starts with the kernel's environment only
    (:func:`autograder.run.kernel.kernel_env`), imports only the Python environment's modules and
    the course's packages, and is told of a runner only whether it is warm. A runner forks its
    kernels' launchers before it reads its job's path (so no kernel holds anything of the job or the
    grader's environment), then runs the job as ``python -m autograder.run.runner`` would; a
    launcher builds the sandbox as :mod:`autograder.inside.launcher` always does. A kernel gets what
    a fresh one has (``sys.path``, environment, signal handlers, ``sys.argv``, freshly seeded
    generators, a new ``multiprocessing`` key, the command line
    :func:`autograder.run.forkserver.retitle` gives), less the grader's modules and caches, and ends
    as a fresh one ends (its atexit handlers run, once). Still shared with the zygote: Python's hash
    seed, the order of warning filters, and its pages copy-on-write (left out of a submission's
    memory count through the sandbox's own processes, :func:`autograder.run.watch.tree_usage`). Each
    process dies with its parent (``PR_SET_PDEATHSIG``), and runners are signalled through the
    zygote, which reaps them, so no signal reaches a reused process id.
    """

    unavailable = ZygoteUnavailable

    def __init__(self, env, cwd: Path, packages: tuple[str, ...] = ()):
        super().__init__(
            env,
            cwd,
            preload=(*PRELOAD, *packages, RUNNER),
            name="zygote",
            die_with_parent=True,
        )
        self.packages = tuple(packages)

    def spawn(self, job_file: Path, log_fd: int, warm: bool, env: dict[str, str]) -> ForkedRunner:
        """A runner for ``job_file``, its output to ``log_fd``, its environment ``env`` (given to it
        once it has forked its kernels' launchers); a warm one waits for ``go`` on its ``stdin``.

        Raises :class:`ZygoteUnavailable` when the zygote cannot fork it.
        """
        read_end, write_end = os.pipe()
        stdin = os.fdopen(write_end, "w")
        try:
            runner = self.fork(
                "autograder.run.forked:runner",
                {"warm": warm, "grader": os.getpid()},
                [read_end, log_fd, log_fd],
                make=lambda pid: ForkedRunner(self, pid, stdin),
            )
        except ForkServerUnavailable:
            stdin.close()
            raise
        finally:
            os.close(read_end)
        # the job comes first on the runner's input: it reads it once its kernels' launchers exist
        try:
            stdin.write(json.dumps({"job": str(job_file), "env": env}) + "\n")
            stdin.flush()
            if not warm:
                stdin.close()
                runner.stdin = None
        except OSError:
            pass  # it ended already; its end is reported as any other
        return runner

    def checked(self, profile: str) -> tuple[str, tuple[str, ...]] | None:
        """What the course's ``profile`` names of this machine (its devices, and the machines its
        checks name that it cannot stand for), named by a child of the zygote, which has the
        kernels' imports and environment; None where it cannot answer (it is unavailable, the child
        failed or took over :data:`ANSWER_TIMEOUT_S`)."""
        read_end, write_end = os.pipe()
        nowhere = os.open(os.devnull, os.O_RDWR)
        try:
            # its answer alone on the pipe: a warning or a failure of its own is the grader's to
            # meet again, naming the devices itself
            child = self.fork(
                "autograder.run.forked:checked", {"profile": profile}, [nowhere, write_end, nowhere]
            )
        except ZygoteUnavailable:
            os.close(read_end)
            return None
        finally:
            os.close(write_end)
            os.close(nowhere)
        said, deadline = b"", time.monotonic() + ANSWER_TIMEOUT_S
        with os.fdopen(read_end, "rb") as answer:
            while select.select([answer], [], [], max(0.0, deadline - time.monotonic()))[0]:
                chunk = os.read(answer.fileno(), 1 << 16)
                if not chunk:
                    break
                said += chunk
            else:
                self.signal(child.pid, signal.SIGKILL)
        try:
            code = child.wait(ANSWER_TIMEOUT_S)
            named = json.loads(said) if code == 0 else None
        except (subprocess.TimeoutExpired, ValueError):
            return None
        return (named["devices"], tuple(named["not_checked"])) if named else None
