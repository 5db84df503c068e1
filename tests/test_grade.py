"""make grade: the demo class gets the scores it should, and bad input is reported, not fatal."""

import csv
import shutil

import pytest

from autograder import demo, grade


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Grade the demo class plus one student who handed in a corrupt notebook."""
    tmp = tmp_path_factory.mktemp("grade")
    submitted = tmp / "submitted"
    shutil.copytree(demo.SUBMITTED, submitted)
    corrupt = submitted / "zoe" / "00_environment" / "00_environment.ipynb"
    corrupt.parent.mkdir(parents=True)
    corrupt.write_text('{"cells": [ this is not json')
    results = grade.grade(submitted, tmp / "work")
    return {(r.student, r.assignment): r for r in results}


def _expected():
    with demo.EXPECTED_SCORES.open() as handle:
        return list(csv.DictReader(handle))


def test_demo_class_gets_its_expected_scores(graded):
    rows = _expected()
    assert rows, "expected_scores.csv is empty"
    for row in rows:
        result = graded[row["student"], row["assignment"]]
        expected = None if row["score"] == "" else float(row["score"])
        assert (result.score, result.max_score) == (expected, float(row["max_score"])), row


def test_expected_scores_cover_every_student_and_assignment(graded):
    demo_pairs = {pair for pair in graded if pair[0] != "zoe"}
    assert {(row["student"], row["assignment"]) for row in _expected()} == demo_pairs


def test_full_and_empty_submissions_bracket_the_scale(graded):
    for (student, _), result in graded.items():
        if student == "ada":
            assert result.score == result.max_score > 0
        if student == "linus":
            assert result.score == 0


def test_missing_assignment_is_noted_not_scored(graded):
    result = graded["margaret", "01_device_placement"]
    assert result.score is None and result.note == "not submitted"


def test_corrupt_notebook_gets_a_note_and_the_batch_goes_on(graded):
    result = graded["zoe", "00_environment"]
    assert result.score is None and result.note.startswith("not graded:")
    assert graded["ada", "00_environment"].score == graded["ada", "00_environment"].max_score


def test_table_shows_scores_totals_and_notes():
    results = [
        grade.Result("ada", "00_x", 3, 3),
        grade.Result("ada", "01_y", 2, 4),
        grade.Result("bob", "00_x", None, 3, "not submitted"),
        grade.Result("bob", "01_y", 1, 4),
    ]
    lines = grade.format_table(results).splitlines()
    assert lines[0].split() == ["student", "00_x", "01_y", "total"]
    assert lines[2].split() == ["ada", "3/3", "2/4", "5/7"]
    assert lines[3].split() == ["bob", "-/3", "1/4", "1/7"]
    assert "  bob / 00_x: not submitted" in lines


def test_csv_has_one_row_per_student_and_assignment(tmp_path):
    results = [grade.Result("ada", "00_x", 3, 3), grade.Result("bob", "00_x", None, 3, "not submitted")]
    grade.write_csv(results, tmp_path / "scores.csv")
    rows = list(csv.DictReader((tmp_path / "scores.csv").open()))
    assert rows == [
        {"student": "ada", "assignment": "00_x", "score": "3", "max_score": "3", "note": ""},
        {"student": "bob", "assignment": "00_x", "score": "", "max_score": "3", "note": "not submitted"},
    ]
