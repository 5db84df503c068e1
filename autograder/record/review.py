"""Review a withheld score: release it (graded as it ran) or confirm it (0 points).

The grader withholds the score of a notebook whose code reaches into the grading machinery
(:mod:`autograder.prepare.scan`). ``python -m autograder review STUDENT/ASSIGNMENT --release`` (or
``--confirm``), with the grading run's ``--workdir`` and ``--db-url``, decides for one pair of the
last run; ``state.json`` in the work folder records the decision.
"""

from __future__ import annotations

import csv
from pathlib import Path

import nbformat

from autograder.course.config import course_directory
from autograder.judge.reference import reference_of
from autograder.judge.verdict import judge
from autograder.prepare.job import Job
from autograder.record.gradebook import (
    EXECUTED,
    GradebookLock,
    failure_of,
    grading_environment,
    nbgrader_api,
)
from autograder.record.marks import mark_review
from autograder.record.state import STATE, StateError, WorkState, read_state, write_state
from autograder.settings import Pair


class ReviewError(Exception):
    """A review that cannot be done; the message says why."""


def _state(workdir: Path) -> WorkState:
    """The work folder's state, with what a run stopped outright withheld since state.json was
    written."""
    try:
        state = read_state(workdir)
    except StateError as error:
        raise ReviewError(str(error)) from None
    if state is None:
        raise ReviewError(f"no grading run in {workdir} (no {STATE})")
    return state


def release(workdir: Path, student: str, assignment: str, db_url: str) -> float:
    """Judge the pair's tests without the scan's findings, record the scores; return the new score.

    The notebook is not run again: its executed copy and what its probes recorded are in the job's
    folder, the reference in the work folder. The gradebook and ``scores.csv`` get the scores.
    """
    from nbgrader.api import Gradebook

    state = _state(workdir)
    pair = Pair(student, assignment).key
    if pair not in state.withheld:
        raise ReviewError(f"{pair} has no withheld score in {workdir}")
    for notebook in state.withheld[pair]:
        folder = workdir / "jobs" / student / assignment / notebook
        reference = reference_of(workdir, assignment, notebook)
        if not (folder / "verdict.json").is_file() or reference is None:
            raise ReviewError(
                f"the job folder of {pair}/{notebook} or its reference is gone; grade it again"
            )
        job = Job(student, assignment, notebook, folder, findings=[])
        source = nbformat.read(workdir / "source" / assignment / f"{notebook}.ipynb", as_version=4)
        nbformat.write(
            judge(job, source, reference),
            workdir / EXECUTED / student / assignment / f"{notebook}.ipynb",
        )
    with grading_environment(), GradebookLock(db_url) as lock, lock.held():
        outcome = nbgrader_api(workdir, db_url).autograde(
            assignment, student, force=True, create=True
        )
    if not outcome["success"]:
        raise ReviewError(f"nbgrader could not grade {pair}: " + failure_of(outcome))
    with Gradebook(db_url, course_directory(workdir).course_id) as gradebook:
        score = gradebook.find_submission(assignment, student).score
    _decide(
        workdir,
        state,
        pair,
        "released",
        f"{score:g}",
        "withheld, then released after review",
        db_url,
    )
    return score


def confirm(workdir: Path, student: str, assignment: str, db_url: str) -> None:
    """Keep the withheld score at 0 and record the decision (``scores.csv`` says so)."""
    state = _state(workdir)
    pair = Pair(student, assignment).key
    if pair not in state.withheld:
        raise ReviewError(f"{pair} has no withheld score in {workdir}")
    _decide(
        workdir, state, pair, "confirmed", "0", "withheld, confirmed after review: 0 points", db_url
    )


def _decide(
    workdir: Path, state: WorkState, pair: str, decision: str, score: str, note: str, db_url: str
) -> None:
    """Record the decision in state.json, scores.csv and the gradebook (formgrader no longer lists
    it as to grade)."""
    student, assignment = Pair.of_key(pair)
    with grading_environment(), GradebookLock(db_url) as lock, lock.held():
        mark_review(
            db_url,
            course_directory(workdir).course_id,
            (student, assignment),
            {notebook: f"Score {note}." for notebook in state.withheld[pair]},
            needs_manual_grade=False,
        )
    state.reviewed[pair] = decision
    state.withheld.pop(pair)
    write_state(workdir, state)
    path = workdir / "scores.csv"
    if not path.exists():
        return
    with path.open(newline="") as handle:
        rows = list(csv.DictReader(handle))
    for row in rows:
        if (row["student"], row["assignment"]) == (student, assignment):
            row["score"], row["note"] = score, note
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
