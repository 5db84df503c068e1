"""Real device mistakes, graded by the real grader: each loses points on its exercise, each other
fix keeps them.

``tests/mistakes/catalog.py`` holds mistakes that people made in public
issue trackers, each written into one answer cell of the course, and, for
some, another correct answer. This test writes them into copies of the
solution notebooks, hands them to ``autograder.cli.grade`` as a class of
students, and reads each test cell's score from nbgrader's gradebook.

To keep the run short, one notebook carries several entries of one
assignment: never two on the same answer cell, and never one whose cell or
tests use what another entry's cell defines (``plan_rounds`` of
``tests/mistakes/check_catalog.py``, which also checks the catalog's rules).
Every test cell belongs to the exercise whose answer cell comes before it,
so each entry is judged on its own exercise's tests only.

``make test`` grades the first two rounds of each assignment (the first holds
mistakes only, the second the first correct fixes); ``make mistakes`` grades all
of them (``COURSE_MISTAKE_ROUNDS=all``).

Bars: at least 95% of the mistakes lose points on their exercise, and every
fix keeps all of them.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import nbformat
import pytest

from autograder.cli import grade
from devcourse.instructor.paths import ROOT, solution_path

MISTAKE_BAR = 0.95
ROUNDS = os.environ.get("COURSE_MISTAKE_ROUNDS", "2")  # a number, or "all"
# test_grade's: with the same limits, one run's canary makes the references both use
CELL_TIMEOUT_S = 45


def _checker():
    """tests/mistakes/check_catalog.py as a module: the catalog, its rules and the cell helpers."""
    spec = importlib.util.spec_from_file_location(
        "check_catalog", ROOT / "tests" / "mistakes" / "check_catalog.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


checker = _checker()


def plan(entries, rounds: str = "all") -> dict[tuple[str, str], list[dict]]:
    """(student, assignment) -> entries as check_catalog's items, grouped by its ``plan_rounds``.

    ``rounds`` keeps the first N rounds of each assignment only (``"all"``: every round).
    """
    items: dict[str, list[dict]] = {}
    for entry in entries:
        for kind, text in (("mistake", entry.code), ("fix", entry.fix)):
            if text is not None:
                items.setdefault(entry.assignment, []).append(
                    {"id": entry.id, "kind": kind, "answer": entry.answer, "text": text}
                )
    planned = {}
    for assignment, assignment_items in items.items():
        grouped = checker.plan_rounds(assignment_items, checker.read_notebook(assignment))
        for number, round_ in enumerate(
            grouped if rounds == "all" else grouped[: int(rounds)], start=1
        ):
            planned[(f"round{number}", assignment)] = round_
    return planned


def exercise_tests(assignment: str, answer: str) -> list[str]:
    """The grade_ids of the test cells after answer cell ``answer``, up to the next answer cell."""
    nb = checker.read_notebook(assignment)
    return [
        checker.nbgrader(nb["cells"][i])["grade_id"]
        for i in checker.test_cells(nb, checker.answer_cells(nb)[answer])
    ]


def write_submissions(rounds, folder: Path) -> None:
    for (student, assignment), items in rounds.items():
        nb = nbformat.read(solution_path(assignment), as_version=4)
        by_answer = {
            checker.nbgrader(c).get("grade_id"): c
            for c in nb.cells
            if checker.nbgrader(c).get("solution")
        }
        for item in items:
            cell = by_answer[item["answer"]]
            cell.source = item["text"]
            cell.outputs, cell.execution_count = [], None
        target = folder / student / assignment / f"{assignment}.ipynb"
        target.parent.mkdir(parents=True)
        nbformat.write(nb, target)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Grade every round through the command line, as an instructor would; return each entry's
    verdict."""
    rounds = plan(checker.load_catalog().MISTAKES, ROUNDS)
    tmp = tmp_path_factory.mktemp("mistakes")
    write_submissions(rounds, tmp / "submitted")
    workdir = tmp / "work"
    assert (
        grade.main(
            [
                "--submitted",
                str(tmp / "submitted"),
                "--workdir",
                str(workdir),
                "--quiet",
                "--no-feedback",
                "--cell-timeout",
                str(CELL_TIMEOUT_S),
            ]
        )
        == 0
    )

    from nbgrader.api import Gradebook

    verdicts = {}
    with Gradebook(f"sqlite:///{workdir / 'gradebook.db'}") as gradebook:
        for (student, assignment), items in rounds.items():
            for item in items:
                scores = [
                    gradebook.find_grade(test, assignment, assignment, student)
                    for test in exercise_tests(assignment, item["answer"])
                ]
                verdicts[item["kind"], item["id"]] = (
                    sum(g.score for g in scores),
                    sum(g.max_score for g in scores),
                    student,
                )
    return verdicts


def test_the_catalog_keeps_its_rules():
    catalog = checker.load_catalog()
    assert not checker.static_problems(catalog)
    assert len(catalog.MISTAKES) >= 30
    assert all(exercise_tests(e.assignment, e.answer) for e in catalog.MISTAKES), (
        "every entry's exercise has tests"
    )


def test_mistakes_lose_points_on_their_exercise(graded):
    mistakes = sorted(i for kind, i in graded if kind == "mistake")
    assert len(mistakes) >= 25, f"only {len(mistakes)} mistakes graded"
    kept = [
        (m, graded["mistake", m])
        for m in mistakes
        if graded["mistake", m][0] == graded["mistake", m][1]
    ]
    caught = 1 - len(kept) / len(mistakes)
    assert caught >= MISTAKE_BAR, (
        f"{caught:.0%} of the mistakes lose points; full marks despite the mistake: {kept}"
    )


def test_correct_fixes_keep_every_point(graded):
    fixes = sorted(i for kind, i in graded if kind == "fix")
    assert len(fixes) >= 15, f"only {len(fixes)} fixes graded"
    lost = [(f, graded["fix", f]) for f in fixes if graded["fix", f][0] != graded["fix", f][1]]
    assert not lost, f"correct fixes that lost points (score, max, student): {lost}"
