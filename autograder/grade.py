"""Autograde a class with nbgrader and print a score table (``make grade``).

By default it grades the demo class shipped in ``autograder/demo_class``.
Each run works in a fresh folder (``build/grade`` by default): the
instructor notebooks are copied in as nbgrader's source, the student
versions and the gradebook are made there, and the submissions are copied
in before grading, so nothing in the repository is written.

Run ``python -m autograder.grade --help`` from the repository root.
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import os
import shutil
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator
from unittest import mock

from autograder.pipeline import ROOT, SOLUTIONS, assignments, course_config, tool_env

DEMO_CLASS = ROOT / "autograder" / "demo_class" / "submitted"
WORKDIR = ROOT / "build" / "grade"


@dataclass(frozen=True)
class Result:
    """One student's result on one assignment. ``score`` is None when not graded."""

    student: str
    assignment: str
    score: float | None
    max_score: float
    note: str = ""


def _api(workdir: Path):
    from nbgrader.apps import NbGraderAPI
    from traitlets.config import Config

    config = course_config()
    overrides = Config()
    overrides.CourseDirectory.root = str(workdir)
    overrides.CourseDirectory.source_directory = "source"
    overrides.CourseDirectory.release_directory = "release"
    overrides.CourseDirectory.db_url = f"sqlite:///{workdir / 'gradebook.db'}"
    config.merge(overrides)
    return NbGraderAPI(config=config)


def _last_line(text: str) -> str:
    lines = [line for line in (text or "").strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "unknown error"


def grade(submitted: Path = DEMO_CLASS, workdir: Path = WORKDIR) -> list[Result]:
    """Autograde every ``submitted/<student>/<assignment>/`` folder; return one Result per pair.

    A student who handed nothing in for an assignment gets ``score=None``
    and a note; a submission nbgrader cannot grade gets a note with the
    reason, and the batch goes on.
    """
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    shutil.copytree(SOLUTIONS, workdir / "source")
    shutil.copytree(submitted, workdir / "submitted")
    with _grading_environment():
        return _grade_in(workdir)


@contextlib.contextmanager
def _grading_environment() -> Iterator[None]:
    """nbgrader runs ``alembic`` and kernels by name, and warns on every submission; both for this block only."""
    from sqlalchemy.exc import SAWarning

    with mock.patch.dict(os.environ, {"PATH": tool_env()["PATH"]}), warnings.catch_warnings():
        # nbgrader 0.9.6 with SQLAlchemy 2 warns about its own session use on every submission.
        warnings.filterwarnings("ignore", category=SAWarning)
        yield


def _grade_in(workdir: Path) -> list[Result]:
    from nbgrader.api import Gradebook, MissingEntry

    api = _api(workdir)

    names = assignments()
    for name in names:
        outcome = api.generate_assignment(name, force=True)
        if not outcome["success"]:
            raise RuntimeError(f"could not generate {name}:\n{outcome.get('error') or outcome.get('log')}")

    students = sorted(p.name for p in (workdir / "submitted").iterdir() if p.is_dir())
    notes: dict[tuple[str, str], str] = {}
    for student in students:
        for name in names:
            if not (workdir / "submitted" / student / name).is_dir():
                notes[student, name] = "not submitted"
                continue
            outcome = api.autograde(name, student, force=True, create=True)
            if not outcome["success"]:
                notes[student, name] = "not graded: " + _last_line(outcome.get("error") or outcome.get("log"))

    results = []
    with Gradebook(f"sqlite:///{workdir / 'gradebook.db'}") as gradebook:
        for student in students:
            for name in names:
                max_score = gradebook.find_assignment(name).max_score
                note = notes.get((student, name), "")
                score = None
                if not note:
                    try:
                        score = gradebook.find_submission(name, student).score
                    except MissingEntry:
                        note = "not graded: no submission in the gradebook"
                results.append(Result(student, name, score, max_score, note))
    return results


def format_table(results: list[Result]) -> str:
    """Students by assignment, ``score/max`` in each cell, then the total."""
    names = sorted({r.assignment for r in results})
    students = sorted({r.student for r in results})
    by_pair = {(r.student, r.assignment): r for r in results}
    header = ["student", *names, "total"]
    rows = []
    for student in students:
        cells, total, total_max = [student], 0.0, 0.0
        for name in names:
            result = by_pair[student, name]
            total_max += result.max_score
            if result.score is None:
                cells.append(f"-/{result.max_score:g}")
            else:
                total += result.score
                cells.append(f"{result.score:g}/{result.max_score:g}")
        cells.append(f"{total:g}/{total_max:g}")
        rows.append(cells)
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * width for width in widths))
    notes = [f"{r.student} / {r.assignment}: {r.note}" for r in results if r.note]
    if notes:
        lines += ["", "Notes:", *(f"  {note}" for note in notes)]
    return "\n".join(lines)


def write_csv(results: list[Result], path: Path) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["student", "assignment", "score", "max_score", "note"])
        for r in results:
            writer.writerow([r.student, r.assignment, "" if r.score is None else f"{r.score:g}", f"{r.max_score:g}", r.note])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder.grade", description=__doc__.split("\n\n")[0])
    parser.add_argument("--submitted", type=Path, default=DEMO_CLASS,
                        help="folder of <student>/<assignment>/ submissions (default: the demo class)")
    parser.add_argument("--workdir", type=Path, default=WORKDIR,
                        help="scratch folder for this run, emptied first (default: build/grade)")
    args = parser.parse_args(argv)
    if not args.submitted.is_dir():
        parser.error(f"no submissions folder at {args.submitted}")
    from devcourse.grading import device_matrix

    print("Grading on this machine's device matrix: " + ", ".join(str(d) for d in device_matrix("tensor")), flush=True)
    results = grade(args.submitted.resolve(), args.workdir.resolve())
    print(format_table(results))
    write_csv(results, args.workdir / "scores.csv")
    print(f"\nScores written to {args.workdir / 'scores.csv'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
