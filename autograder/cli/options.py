"""The options of ``autograder grade``, in groups: what is graded, the limits, where the scores go,
how the notebooks run, and where (this machine, or a Dask cluster). :mod:`autograder.cli.grade`
reads them."""

from __future__ import annotations

import argparse
from pathlib import Path

from autograder.course.paths import WORKDIR
from autograder.judge.reference import CACHE_ENV
from autograder.run.cgroups import usable_cores
from autograder.settings import (
    CELL_TIMEOUT_S,
    DISK_LIMIT_MIB,
    GRADEBOOK_ENV,
    MAX_PROCESSES,
    MEMORY_LIMIT_MIB,
    RECORDED_LIMIT_MIB,
    TIME_LIMIT_S,
    WALL_PER_PROCESSOR_S,
)

DESCRIPTION = "autograde a class, sandboxed, in parallel, with limits (make grade)."


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m autograder grade",
        description=DESCRIPTION,
        epilog="Writes report.txt, scores.csv, scores.png and feedback/ in the work folder.",
    )
    _what(parser)
    _limits(parser)
    _record(parser)
    _how(parser)
    _cluster(parser)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def _what(parser: argparse.ArgumentParser) -> None:
    """What is graded: whose submissions, of which assignments, where."""
    parser.add_argument(
        "--course",
        type=Path,
        metavar="DIR",
        help=(
            "an nbgrader course directory (nbgrader quickstart, or python -m autograder course"
            " init): grade what its submitted/ holds (nbgrader collect, zip_collect) into its"
            " gradebook; nothing in it is emptied"
        ),
    )
    parser.add_argument(
        "--submitted",
        type=Path,
        default=None,
        help=(
            "folder of <student>/<assignment>/ submissions, copied into the work folder's "
            "submitted/ first (default: the course's demo class, where its profile has one; "
            "none with --course)"
        ),
    )
    parser.add_argument(
        "--workdir",
        type=Path,
        default=WORKDIR,
        help=(
            "work folder without --course, emptied when the course or the submissions folder "
            "differ from its last run's (default: build/grade in the course's folder)"
        ),
    )
    parser.add_argument(
        "--assignment",
        action="append",
        default=[],
        metavar="NAME",
        help="grade only this assignment (repeatable; default: all)",
    )
    parser.add_argument(
        "--student",
        action="append",
        default=[],
        metavar="ID",
        help="grade only this student (repeatable; default: all)",
    )
    parser.add_argument(
        "--regrade",
        action="store_true",
        help=(
            "grade the chosen submissions again even if unchanged since an earlier run graded "
            "them (by default only new or changed submissions are graded)"
        ),
    )
    parser.add_argument(
        "--due",
        action="append",
        default=[],
        metavar="NAME=WHEN",
        help=(
            "record an assignment's due date first, e.g. ps1='2026-10-05 17:00 UTC' "
            "(repeatable; a demo class has its own)"
        ),
    )


def _limits(parser: argparse.ArgumentParser) -> None:
    """How much each submission may use."""
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help=(
            "notebooks graded at once, at most (default: one per core this process may use, here"
            f" {usable_cores()}, and more while some of them leave a core idle, waiting)"
        ),
    )
    parser.add_argument(
        "--cell-timeout",
        type=float,
        default=CELL_TIMEOUT_S,
        metavar="SECONDS",
        help=(
            "processor-time limit of one cell, all its processes together (default: %(default)g; "
            f"wall time: {WALL_PER_PROCESSOR_S}x as much)"
        ),
    )
    parser.add_argument(
        "--time-limit",
        type=float,
        default=TIME_LIMIT_S,
        metavar="SECONDS",
        help=(
            "processor-time limit of one notebook (default: %(default)g; wall time: "
            f"{WALL_PER_PROCESSOR_S}x as much)"
        ),
    )
    parser.add_argument(
        "--memory-limit-mib",
        type=int,
        default=MEMORY_LIMIT_MIB,
        metavar="MIB",
        help="memory limit of every process of a submission, 0 for none (default: %(default)s)",
    )
    parser.add_argument(
        "--disk-limit-mib",
        type=int,
        default=DISK_LIMIT_MIB,
        metavar="MIB",
        help=(
            "all that a submission writes, together, with namespaces (a tmpfs of this size, "
            "in memory), 0 for none (default: %(default)s)"
        ),
    )
    parser.add_argument(
        "--max-processes",
        type=int,
        default=MAX_PROCESSES,
        metavar="N",
        help=(
            "processes and threads of a submission, together, 0 for no limit (default: %(default)s)"
        ),
    )
    parser.add_argument(
        "--recorded-limit-mib",
        type=int,
        default=RECORDED_LIMIT_MIB,
        metavar="MIB",
        help=(
            "what the tests of one notebook record, together, when the grader runs them again; a "
            "notebook past it gets 0 points (default: %(default)s)"
        ),
    )


