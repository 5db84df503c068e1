"""The local pool's filler: idle cores read from Linux's per-processor counts, and when one job more
may begin."""

import os
import time

import pytest

from autograder.run.idle import Filler, IdleCores

TICK = os.sysconf("SC_CLK_TCK")


def _stat(path, cpus: dict[int, int]) -> None:
    """A /proc/stat whose processors have spent ``cpus[n]`` ticks on user code and 5 on the rest
    (``nice`` to ``steal``), idle ticks apart."""
    total = sum(cpus.values())
    lines = [f"cpu  {total} 1 1 999 1 1 1 1 0 0"]
    lines += [f"cpu{n} {user} 1 1 999 1 1 1 1 0 0" for n, user in cpus.items()]
    path.write_text("\n".join([*lines, "intr 1 2 3", "ctxt 7"]) + "\n")


def test_idle_cores_counts_only_the_processors_this_process_may_use(tmp_path):
    stat = tmp_path / "stat"
    _stat(stat, {0: 0, 1: 0, 2: 0})
    gauge = IdleCores(stat, cpus={0, 1}, quota=None)
    assert gauge.readable
    time.sleep(0.2)
    elapsed = time.monotonic() - gauge.last[0]
    # cpu0 busy the whole time; cpu2, which this process may not use, busy too; cpu1 idle
    _stat(stat, {0: round(elapsed * TICK), 1: 0, 2: round(elapsed * TICK)})
    assert gauge.sample() == pytest.approx(1.0, abs=0.25)


def test_idle_cores_cannot_say_under_a_cpu_quota_or_without_the_counts(tmp_path):
    stat = tmp_path / "stat"
    _stat(stat, {0: 0, 1: 0})
    assert not IdleCores(stat, cpus={0, 1}, quota=1.5).readable, "a quota's share is not shown"
    assert IdleCores(stat, cpus={0, 1}, quota=2.0).readable
    missing = IdleCores(tmp_path / "absent", cpus={0, 1}, quota=None)
    assert not missing.readable and missing.sample() is None


def test_the_filler_lets_one_more_begin_after_a_core_was_idle_three_samples_then_rests():
    filler = Filler(extra=2)
    assert [filler.admit(1.0, True, 0) for _ in range(3)] == [False, False, True]
    # the one let in gets going: four samples with none more, then three idle again
    assert [filler.admit(1.0, True, 1) for _ in range(7)] == [False] * 6 + [True]
    assert not any(filler.admit(1.0, True, 2) for _ in range(10)), "never beyond extra"


def test_the_filler_lets_none_begin_while_the_cores_are_busy_or_nothing_waits():
    filler = Filler(extra=1)
    assert not any(filler.admit(idle, True, 0) for idle in (1.0, 1.0, 0.2, 1.0, 1.0, None, 1.0))
    assert not any(filler.admit(1.0, False, 0) for _ in range(5)), "no job in line"
