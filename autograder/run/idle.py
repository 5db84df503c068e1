"""Cores left idle while notebooks run, and when the local pool may start one notebook more.

A notebook that sleeps, or waits for processes it started (``torchrun``'s agents meeting), holds
its place in the pool without computing. :class:`IdleCores` reads how much of the cores this
process may use went unused (Linux's per-processor counts); :class:`Filler` decides from it when
:class:`autograder.run.executors.LocalPool` starts a job beyond its one per core. Where the count
cannot be read (not Linux, or a CPU quota whose share of the machine it does not show), nothing
is ever started beyond them.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from autograder.run.cgroups import cpu_quota

STAT = Path("/proc/stat")


class IdleCores:
    """How many of this process's cores were idle, on average, since the last :meth:`sample`."""

    def __init__(self, stat: Path = STAT, cpus: set[int] | None = None, quota: float | None = -1):
        self.stat = stat
        self.cpus = cpus if cpus is not None else _affinity()
        quota = cpu_quota() if quota == -1 else quota
        # a quota's share of the machine is not in /proc/stat, which counts every processor
        shown = bool(self.cpus) and (quota is None or quota >= len(self.cpus))
        self.last = self._read() if shown else None
        self.readable = self.last is not None

    def _read(self) -> tuple[float, float] | None:
        """(now, the processor time the cores have spent on anything but idling), in seconds."""
        busy = busy_s(self.cpus, self.stat)
        return None if busy is None else (time.monotonic(), busy)

    def sample(self) -> float | None:
        """Cores idle since the last sample (0 when all were busy), or None where it cannot say."""
        now = self._read() if self.readable else None
        if now is None or self.last is None or now[0] <= self.last[0]:
            return None
        (then, busy_before), (at, busy) = self.last, now
        self.last = now
        return max(0.0, len(self.cpus) - (busy - busy_before) / (at - then))


def busy_s(cpus: set[int] | None = None, stat: Path = STAT) -> float | None:
    """The processor time that processors ``cpus`` (every one where None) have spent on anything
    but idling since the machine started, in seconds; None where Linux's counts cannot be read."""
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return None
    busy = 0
    for line in lines:
        name, *fields = line.split()
        if (
            name.startswith("cpu")
            and name[3:].isdigit()
            and (cpus is None or int(name[3:]) in cpus)
        ):
            user, nice, system, _idle, _iowait, irq, softirq, steal = map(int, fields[:8])
            busy += user + nice + system + irq + softirq + steal
    return busy / os.sysconf("SC_CLK_TCK")


def _affinity() -> set[int]:
    return set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set()


class Filler:
    """When one job more may start: a core idle for ``ticks`` samples in a row, a job waiting in
    line, fewer than ``extra`` jobs already started so; then none for ``rest`` samples while it
    gets going."""

    def __init__(self, extra: int, ticks: int = 3, rest: int = 4, idle_at_least: float = 0.6):
        self.extra, self.ticks, self.rest, self.idle_at_least = extra, ticks, rest, idle_at_least
        self.streak = 0

    def admit(self, idle: float | None, waiting: bool, filling: int) -> bool:
        """Given the last sample's idle cores, whether a job waits, and how many jobs run beyond
        one per core: whether one more starts now."""
        self.streak = self.streak + 1 if idle is not None and idle >= self.idle_at_least else 0
        if self.streak < self.ticks or not waiting or filling >= self.extra:
            return False
        self.streak = -self.rest
        return True
