"""Where the cores' time went in one grading run, from its jobs' status files: who took the
processor time (the notebooks, the runners, the rest), kernel starts, jobs waiting, and the cores
left with no job, with when.

``benchmarks/grading_throughput.py`` prints it beside its ratio; :func:`profile` reads a work
folder after a run whose wall-clock start and end the caller measured.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from autograder.judge.reference import STUDENT as CANARY  # the solutions' jobs' folder
from autograder.prepare.status import Status
from autograder.record.state import StateError, read_state


@dataclass(frozen=True)
class Profile:
    """Core-seconds of one run: ``cores`` x ``wall_s``, split two ways. By whom the processor time
    was taken (``run_cpu_s``, the run's processes all together, when the caller measured it); and
    by whether a job held the cores: held, or with no job (three shares, split by when)."""

    cores: int
    wall_s: float
    jobs: int
    notebooks_s: float  # the students' notebooks' processor time, from their first cell
    canary_s: float  # the instructor's solutions' processor time (the references)
    kernel_starts_s: float  # the processor time the jobs' kernels took to start, ahead or not
    runners_s: float  # the runners' own processor time: nbclient, the limits' watch, their writes
    run_cpu_s: float | None  # every process of the run, kernels and grader included, or None
    starts_s: float  # kernel starts on a job's own time (a kernel not started ahead)
    # the jobs' time on a core that their kernels did not compute (output, sleeps), summed over
    # jobs: more than the cores' time where jobs outnumbered cores
    waiting_s: float
    idle_first_s: float  # before the first job began: the run's set-up
    idle_between_s: float  # fewer jobs than cores while jobs were still to begin
    idle_tail_s: float  # after the last job began: waiting for the slowest ones
    grader_s: float  # the grader's own process, per finished job (it shares the cores above)

    @property
    def capacity_s(self) -> float:
        return self.cores * self.wall_s

    def lines(self) -> list[str]:
        """The profile as the benchmark prints it: each share in core-seconds and of the whole."""

        def share(label: str, seconds: float) -> str:
            return (
                f"    {label}: {seconds:.1f} s ({100 * seconds / max(self.capacity_s, 1e-9):.0f}%)"
            )

        kernels_s = self.notebooks_s + self.canary_s
        # a core counts once however many jobs it had: more than one per core run while others wait
        held_s = self.capacity_s - self.idle_first_s - self.idle_between_s - self.idle_tail_s
        by_whom = [
            share("students' notebooks", self.notebooks_s),
            share("instructor's solutions (the canary)", self.canary_s),
            share("kernel starts, the guard's installation included", self.kernel_starts_s),
            share("the runners (nbclient, the limits' watch)", self.runners_s),
        ]
        if self.run_cpu_s is not None:
            rest = self.run_cpu_s - kernels_s - self.kernel_starts_s - self.runners_s
            by_whom += [
                share("the rest: the grader (nbgrader's release, autograde, feedback)", rest),
                share("no process computing", self.capacity_s - self.run_cpu_s),
            ]
        # what a change to the grader moves, whatever the notebooks' own speed on the day
        by_whom.append(
            share("in all, beyond the notebooks' and the canary's own", self.capacity_s - kernels_s)
        )
        return [
            f"{self.cores} cores x {self.wall_s:.1f} s = {self.capacity_s:.1f} core-seconds,"
            f" {self.jobs} jobs",
            "  processor time, by whom:",
            *by_whom,
            "  the cores' time, by whether a job held them:",
            share("held by a job (computing, starting its kernel, or waiting)", held_s),
            share("of it, kernel starts on a job's own time", self.starts_s),
            share("no job: before the first job began (set-up)", self.idle_first_s),
            share("no job: between jobs (fewer jobs than cores)", self.idle_between_s),
            share("no job: after the last job began (the slowest ones)", self.idle_tail_s),
            f"  (the grader's own process, per finished job: {self.grader_s:.1f} s)",
        ]


def profile(
    workdir: Path, began_at: float, ended_at: float, cores: int, run_cpu_s: float | None = None
) -> Profile:
    """The profile of the run in ``workdir`` that began and ended at these wall-clock times
    (seconds since the epoch) on ``cores`` cores, its processes having taken ``run_cpu_s`` of
    processor time all together where the caller measured it. A job holds a core from its runner's
    start (from its first cell where its kernel was started ahead) to its end; a status written by
    an older grader, without times, or by an earlier run, holds none."""
    timed = []
    for path in sorted(Path(workdir).rglob("status.json")):
        status = Status.read(path)
        if began_at <= status.ended_at <= ended_at:
            timed.append((CANARY in path.parts, status))
    spans = [(s.began_at if not s.warm else s.cells_at or s.began_at, s.ended_at) for _, s in timed]
    first, between, tail = _idle(spans, began_at, ended_at, cores)
    cold_starts = sum(s.start_s or 0 for _, s in timed if not s.warm)
    held = sum(end - start for start, end in spans)
    cpu = sum(s.cpu_s for _, s in timed)
    try:
        state = read_state(Path(workdir))
    except StateError:
        state = None
    last_run = state.last_run if state is not None else {}
    return Profile(
        cores=cores,
        wall_s=ended_at - began_at,
        jobs=len(timed),
        notebooks_s=sum(s.cpu_s for canary, s in timed if not canary),
        canary_s=sum(s.cpu_s for canary, s in timed if canary),
        kernel_starts_s=sum(s.start_cpu_s for _, s in timed),
        runners_s=sum(s.runner_cpu_s for _, s in timed),
        run_cpu_s=run_cpu_s,
        starts_s=cold_starts,
        waiting_s=max(0.0, held - cpu - cold_starts),
        idle_first_s=first,
        idle_between_s=between,
        idle_tail_s=tail,
        grader_s=float(last_run.get("grader_s") or 0)
        + float(last_run.get("feedback_apart_s") or 0),
    )


def _idle(spans: list[tuple[float, float]], began_at: float, ended_at: float, cores: int):
    """Core-seconds with no job, before the first job began, until the last began, and after."""
    if not spans:
        return cores * (ended_at - began_at), 0.0, 0.0
    first_start, last_start = min(s for s, _ in spans), max(s for s, _ in spans)
    events = sorted({began_at, ended_at, *(t for span in spans for t in span)})
    idle = [0.0, 0.0, 0.0]
    for left, right in zip(events, events[1:]):
        left, right = max(left, began_at), min(right, ended_at)
        if right <= left:
            continue
        running = sum(1 for start, end in spans if start <= left and end >= right)
        part = 0 if right <= first_start else 1 if right <= last_start else 2
        idle[part] += max(0, cores - running) * (right - left)
    return idle[0], idle[1], idle[2]
