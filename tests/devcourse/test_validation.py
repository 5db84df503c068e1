"""Validate tells the truth: after the visible tests pass, it says what hidden checks are worth, per
exercise."""

from __future__ import annotations

import subprocess
import sys

import nbformat

from autograder.course.cells import is_test, nbgrader_meta
from autograder.course.config import tool_env
from devcourse.instructor.paths import COURSE, ROOT, assignments, solution_path
from devcourse import validation


def test_the_student_versions_mark_exactly_the_tests_with_hidden_checks():
    marked_somewhere = False
    for name in assignments():
        solution = nbformat.read(solution_path(name), as_version=4)
        expected = {
            nbgrader_meta(c)["grade_id"]: nbgrader_meta(c)["points"]
            for c in solution.cells
            if is_test(c) and "### BEGIN HIDDEN TESTS" in c.source
        }
        student = nbformat.read(COURSE / name / f"{name}.ipynb", as_version=4)
        marked = {
            nbgrader_meta(c)["grade_id"]: nbgrader_meta(c)["points"]
            for c in student.cells
            if c.metadata.get("course", {}).get("hidden_checks")
        }
        assert marked == expected, name
        assert sum(points for _, points, _ in validation.hidden_points(student)) == sum(
            expected.values()
        ), name
        assert "BEGIN HIDDEN TESTS" not in "".join(c.source for c in student.cells), name
        marked_somewhere |= bool(marked)
    assert marked_somewhere


def test_hidden_points_are_listed_under_their_exercise():
    nb = nbformat.read(
        COURSE / "02_cross_device_errors" / "02_cross_device_errors.ipynb", as_version=4
    )
    found = validation.hidden_points(nb)
    assert found and all(title.startswith("Exercise ") for title, _, _ in found), found
    lines = validation.message(nb)
    assert lines[0].startswith("When graded, hidden checks also run")
    assert f"of {validation.total_points(nb):g} points" in lines[0]
    assert any(line.strip().startswith(found[0][0]) for line in lines[1:]), lines


def test_a_written_answer_is_named_as_graded_by_hand_and_counted_in_the_total():
    nb = nbformat.read(COURSE / "00_environment" / "00_environment.ipynb", as_version=4)
    assert validation.written_points(nb) == [
        ("Exercise 4 (2 points, graded by hand): answer a classmate", 2.0)
    ]
    lines = validation.message(nb)
    assert "of 10 points" in lines[0], lines
    assert (
        lines[-1] == "Exercise 4 (2 points, graded by hand): answer a classmate: a written answer, "
        "graded by hand after the deadline; Validate only checks that you wrote one."
    ), lines


def _tiny(tmp_path, answer: str):
    """A two-exercise notebook: exercise 1's test is marked as having hidden checks, exercise 2's is
    not."""
    nb = nbformat.v4.new_notebook()
    cells = []
    for number, marked in ((1, True), (2, False)):
        cells.append(nbformat.v4.new_markdown_cell(f"## Exercise {number} (3 points): double it"))
        solution = nbformat.v4.new_code_cell(f"def double_{number}(x):\n    {answer}")
        solution.metadata["nbgrader"] = {
            "grade": False,
            "solution": True,
            "locked": False,
            "grade_id": f"answer_{number}",
            "schema_version": 3,
        }
        test = nbformat.v4.new_code_cell(f"assert double_{number}(2) == 4")
        test.metadata["nbgrader"] = {
            "grade": True,
            "solution": False,
            "locked": True,
            "grade_id": f"test_{number}",
            "points": 3,
            "schema_version": 3,
        }
        if marked:
            test.metadata["course"] = {"hidden_checks": True}
        cells += [solution, test]
    nb.cells = cells
    path = tmp_path / "tiny.ipynb"
    nbformat.write(nb, path)
    return path


def _validate(path):
    return subprocess.run(
        [sys.executable, "-m", "devcourse.validation", str(path)],
        cwd=path.parent,
        env=tool_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_command_line_says_what_hidden_checks_are_worth_after_a_success(tmp_path):
    done = _validate(_tiny(tmp_path, "return 2 * x"))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Success! Your notebook passes all the tests." in done.stdout
    assert "hidden checks also run (other inputs, other devices): 3 of 6 points" in done.stdout, (
        done.stdout
    )
    assert "  Exercise 1 (3 points): double it: 3 points in 1 test" in done.stdout
    assert "Exercise 2" not in done.stdout


def test_a_failing_notebook_gets_nbgraders_errors_and_no_promise(tmp_path):
    done = _validate(_tiny(tmp_path, "return x + 1"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "The following cell failed" in done.stdout and "AssertionError" in done.stdout
    assert "hidden checks" not in done.stdout
    assert str(ROOT) not in done.stderr  # no traceback of the command itself


def test_a_missing_or_broken_notebook_gets_a_line_each(tmp_path):
    broken = tmp_path / "broken.ipynb"
    broken.write_text("not a notebook")
    done = subprocess.run(
        [sys.executable, "-m", "devcourse.validation", str(broken), str(tmp_path / "gone.ipynb")],
        cwd=tmp_path,
        env=tool_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert f"{broken}: cannot validate: NotJSONError" in done.stderr, done.stderr
    assert f"{tmp_path / 'gone.ipynb'}: cannot validate: FileNotFoundError" in done.stderr, (
        done.stderr
    )
    assert "Traceback" not in done.stderr
