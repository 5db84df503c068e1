"""The runner processes of this grader: started fresh or forked warm, each ended with its job or a
stopped run."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

from autograder.course.config import tool_env
from autograder.course.paths import HOME
from autograder.run.jobspec import JobSpec
from autograder.run.zygote import ZygoteUnavailable
from autograder.settings import WALL_PER_PROCESSOR_S, Settings


class Runners:
    """The runner processes of this grader that are still running, so that a stopped run can end
    them."""

    def __init__(self):
        self.lock = threading.Lock()
        self.running: set[subprocess.Popen] = set()
        self.stopping = threading.Event()

    def stop(self, grace_s: float = 3.0) -> None:
        """End every runner: SIGTERM (each ends its kernel's sandbox and writes what it has),
        SIGKILL after grace_s."""
        self.stopping.set()
        with self.lock:
            running = list(self.running)
        for process in running:
            try:
                process.terminate()
            except OSError:
                pass
        deadline = time.monotonic() + grace_s
        for process in running:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()


RUNNERS = Runners()


def execute(job_file: Path, settings: Settings, runners: Runners = RUNNERS, zygote=None) -> None:
    """Run the runner for one job in its own process (forked by ``zygote`` if given, see
    :func:`launch`); never raises. Does nothing once ``runners`` is stopping."""
    finish(launch(job_file, runners, zygote=zygote), job_file, settings, runners)


def launch(
    job_file: Path, runners: Runners = RUNNERS, warm: bool = False, zygote=None, note: str = ""
):
    """Start the runner of one job (None once ``runners`` is stopping): a ``subprocess.Popen``, or
    with ``zygote`` (an :class:`autograder.run.zygote.Zygote`) a runner it forked, which is used the
    same way.

    ``warm``: it starts the kernel in its sandbox, imports torch, installs the guard, then waits for
    :func:`finish` to let it run the notebook (or to take the job back). ``note`` begins its log.
    """
    log = job_file.parent / "runner.log"
    with log.open("w") as handle:
        if note:
            handle.write(note + "\n")
            handle.flush()
        if zygote is not None and not runners.stopping.is_set():
            try:
                process = zygote.spawn(job_file, handle.fileno(), warm, tool_env())
            except ZygoteUnavailable as error:  # every later job starts fresh too
                handle.write(f"runner started fresh: the zygote cannot fork runners, {error}\n")
                handle.flush()
            else:
                with runners.lock:
                    runners.running.add(process)
                    if not runners.stopping.is_set():
                        return process
                process.kill()
                return None
    with log.open("a") as handle, runners.lock:
        if runners.stopping.is_set():
            return None
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "autograder.run.runner",
                str(job_file),
                str(os.getpid()),
                *(["--warm"] if warm else []),
            ],
            cwd=HOME,
            stdin=subprocess.PIPE if warm else subprocess.DEVNULL,
            stdout=handle,
            stderr=subprocess.STDOUT,
            env=tool_env(),
            text=True,
        )
        runners.running.add(process)
    return process


def finish(
    process: subprocess.Popen | None,
    job_file: Path,
    settings: Settings,
    runners: Runners = RUNNERS,
    go: bool = True,
) -> None:
    """Let a started runner (warm or not) run its job to its end, or take a warm one's job back
    (``go=False``: it ends writing nothing); never raises. Removes the job's working copy.

    A runner forked by a zygote that died while it ran died with it, its job not done: the job runs
    again from its start, in a runner started fresh."""
    try:
        if process is not None:
            if process.stdin is not None:
                with contextlib.suppress(OSError):
                    process.stdin.write("go\n" if go else "")
                    process.stdin.close()
            try:
                process.wait(timeout=settings.limits.time_limit_s * WALL_PER_PROCESSOR_S + 120)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if go and getattr(process, "lost", False):
                with runners.lock:
                    runners.running.discard(process)
                Path(JobSpec.read(job_file).probes_log).unlink(missing_ok=True)
                fresh = launch(
                    job_file,
                    runners,
                    note=(
                        "this job runs again, in a runner started fresh: the zygote "
                        "that had forked its runner ended while it ran"
                    ),
                )
                finish(fresh, job_file, settings, runners)
                return
    finally:
        if process is not None:
            with runners.lock:
                runners.running.discard(process)
        if not settings.keep_work:
            remove_tree(job_file.parent / "work")


def remove_tree(folder: Path) -> None:
    """Remove ``folder`` and all in it, folders a submission made unwritable or unreadable
    included."""

    def writable_then_again(function, path, _error):
        for place in {os.path.dirname(path), path}:
            try:
                os.chmod(place, 0o700)
            except OSError:
                pass
        function(path)

    if folder.exists():
        shutil.rmtree(folder, onerror=writable_then_again)
