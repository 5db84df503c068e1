"""What a grading run is given and what it gives back: defaults, :class:`Settings`, :class:`Result`."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone

from autograder import cgroups, sandbox
from autograder.pipeline import ROOT, assignments

DEMO_CLASS = ROOT / "autograder" / "demo_class" / "submitted"

WORKDIR = ROOT / "build" / "grade"

CELL_TIMEOUT_S = 60.0

TIME_LIMIT_S = 600.0

MEMORY_LIMIT_MIB = 4096

GRADEBOOK_ENV = "COURSE_GRADEBOOK_URL"

# The demo class's due dates (UTC), for its work folder's gradebook; one of its submissions is late.
# Weekly from 2026-09-07, 17:00 UTC.
DEMO_DUE = {name: (datetime(2026, 9, 7, 17, tzinfo=timezone.utc)
                   + timedelta(weeks=number)).strftime("%Y-%m-%d %H:%M:%S UTC")
            for number, name in enumerate(assignments())}


def usable_cores() -> int:
    """The cores this process may use: the default number of notebooks graded at once.

    Fewer than ``os.cpu_count()`` where the process is held to some of them: by its CPU affinity
    (a Slurm job's cores, ``taskset``; Linux) or by a CPU quota on its cgroup (a container's ``--cpus``,
    a Kubernetes pod's limit, :func:`autograder.cgroups.cpu_quota`), rounded up. At least 1.
    """
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cgroups.cpu_quota()
    if quota is not None:
        cores = min(cores, math.ceil(quota))
    return max(1, cores)


@dataclass(frozen=True)
class Result:
    """One student's result on one assignment. ``score`` is None when not graded."""

    student: str
    assignment: str
    score: float | None
    max_score: float
    note: str = ""
    devices: str = ""
    seconds: float = 0.0
    withheld: bool = False  # the score waits for the instructor's review (python -m autograder.review)


@dataclass
class Settings:
    jobs: int = field(default_factory=usable_cores)
    cell_timeout_s: float = CELL_TIMEOUT_S
    time_limit_s: float = TIME_LIMIT_S
    memory_mib: int = MEMORY_LIMIT_MIB
    disk_mib: int = sandbox.DISK_LIMIT_MIB  # all a submission writes, together (with namespaces; not with keep_work)
    max_processes: int = sandbox.MAX_PROCESSES  # processes and threads of a submission, together
    db_url: str | None = None
    feedback: bool = True
    # the feedback pages made by a process of their own while the grader goes on (autograder.feedback.FeedbackApart);
    # None: where this machine has a core that neither the jobs nor the grader keep busy (a cluster's grader)
    feedback_apart: bool | None = None
    progress: bool = True
    sandbox: bool = True
    user_namespace: bool | None = None  # None: namespaces inside a user namespace unless the grader is root
    keep_work: bool = False  # what the kernel writes goes to the job's working copy, kept after grading
    canary: str = "graded"  # the instructor's solution run first (the reference): of each "graded" assignment, or "all"
    rerun_canary: bool = False  # run it even where a reference kept from an earlier run has the same key
    # a folder of references several work folders share (None: $COURSE_REFERENCE_CACHE)
    reference_cache: str | None = None
    assignments: tuple[str, ...] = ()  # grade only these assignments (none named: all)
    students: tuple[str, ...] = ()  # grade only these students (none named: all)
    regrade: bool = False  # grade the chosen submissions even if an earlier run graded them unchanged
    due: dict[str, str] | None = None  # due dates to record (None: the demo class's for the demo class, else none)
    scheduler: str | None = None  # a Dask scheduler's address: jobs run on its workers (autograder.executors)
    dask_local: int = 0  # start a Dask cluster of this many workers on this machine for the run
    warm: bool = True  # the local pool starts the kernels of the next jobs in line while the current ones run
    # the local pool forks runners and kernels from one process with torch imported (Linux, with namespaces)
    zygote: bool = True
    gpu_jobs: bool = False  # on a Dask cluster, each job asks for the resource GPU=1

    @property
    def on_cluster(self) -> bool:
        """Jobs run on a Dask cluster (``--scheduler`` or ``--dask-local``), not the local pool."""
        return bool(self.scheduler or self.dask_local)

    def isolation(self) -> sandbox.Isolation:
        if not self.sandbox:
            return sandbox.Isolation(False, "switched off with --no-sandbox")
        return sandbox.probe(self.user_namespace)
