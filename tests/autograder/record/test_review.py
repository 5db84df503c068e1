"""A withheld score shows as "withheld", and one command releases it (graded as it ran) or confirms
it (0).

Two students hand in the instructor's solution of 00_environment plus a cell of their own that
walks the garbage collector's objects, which the scan flags; the run withholds both scores.
"""

from __future__ import annotations

import csv
import shutil
from pathlib import Path

import nbformat
import pytest

from autograder.cli import grade
from autograder.cli import review as review_cli
from devcourse.instructor.demo import SUBMITTED
from autograder.record import review

ASSIGNMENT = "00_environment"
WRITTEN = "reply_to_a_classmate"  # Exercise 4, graded by hand


def _scores(workdir: Path) -> dict[str, dict]:
    with (workdir / "scores.csv").open(newline="") as handle:
        return {
            row["student"]: row for row in csv.DictReader(handle) if row["assignment"] == ASSIGNMENT
        }


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    folder = tmp_path_factory.mktemp("review")
    submitted, workdir = folder / "submitted", folder / "work"
    nb = nbformat.read(SUBMITTED / "ada" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell("import gc\nprint(len(gc.get_objects()) > 0)"))
    for student in ("rosa", "vic"):
        (submitted / student / ASSIGNMENT).mkdir(parents=True)
        nbformat.write(nb, submitted / student / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
    code = grade.main(
        ["--submitted", str(submitted), "--workdir", str(workdir), "--no-feedback", "--quiet"]
    )
    assert code == 0
    return workdir


def test_a_withheld_score_shows_as_withheld_with_the_command_to_review_it(graded):
    rows = _scores(graded)
    for student in ("rosa", "vic"):
        assert rows[student]["score"] == "withheld", rows[student]
        assert (
            "get_objects" in rows[student]["note"]
            and "python -m autograder review" in rows[student]["note"]
        )
    assert "withheld/10" in (graded / "report.txt").read_text()
    # formgrader lists it as needing manual grading, the finding as a comment
    for student in ("rosa", "vic"):
        flags, comments = _formgrader_view(graded, student)
        assert flags and all(flags.values()), flags
        assert any(
            "withheld by the grader for review" in c and "get_objects" in c for c in comments
        ), comments


def _formgrader_view(workdir: Path, student: str) -> tuple[dict[str, bool], list[str]]:
    """What formgrader shows of a student's notebook: each grade's needs-manual-grade flag, the
    manual comments."""
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{workdir / 'gradebook.db'}") as gradebook:
        notebook = gradebook.find_submission_notebook(ASSIGNMENT, ASSIGNMENT, student)
        return (
            {g.name: g.needs_manual_grade for g in notebook.grades},
            [c.manual_comment for c in notebook.comments if c.manual_comment],
        )


def test_release_grades_it_as_it_ran_and_confirm_keeps_zero(graded, capsys):
    assert review_cli.main(["rosa/" + ASSIGNMENT, "--release", "--workdir", str(graded)]) == 0
    assert "released, 8 points" in capsys.readouterr().out
    assert review_cli.main(["vic/" + ASSIGNMENT, "--confirm", "--workdir", str(graded)]) == 0
    rows = _scores(graded)
    assert rows["rosa"]["score"] == "8" and "released" in rows["rosa"]["note"], rows["rosa"]
    assert rows["vic"]["score"] == "0" and "confirmed" in rows["vic"]["note"], rows["vic"]
    for student, decision in (("rosa", "released"), ("vic", "confirmed")):
        flags, comments = _formgrader_view(graded, student)
        # ada's reply to Exercise 4, which nobody has graded by hand yet
        written = flags.pop(WRITTEN)
        assert written, (
            "the decision took the written answer off formgrader's list of what to grade by hand"
        )
        assert flags and not any(flags.values()), (
            "a decided score is still listed as needing manual grading"
        )
        assert any(decision in c for c in comments) and not any(
            "for review" in c for c in comments
        ), comments
    # decided once: a second decision, or one about a score that was never withheld, is refused
    assert review_cli.main(["rosa/" + ASSIGNMENT, "--confirm", "--workdir", str(graded)]) == 2
    assert "no withheld score" in capsys.readouterr().err


def test_release_without_the_job_folder_says_to_grade_again(tmp_path):
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "state.json").write_text(
        '{"withheld": {"ann/00_environment": {"00_environment": ["x"]}}}'
    )
    with pytest.raises(review.ReviewError, match="grade it again"):
        review.release(workdir, "ann", ASSIGNMENT, "sqlite:///" + str(workdir / "gradebook.db"))
    shutil.rmtree(workdir)
