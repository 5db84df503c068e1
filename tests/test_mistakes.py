"""Real device mistakes, graded by the real grader: each loses points on its exercise, each other fix keeps them.

``tests/mistakes/catalog.py`` holds mistakes that people made in public
issue trackers, each written into one answer cell of the course, and, for
some, another correct answer. This test writes them into copies of the
solution notebooks, hands them to ``autograder.grade`` as a class of
students, and reads each test cell's score from nbgrader's gradebook.

To keep the run short, one notebook carries several entries of one
assignment, never two on the same answer cell: a student ``round1`` has the
first mistake or fix of each exercise, ``round2`` the second, and so on.
Every test cell belongs to the exercise whose answer cell comes before it,
so each entry is judged on its own exercise's tests only.

``make test`` grades the first two rounds (16 notebooks: 27 mistakes and 21
fixes, about 2 minutes on 2 CPUs); ``make mistakes`` grades all of them
(``COURSE_MISTAKE_ROUNDS=all``, 31 notebooks, about 4.5 minutes).

Bars: at least 95% of the mistakes lose points on their exercise, and every
fix keeps all of them.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections import defaultdict
from pathlib import Path

import nbformat
import pytest

from autograder import grade
from autograder.pipeline import ROOT, solution_path

CATALOG = ROOT / "tests" / "mistakes" / "catalog.py"
MISTAKE_BAR = 0.95
ROUNDS = os.environ.get("COURSE_MISTAKE_ROUNDS", "2")  # a number, or "all"


def _catalog():
    spec = importlib.util.spec_from_file_location("mistakes_catalog", CATALOG)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.MISTAKES


def _nbgrader(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def exercises_of(assignment: str) -> dict[str, list[str]]:
    """Answer grade_id -> the grade_ids of the test cells that follow it, up to the next answer cell."""
    tests: dict[str, list[str]] = defaultdict(list)
    answer = None
    for cell in nbformat.read(solution_path(assignment), as_version=4).cells:
        meta = _nbgrader(cell)
        if meta.get("solution") and meta.get("grade_id"):
            answer = meta["grade_id"]
        elif meta.get("grade") and answer is not None:
            tests[answer].append(meta["grade_id"])
    return dict(tests)


def plan(entries, rounds: str = "all") -> dict[tuple[str, str], list[tuple[str, object]]]:
    """(student, assignment) -> [(kind, entry)]: each round holds at most one entry per answer cell.

    ``rounds`` keeps the first N rounds only (``"all"``: every round).
    """
    planned: dict[tuple[str, str], list[tuple[str, object]]] = defaultdict(list)
    taken: dict[tuple[str, str, str], int] = defaultdict(int)  # (assignment, answer) -> next free round
    for entry in entries:
        for kind, code in (("mistake", entry.code), ("fix", entry.fix)):
            if code is None:
                continue
            key = (entry.assignment, entry.answer)
            taken[key] += 1
            if rounds == "all" or taken[key] <= int(rounds):
                planned[(f"round{taken[key]}", entry.assignment)].append((kind, entry))
    return dict(planned)


def write_submissions(rounds, folder: Path) -> None:
    for (student, assignment), items in rounds.items():
        nb = nbformat.read(solution_path(assignment), as_version=4)
        by_answer = {_nbgrader(c).get("grade_id"): c for c in nb.cells if _nbgrader(c).get("solution")}
        for kind, entry in items:
            cell = by_answer[entry.answer]
            cell.source = entry.code if kind == "mistake" else entry.fix
            cell.outputs, cell.execution_count = [], None
        target = folder / student / assignment / f"{assignment}.ipynb"
        target.parent.mkdir(parents=True)
        nbformat.write(nb, target)


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Grade every round through the command line, as an instructor would; return the per-entry verdicts."""
    rounds = plan(_catalog(), ROUNDS)
    tmp = tmp_path_factory.mktemp("mistakes")
    write_submissions(rounds, tmp / "submitted")
    workdir = tmp / "work"
    assert grade.main(["--submitted", str(tmp / "submitted"), "--workdir", str(workdir), "--quiet",
                       "--no-feedback"]) == 0

    from nbgrader.api import Gradebook

    verdicts = {}
    with Gradebook(f"sqlite:///{workdir / 'gradebook.db'}") as gradebook:
        for (student, assignment), items in rounds.items():
            tests = exercises_of(assignment)
            for kind, entry in items:
                scores = [gradebook.find_grade(test, assignment, assignment, student) for test in tests[entry.answer]]
                got = sum(g.score for g in scores)
                most = sum(g.max_score for g in scores)
                verdicts[kind, entry.id] = (got, most, student)
    return [entry for items in rounds.values() for _, entry in items], verdicts


def test_the_catalog_is_real_and_spread():
    entries = _catalog()
    assert len(entries) >= 30
    assert len({e.id for e in entries}) == len(entries)
    assert all(e.url.startswith("https://") for e in entries)
    assert len({e.assignment for e in entries}) >= 6
    for entry in entries:
        assert entry.answer in exercises_of(entry.assignment), f"{entry.id}: no answer cell {entry.answer}"


def test_mistakes_lose_points_on_their_exercise(graded):
    graded_entries, verdicts = graded
    mistakes = {e.id for e in graded_entries if ("mistake", e.id) in verdicts}
    assert len(mistakes) >= 25, f"only {len(mistakes)} mistakes graded"
    kept = [(m, verdicts["mistake", m]) for m in sorted(mistakes) if verdicts["mistake", m][0] == verdicts["mistake", m][1]]
    caught = 1 - len(kept) / len(mistakes)
    assert caught >= MISTAKE_BAR, f"{caught:.0%} of the mistakes lose points; full marks despite the mistake: {kept}"


def test_correct_fixes_keep_every_point(graded):
    graded_entries, verdicts = graded
    fixes = sorted({e.id for e in graded_entries if ("fix", e.id) in verdicts})
    assert len(fixes) >= 15, f"only {len(fixes)} fixes graded"
    lost = [(f, verdicts["fix", f]) for f in fixes if verdicts["fix", f][0] != verdicts["fix", f][1]]
    assert not lost, f"correct fixes that lost points (score, max, student): {lost}"
