"""The local pool: ``--jobs`` runners at a time on this machine, the next ones' kernels started
ahead (warm), and by default one runner per core plus more while cores are left idle."""

from __future__ import annotations

import atexit
import collections
import dataclasses
import subprocess
import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Callable

from autograder.course.config import tool_env
from autograder.course.paths import HOME
from autograder.course.profile import checked_on, profile_named
from autograder.run import sandbox
from autograder.run.cgroups import usable_cores
from autograder.run.executors.base import Executor
from autograder.run.idle import Filler, IdleCores
from autograder.run.kernel import kernel_env
from autograder.run.process import RUNNERS, finish, launch
from autograder.run.zygote import Zygote
from autograder.run.zygote import usable as zygote_usable
from autograder.settings import Settings


class LocalPool(Executor):
    """``jobs`` runners at a time on this machine, and with ``settings.warm`` as many more started
    ahead.

    A warm runner is the runner of a job next in line: its kernel is started in the job's sandbox,
    torch imported and the guard installed while the jobs before it run, so that a job taken from
    the line begins at its first cell. Its limits per notebook count from there. A stopped run ends
    the warm runners with the others, their jobs not begun.

    Without ``settings.jobs`` (one job per core), a job runs beyond them while a core is left idle
    (:mod:`autograder.run.idle`): the jobs running wait, for a sleep or for processes they
    started, and the next one fills the core, up to twice as many jobs in all. ``settings.jobs``
    is a limit the instructor chose (memory, a shared machine): then there are never more.
    """

    def __init__(self, settings: Settings, runners=RUNNERS):
        self.settings, self.runners = settings, runners
        self.zygote = (
            None if no_zygote(settings) else _EARLY.pop() if _EARLY else new_zygote(settings)
        )
        if self.zygote is not None:
            self.zygote.start()  # its imports (torch's 2 s) run while the grader sets the run up
        self.jobs = self.local_cores = max(1, settings.jobs or usable_cores())
        self.ahead = self.jobs if settings.warm else 0
        self.line: collections.deque[tuple[Path, Future]] = collections.deque()
        self.warm: dict[Path, subprocess.Popen] = {}
        self.changed = threading.Condition()
        self.closing = False
        gauge = None if settings.jobs else IdleCores()
        self.extra = self.jobs if gauge is not None and gauge.readable else 0
        self.admitted = self.filling = 0  # jobs let beyond one per core: not yet begun, running
        self.closed = threading.Event()
        self.slots = [
            threading.Thread(target=self._slot, name=f"grading-slot-{n}", daemon=True)
            for n in range(self.jobs)
        ] + [
            threading.Thread(target=self._slot, args=(True,), name=f"filler-{n}", daemon=True)
            for n in range(self.extra)
        ]
        if self.extra:
            self.slots.append(
                threading.Thread(target=self._fill, args=(gauge,), name="filler", daemon=True)
            )
        for slot in self.slots:
            slot.start()
        self.description = (
            f"this machine, {self.jobs} at a time"
            + (", kernels started ahead" if self.ahead else "")
            + (", runners and kernels forked from a zygote" if self.zygote else "")
        )

    def submit(self, job_file: Path) -> Future:
        future: Future = Future()
        with self.changed:
            if self.closing:
                raise RuntimeError("the pool is closed")
            self.line.append((job_file, future))
            self._warm_ahead()  # a job handed over while every slot is busy starts warm now
            # every slot: one woken alone might be a filler's, not let take it, and wait again
            self.changed.notify_all()
        return future

    def _warm_ahead(self) -> None:
        """Start the runners of the next jobs in line, up to ``ahead`` (with ``changed`` held)."""
        for waiting, _ in list(self.line)[: self.ahead]:
            if len(self.warm) >= self.ahead:
                break
            if waiting not in self.warm:
                try:
                    started = launch(waiting, self.runners, warm=True, zygote=self.zygote)
                except OSError:  # it starts when its turn comes, and says then what fails
                    started = None
                if started is not None:
                    self.warm[waiting] = started

    def _fill(self, gauge: IdleCores) -> None:
        """Four times a second: let a job begin beyond one per core when :class:`Filler` says."""
        filler = Filler(self.extra)
        while not self.closed.wait(0.25):
            idle = gauge.sample()
            with self.changed:
                if not self.line:  # the slots took the job it let begin
                    self.admitted = 0
                if filler.admit(idle, bool(self.line), self.admitted + self.filling):
                    self.admitted += 1
                    self.changed.notify_all()

    def _slot(self, filler: bool = False) -> None:
        """Take the next job in line and run it, until the line is closed and empty. A filler's
        slot takes one only when :meth:`_fill` let it."""
        while True:
            with self.changed:
                while not self.closing and not (self.line and (self.admitted or not filler)):
                    self.changed.wait()
                if not self.line or (filler and not self.admitted):
                    return
                if filler:
                    self.admitted -= 1
                    self.filling += 1
                job_file, future = self.line.popleft()
                process = self.warm.pop(job_file, None)
                taken = future.set_running_or_notify_cancel()  # False: cancelled while in line
                if taken:
                    self._warm_ahead()
            try:
                self._run(job_file, future, process, taken)
            finally:
                if filler:
                    with self.changed:
                        self.filling -= 1

    def _run(self, job_file: Path, future: Future, process, taken: bool) -> None:
        if not taken:
            finish(process, job_file, self.settings, self.runners, go=False)
            return
        try:
            finish(
                process or launch(job_file, self.runners, zygote=self.zygote),
                job_file,
                self.settings,
                self.runners,
            )
        except BaseException as error:  # noqa: BLE001 - the future carries it
            future.set_exception(error)
        else:
            future.set_result(None)

    def stop(self) -> None:
        self.runners.stop()
        self.closed.set()
        with self.changed:
            self.closing = True
            for _, future in self.line:
                future.cancel()
            self.line.clear()
            warm, self.warm = list(self.warm.items()), {}
            self.changed.notify_all()
        for job_file, process in warm:  # ended by runners.stop(): reaped here
            finish(process, job_file, self.settings, self.runners, go=False)
        for slot in self.slots:
            slot.join()

    def close(self) -> None:
        self.closed.set()
        with self.changed:
            self.closing = True
            self.changed.notify_all()
        for slot in self.slots:
            slot.join()
        if self.zygote is not None:
            self.zygote.close()


