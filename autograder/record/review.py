"""Review a withheld score: release it (graded as it ran) or confirm it (0 points).

The grader withholds the score of a notebook whose code reaches into the
grading machinery (:mod:`autograder.prepare.scan`): the table and ``scores.csv`` say
"withheld" and the note names the lines. After reading them, the instructor
decides, for one ``STUDENT/ASSIGNMENT`` of the last run in the work folder:

* ``--release``: each test is judged from how the notebook ran, as if
  nothing had been found (it is not run again: its executed copy and what
  its probes recorded are in the job's folder, the reference in the work
  folder), the gradebook gets those scores, and ``scores.csv`` shows them;
* ``--confirm``: the score stays 0 and ``scores.csv`` says so.

Either way ``state.json`` in the work folder records the decision.

Run ``python -m autograder.record.review STUDENT/ASSIGNMENT --release`` (or
``--confirm``) from the repository root, with the same ``--workdir`` and
``--db-url`` as the grading run.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path

import nbformat

from autograder.course.config import config_of
from autograder.course.paths import WORKDIR
from autograder.judge.reference import reference_of
from autograder.judge.verdict import judge
from autograder.prepare.job import Job
from autograder.record.gradebook import (
    EXECUTED,
    GradebookLock,
    failure_of,
    gradebook_url,
    grading_environment,
    nbgrader_api,
)
from autograder.record.marks import mark_review
from autograder.record.state import STATE, replay_journal, write_state
from autograder.settings import Settings


class ReviewError(Exception):
    """A review that cannot be done; the message says why."""


def _state(workdir: Path) -> dict:
    try:
        state = json.loads((workdir / STATE).read_text())
    except (OSError, ValueError) as error:
        raise ReviewError(f"no grading run in {workdir} ({error})") from None
    if isinstance(state, dict):  # a run stopped outright: what it withheld since state.json was written
        replay_journal(workdir, state)
    return state


def release(workdir: Path, student: str, assignment: str, db_url: str) -> float:
    """Judge the pair's tests without the scan's findings, record the scores; return the new score."""
    from nbgrader.api import Gradebook

    state = _state(workdir)
    pair = f"{student}/{assignment}"
    if pair not in state.get("withheld", {}):
        raise ReviewError(f"{pair} has no withheld score in {workdir}")
    for notebook in state["withheld"][pair]:
        folder = workdir / "jobs" / student / assignment / notebook
        reference = reference_of(workdir, assignment, notebook)
        if not (folder / "verdict.json").is_file() or reference is None:
            raise ReviewError(f"the job folder of {pair}/{notebook} or its reference is gone; grade it again")
        job = Job(student, assignment, notebook, folder, findings=[])
        source = nbformat.read(workdir / "source" / assignment / f"{notebook}.ipynb", as_version=4)
        nbformat.write(judge(job, source, reference), workdir / EXECUTED / student / assignment / f"{notebook}.ipynb")
    with grading_environment(), GradebookLock(db_url) as lock, lock.held():
        outcome = nbgrader_api(workdir, db_url).autograde(assignment, student, force=True, create=True)
    if not outcome["success"]:
        raise ReviewError(f"nbgrader could not grade {pair}: " + failure_of(outcome))
    with Gradebook(db_url, config_of(workdir).CourseDirectory.course_id) as gradebook:
        score = gradebook.find_submission(assignment, student).score
    _decide(workdir, state, pair, "released", f"{score:g}", "withheld, then released after review", db_url)
    return score


def confirm(workdir: Path, student: str, assignment: str, db_url: str) -> None:
    """Keep the withheld score at 0 and record the decision."""
    state = _state(workdir)
    pair = f"{student}/{assignment}"
    if pair not in state.get("withheld", {}):
        raise ReviewError(f"{pair} has no withheld score in {workdir}")
    _decide(workdir, state, pair, "confirmed", "0", "withheld, confirmed after review: 0 points", db_url)


def _decide(workdir: Path, state: dict, pair: str, decision: str, score: str, note: str, db_url: str) -> None:
    """Record the decision in state.json, scores.csv and the gradebook (formgrader no longer lists it as to grade)."""
    student, assignment = pair.split("/", 1)
    with grading_environment(), GradebookLock(db_url) as lock, lock.held():
        mark_review(db_url, config_of(workdir).CourseDirectory.course_id, (student, assignment),
                    {notebook: f"Score {note}." for notebook in state["withheld"][pair]}, needs_manual_grade=False)
    state.setdefault("reviewed", {})[pair] = decision
    state["withheld"].pop(pair)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder.record.review", description=__doc__.split("\n\n")[0])
    parser.add_argument("pair", metavar="STUDENT/ASSIGNMENT")
    decision = parser.add_mutually_exclusive_group(required=True)
    decision.add_argument("--release", action="store_true", help="grade it as it ran")
    decision.add_argument("--confirm", action="store_true", help="keep 0 points")
    parser.add_argument("--workdir", type=Path, default=WORKDIR,
                        help="the grading run's work folder (default: build/grade)")
    parser.add_argument("--db-url", default=None, help="the gradebook the run used (default: as autograder.cli.grade)")
    args = parser.parse_args(argv)
    student, _, assignment = args.pair.partition("/")
    if not student or not assignment:
        parser.error("name the submission as STUDENT/ASSIGNMENT")
    workdir = args.workdir.resolve()
    try:
        db_url = gradebook_url(Settings(db_url=args.db_url), workdir)
        if args.release:
            score = release(workdir, student, assignment, db_url)
            print(f"{args.pair}: released, {score:g} points")
        else:
            confirm(workdir, student, assignment, db_url)
            print(f"{args.pair}: confirmed, 0 points")
    except ReviewError as error:
        print(f"review: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