def _record(parser: argparse.ArgumentParser) -> None:
    """Where scores and feedback go."""
    parser.add_argument(
        "--db-url",
        default=None,
        help=(
            "gradebook URL, e.g. postgresql://user:password@host/db for several graders "
            f"(default: ${GRADEBOOK_ENV}, else SQLite in the work folder)"
        ),
    )
    parser.add_argument("--no-feedback", action="store_true", help="skip the feedback HTML")
    parser.add_argument(
        "--feedback-apart",
        choices=("auto", "yes", "no"),
        default="auto",
        help=(
            "make the feedback HTML in a process of its own while the grader goes on: yes, no, or "
            "auto (the default): where this machine has a core left over from the jobs and the "
            "grader, as a cluster's grader has"
        ),
    )


def _how(parser: argparse.ArgumentParser) -> None:
    """How the notebooks run: sandbox, references, warm starts."""
    parser.add_argument(
        "--no-sandbox",
        action="store_true",
        help="run kernels without namespaces (limits on time and memory still hold)",
    )
    parser.add_argument(
        "--canary",
        choices=("graded", "all"),
        default="graded",
        help=(
            "run the instructor's solution first, in the same sandbox, and stop unless it gets full"
            " marks (its run is the reference submissions are judged against): of each assignment"
            " that has submissions to grade, or of every assignment chosen (--assignment),"
            " submissions or not: run before the deadline, it makes the references the first"
            " grading then reuses (default: %(default)s); a reference kept from an earlier run is"
            " reused while the solution, the grader, Python's packages, the devices and the limits"
            " are the same"
        ),
    )
    parser.add_argument(
        "--rerun-canary",
        action="store_true",
        help="run the instructor's solution even where a kept reference could be reused",
    )
    parser.add_argument(
        "--reference-cache",
        metavar="DIR",
        default=None,
        help=(
            "also keep references in DIR, shared by several work folders on this machine "
            f"(default: ${CACHE_ENV} if set; the work folder keeps its own either way)"
        ),
    )
    parser.add_argument(
        "--keep-work",
        action="store_true",
        help=(
            "keep each submission's working copy (jobs/STUDENT/ASSIGNMENT/NOTEBOOK/work, with what"
            " its kernel wrote: the kernel writes there, not to a bounded tmpfs, so"
            " --disk-limit-mib does not hold) after grading; by default it is removed once the"
            " notebook is graded"
        ),
    )
    parser.add_argument(
        "--no-warm",
        action="store_true",
        help=(
            "start no kernel before its job's turn (by default, on this machine, the kernels of "
            "the next --jobs notebooks start in their sandboxes, the course's packages imported, "
            "while the current ones run: as many more kernels in memory, the start off each "
            "notebook's time)"
        ),
    )
    parser.add_argument(
        "--no-zygote",
        action="store_true",
        help=(
            "start every runner and kernel as a new Python (by default, on Linux with the sandbox's"
            " namespaces, they are forked from one process that has imported IPython and the"
            " course's packages once, so no kernel imports them itself)"
        ),
    )


def _cluster(parser: argparse.ArgumentParser) -> None:
    """Where the notebooks run: this machine, or a Dask cluster."""
    cluster = parser.add_mutually_exclusive_group()
    cluster.add_argument(
        "--scheduler",
        metavar="tcp://HOST:PORT",
        help=(
            "run the jobs on this Dask scheduler's workers (each in the same sandbox, on its "
            "machine; start workers with python -m autograder worker ADDRESS)"
        ),
    )
    cluster.add_argument(
        "--dask-local",
        type=int,
        default=0,
        metavar="N",
        help="start a Dask cluster of N worker processes on this machine for the run",
    )
    parser.add_argument(
        "--gpu-jobs",
        action="store_true",
        help=(
            "on a Dask cluster, each job asks for the resource GPU=1 (workers started with --gpu K)"
        ),
    )