def no_zygote(settings: Settings) -> str:
    """Why runners and kernels start fresh here; "" where a zygote forks them
    (:mod:`autograder.run.zygote`)."""
    if not settings.zygote:
        return "--no-zygote"
    if not sandbox.isolation_of(settings).namespaces:
        return "the sandbox has no namespaces here"
    return zygote_usable()


def new_zygote(settings: Settings) -> Zygote:
    """A zygote with the kernel's environment as it is when its first runner starts (a runner's,
    started fresh then, would have that environment), importing what the course's kernels import."""
    return Zygote(
        lambda: kernel_env("/tmp/home", tool_env()),
        HOME,
        profile_named(settings.profile or "").kernel.packages,
    )


_EARLY: list[Zygote] = []  # started by start_zygote_early, taken by the run's LocalPool


def start_zygote_early(settings: Settings) -> bool:
    """Start the zygote of this run's local pool now, for the pool to take when it is made; whether
    one is starting.

    Its imports (torch's) then run beside the grader's own set-up instead of after it, so the first
    runner forks sooner, and a child of it names the devices a run checks (:func:`name_checked`),
    which the grader would otherwise import torch to name. Nothing for a
    Dask cluster, whose workers have their own, or where no zygote is used; a zygote no pool takes
    (the run stopped first) ends when the grader does.
    """
    if settings.on_cluster or no_zygote(settings) or _EARLY:
        return bool(_EARLY)
    zygote = new_zygote(settings)
    zygote.start()
    atexit.register(zygote.close)
    _EARLY.append(zygote)
    return True


def naming_checked(settings: Settings) -> Callable[[], Settings]:
    """:func:`name_checked` begun in a thread of its own; what it returns waits for its answer (or
    raises its error), so the caller works while the zygote imports."""
    answer: Future = Future()

    def ask() -> None:
        try:
            answer.set_result(name_checked(settings))
        except BaseException as error:  # noqa: BLE001 - raised to the caller that waits
            answer.set_exception(error)

    threading.Thread(target=ask, name="naming-devices", daemon=True).start()
    return answer.result


def name_checked(settings: Settings) -> Settings:
    """``settings`` with what its profile names of this machine (the devices every check runs on,
    and the machines the checks name that it cannot stand for) named once for the whole run.

    Where the zygote started early, a child of it names them: it has imported what the kernels
    import (torch, for a course whose checks run on devices), so the grader need not, and names the
    devices in the kernels' environment. Elsewhere, or where that child cannot, the profile names
    them here."""
    named = _EARLY[0].checked(settings.profile or "") if _EARLY else None
    devices, not_checked = named or checked_on(settings)
    return dataclasses.replace(settings, devices=devices, not_checked=not_checked)
