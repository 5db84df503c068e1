"""The demo class: a few students whose submissions ``make grade`` grades, each a policy for filling
the answer cells of the student versions in ``course/`` (:mod:`.roster`): the instructor's solution,
nothing, or answers with the mistakes students really make. :func:`build` writes them under
``demo_class/submitted/<student>/<assignment>/`` (``autograder demo``, after a notebook changed); a
test rebuilds them and fails on any difference, another grades them and compares with
``expected_scores.csv``.
"""

from __future__ import annotations

import csv
import shutil
from datetime import datetime, timedelta
from pathlib import Path

import nbformat

from devcourse.instructor.forger import forged
from devcourse.instructor.roster import FORGED, LATE_HOURS, ROSTER, SOLUTION, STUB, TAMPER
from autograder.settings import score_text
from devcourse.instructor.paths import (
    COURSE,
    DEMO_CLASS,
    EXPECTED_SCORES,
    assignments,
    demo_due,
    solution_path,
)

SUBMITTED = DEMO_CLASS


def unexpected_scores(results) -> list[str]:
    """Each grading result whose score is not the one ``expected_scores.csv`` holds, as a line that
    says both.

    Scores are compared as the report writes them (``8/8``, ``withheld/10``, empty where nothing was
    graded).
    """
    with EXPECTED_SCORES.open() as handle:
        expected = {(r["student"], r["assignment"]): r["score"] for r in csv.DictReader(handle)}
    return [
        f"{r.student} / {r.assignment}: got {score_text(r) or 'nothing'}, "
        f"expected {expected.get((r.student, r.assignment)) or 'nothing'}"
        for r in results
        if score_text(r) != expected.get((r.student, r.assignment))
    ]


def _solutions(name: str) -> dict[str, str]:
    """grade_id -> the instructor's answer, with nbgrader's markers removed."""
    answers = {}
    for cell in nbformat.read(solution_path(name), as_version=4).cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution"):
            lines = [
                line
                for line in cell.source.splitlines()
                if line.strip() not in ("### BEGIN SOLUTION", "### END SOLUTION")
            ]
            answers[meta["grade_id"]] = "\n".join(lines)
    return answers


def build(into: Path = SUBMITTED) -> list[Path]:
    """Write every demo submission below ``into``; return the files written."""
    if into.exists():
        shutil.rmtree(into)
    written = []
    known = set(assignments())
    due = demo_due()
    for student, handed_in in sorted(ROSTER.items()):
        for name, policy in sorted(handed_in.items()):
            if name not in known:
                raise ValueError(
                    f"the roster names {name!r} for {student}, but there is no such assignment"
                )
            nb = nbformat.read(COURSE / name / f"{name}.ipynb", as_version=4)
            solutions = _solutions(name)
            for cell in nb.cells:
                meta = cell.metadata.get("nbgrader", {})
                if not meta.get("solution"):
                    continue
                choice = policy.get(meta["grade_id"], policy.get("*", STUB))
                if choice == SOLUTION:
                    cell.source = solutions[meta["grade_id"]]
                elif choice == FORGED and cell.cell_type == "code":
                    cell.source = forged(solutions[meta["grade_id"]])
                elif choice == FORGED:
                    continue  # a written answer: the forger writes nothing
                elif choice != STUB:
                    cell.source = choice
            target = into / student / name / f"{name}.ipynb"
            target.parent.mkdir(parents=True, exist_ok=True)
            tampered = TAMPER.get((student, name), lambda n: n)(nb)
            if isinstance(tampered, str):
                target.write_text(tampered)
            else:
                nbformat.write(tampered, target)
            written.append(target)
            handed_in_at = datetime.strptime(due[name], "%Y-%m-%d %H:%M:%S UTC") + timedelta(
                hours=LATE_HOURS.get((student, name), -1)
            )
            # As nbgrader submit writes it, and collect keeps it: the late penalty counts from it.
            (target.parent / "timestamp.txt").write_text(
                handed_in_at.strftime("%Y-%m-%d %H:%M:%S.%f UTC")
            )
            written.append(target.parent / "timestamp.txt")
    return written
