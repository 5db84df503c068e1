"""What a grading run is given and what it gives back: defaults, :class:`Settings`, :class:`Result`;
and :func:`fields_of`, which reads any of the grader's values written as JSON (a job file, a status,
the state)."""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import NamedTuple

CELL_TIMEOUT_S = 60.0

TIME_LIMIT_S = 600.0

# The limits above count processor time (a busy machine slows a cell, not its count); wall time is
# allowed this many times as much, for code that waits and so uses none.
WALL_PER_PROCESSOR_S = 4

MEMORY_LIMIT_MIB = 4096

GRADEBOOK_ENV = "COURSE_GRADEBOOK_URL"

# all a submission writes, its working copy, /tmp and /dev/shm together (a tmpfs of this size)
DISK_LIMIT_MIB = 2048

# processes and threads of one submission together (the course needs fewer than 100)
MAX_PROCESSES = 1024

# Per notebook: one past a limit gets 0 points, with a note naming it; every other notebook is
# graded as before.
MAX_CODE_CELLS = 500  # code cells of a submitted notebook (the course's have fewer than 100)
MAX_NOTEBOOK_MIB = 32  # a submitted notebook's file
# what a notebook's probes record, all together (values sent whole up to 32 MiB each)
RECORDED_LIMIT_MIB = 256


class Pair(NamedTuple):
    """One submission: a student's hand-in of one assignment. A plain ``(student, assignment)``
    tuple compares and hashes equal to it; :attr:`key` is how the work folder's state and the
    grader's messages name it."""

    student: str
    assignment: str

    @property
    def key(self) -> str:
        """``student/assignment``."""
        return f"{self.student}/{self.assignment}"

    @classmethod
    def of_key(cls, key: str) -> Pair:
        student, _, assignment = key.partition("/")
        return cls(student, assignment)


def fields_of(cls: type, found: object, what: str) -> dict:
    """The fields of the dataclass ``cls`` in ``found``, read from JSON: keys another version wrote
    that this one does not know are passed over. ``ValueError``, its message to follow the file's
    name, where ``found`` is not an object (``what`` names what it should be), lacks a field without
    a default, or has a value of another type than its field's annotation names."""
    if not isinstance(found, dict):
        raise ValueError(f"holds a {type(found).__name__}, not {what}")
    declared = {f.name: f for f in fields(cls)}
    missing = sorted(
        name
        for name, f in declared.items()
        if name not in found and f.default is MISSING and f.default_factory is MISSING
    )
    if missing:
        raise ValueError(f"lacks {', '.join(missing)}: written by another version?")
    wrong = sorted(
        key
        for key, value in found.items()
        if key in declared and not _fits(value, declared[key].type)
    )
    if wrong:
        raise ValueError(f"has values of the wrong type ({', '.join(wrong)})")
    return {key: value for key, value in found.items() if key in declared}


_JSON_KINDS = {
    "str": (str,),
    "int": (int,),
    "float": (int, float),
    "bool": (bool,),
    "None": (type(None),),
    "dict": (dict,),
    "list": (list,),
}


def _fits(value: object, annotation: str) -> bool:
    """Whether a value read from JSON has a type that a field's annotation (as written: ``int |
    None``) names; a bool is no int here, though Python's bool is one."""
    allowed = tuple(kind for name in annotation.split(" | ") for kind in _JSON_KINDS[name])
    return isinstance(value, allowed) and not (isinstance(value, bool) and bool not in allowed)


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
    # the score waits for the instructor's review (python -m autograder review)
    withheld: bool = False


def score_text(result: Result) -> str:
    """A result's score as the CSV writes it (and ``expected_scores.csv`` holds it): ``withheld``,
    empty, or the number."""
    return "withheld" if result.withheld else "" if result.score is None else f"{result.score:g}"


@dataclass(frozen=True)
class Limits:
    """What one submission may use. A reference is kept per set of limits: the reference key hashes
    them all (:func:`autograder.judge.reference.reference_key`), so a new one here counts there
    without a word."""

    cell_timeout_s: float = CELL_TIMEOUT_S  # processor time per cell
    time_limit_s: float = TIME_LIMIT_S  # processor time per notebook
    memory_mib: int = MEMORY_LIMIT_MIB
    # all a submission writes, together (with namespaces; not with keep_work)
    disk_mib: int = DISK_LIMIT_MIB
    max_processes: int = MAX_PROCESSES  # processes and threads of a submission, together
    recorded_mib: int = RECORDED_LIMIT_MIB  # what a notebook's probes record, together


@dataclass
class Settings:
    # notebooks graded at once on this machine (None: one per core it may use)
    jobs: int | None = None
    limits: Limits = field(default_factory=Limits)
    db_url: str | None = None
    feedback: bool = True
    # the feedback pages made by a process of their own while the grader goes on
    # (autograder.record.feedback.FeedbackApart); None: where this machine has a core that neither
    # the jobs nor the grader keep busy (a cluster's grader)
    feedback_apart: bool | None = None
    progress: bool = True
    sandbox: bool = True
    # None: namespaces inside a user namespace unless the grader is root
    user_namespace: bool | None = None
    # what the kernel writes goes to the job's working copy, kept after grading
    keep_work: bool = False
    # the instructor's solution run first (the reference): of each "graded" assignment, or "all"
    canary: str = "graded"
    # run it even where a reference kept from an earlier run has the same key
    rerun_canary: bool = False
    # a folder of references several work folders share (None: $COURSE_REFERENCE_CACHE)
    reference_cache: str | None = None
    assignments: tuple[str, ...] = ()  # grade only these assignments (none named: all)
    students: tuple[str, ...] = ()  # grade only these students (none named: all)
    # grade the chosen submissions even if an earlier run graded them unchanged
    regrade: bool = False
    # due dates to record (None: a course's demo class's for it, else none)
    due: dict[str, str] | None = None
    # a Dask scheduler's address: jobs run on its workers (autograder.run.executors)
    scheduler: str | None = None
    dask_local: int = 0  # start a Dask cluster of this many workers on this machine for the run
    # the local pool starts the kernels of the next jobs in line while the current ones run
    warm: bool = True
    # the local pool forks runners and kernels from one process with torch imported (Linux, with
    # namespaces)
    zygote: bool = True
    gpu_jobs: bool = False  # on a Dask cluster, each job asks for the resource GPU=1
    # the course's grading profile, a CourseProfile's import string ("": the plain one; None: the
    # one the course's nbgrader_config.py names, autograder.course.profile)
    profile: str | None = None
    # what the profile names of this machine, once for the run: the devices every check runs on,
    # and the machines the checks name that it cannot stand for (None: the profile is asked where
    # they are needed, autograder.course.profile.checked_on)
    devices: str | None = None
    not_checked: tuple[str, ...] | None = None

    @classmethod
    def from_dict(cls, sent: dict) -> Settings:
        """Settings as :func:`dataclasses.asdict` sent them (to a cluster's worker)."""
        return cls(**{**sent, "limits": Limits(**sent["limits"])})

    @property
    def on_cluster(self) -> bool:
        """Jobs run on a Dask cluster (``--scheduler`` or ``--dask-local``), not the local pool."""
        return bool(self.scheduler or self.dask_local)
