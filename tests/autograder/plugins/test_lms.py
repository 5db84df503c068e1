"""The LMS export: nbgrader's own `export` command with an LMS's plugin agrees with nbgrader's CSV,
penalty included, in the shapes Canvas and Moodle import; the base plugin picks one by name."""

from __future__ import annotations

import csv
import subprocess
import sys
from datetime import datetime

import pytest
from nbgrader.api import Gradebook

from autograder.course.config import tool_env
from devcourse.instructor.paths import ROOT


@pytest.fixture(scope="module")
def gradebook(tmp_path_factory):
    """Two assignments and three students: a late one with a penalty, one who skipped an
    assignment."""
    folder = tmp_path_factory.mktemp("lms")
    url = f"sqlite:///{folder / 'gradebook.db'}"
    with pytest.MonkeyPatch.context() as patch:
        # nbgrader makes a new gradebook by running alembic by name
        patch.setenv("PATH", tool_env()["PATH"])
        with Gradebook(url) as book:
            for name, points in (("00_environment", 8), ("01_device_placement", 8)):
                book.add_assignment(name, duedate=datetime(2026, 10, 1, 12, 0))
                book.add_notebook(name, name)
                book.add_grade_cell("tests", name, name, max_score=points, cell_type="code")
            book.add_student("ada", first_name="Ada", last_name="Lovelace", email="ada@example.org")
            book.add_student(
                "grace", first_name="Grace", last_name="Hopper", email="grace@example.org"
            )
            book.add_student("linus", email="linus@example.org")
            scores = {
                ("ada", "00_environment"): 8,
                ("ada", "01_device_placement"): 7.5,
                ("grace", "00_environment"): 6,
                ("grace", "01_device_placement"): 1,
                ("linus", "00_environment"): 3,
            }
            for (student, name), score in scores.items():
                book.add_submission(name, student, timestamp=datetime(2026, 10, 1, 11, 0))
                book.find_grade("tests", name, name, student).manual_score = score
            late = book.find_submission_notebook("00_environment", "00_environment", "grace")
            late.late_submission_penalty = 2.0
            book.db.commit()
    return folder, url


def _export(url: str, to, *options: str) -> list[list[str]]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "nbgrader",
            "export",
            f"--CourseDirectory.db_url={url}",
            f"--to={to}",
            *options,
        ],
        cwd=ROOT,
        env=tool_env(),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    with open(to, newline="") as handle:
        return list(csv.reader(handle))


def _nbgraders_scores(gradebook) -> dict[tuple[str, str], float]:
    folder, url = gradebook
    rows = _export(url, folder / "nbgrader.csv")
    header = rows[0]
    return {
        (r[header.index("student_id")], r[header.index("assignment")]): float(
            r[header.index("score")]
        )
        for r in rows[1:]
    }


def test_canvas_shape_agrees_with_nbgraders_csv_penalty_included(gradebook):
    folder, url = gradebook
    rows = _export(
        url,
        folder / "canvas.csv",
        "--exporter=autograder.plugins.canvas.CanvasExportPlugin",
        "--CanvasExportPlugin.section=Autumn 2026",
    )
    assert rows[0] == [
        "Student",
        "ID",
        "SIS User ID",
        "SIS Login ID",
        "Section",
        "00_environment",
        "01_device_placement",
    ]
    assert rows[1] == ["    Points Possible", "", "", "", "", "8", "8"]
    expected = _nbgraders_scores(gradebook)
    by_login = {row[3]: row for row in rows[2:]}
    assert sorted(by_login) == ["ada", "grace", "linus"]
    for (student, assignment), score in expected.items():
        assert float(by_login[student][5 + rows[0][5:].index(assignment)]) == score, (
            student,
            assignment,
        )
    assert by_login["grace"][5] == "4"  # 6 points, 2 taken for lateness
    assert by_login["linus"][6] == "0"  # nothing submitted
    assert by_login["ada"][:5] == ["Lovelace, Ada", "", "", "ada", "Autumn 2026"]


def test_moodle_shape_names_each_student_by_email_and_id_and_can_rename_columns(gradebook):
    """Through the base plugin, configured as itself (lms, columns): what make export-grades
    runs."""
    folder, url = gradebook
    rows = _export(
        url,
        folder / "moodle.csv",
        "--exporter=autograder.plugins.lms.LmsExportPlugin",
        "--LmsExportPlugin.lms=moodle",
        "--assignment=00_environment",
        '--LmsExportPlugin.columns={"00_environment": "Notebook 00"}',
    )
    assert rows == [
        ["Email address", "ID number", "Notebook 00"],
        ["ada@example.org", "ada", "8"],
        ["grace@example.org", "grace", "4"],
        ["linus@example.org", "linus", "3"],
    ]


def test_an_unknown_lms_is_refused_by_name(gradebook):
    folder, url = gradebook
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "nbgrader",
            "export",
            f"--CourseDirectory.db_url={url}",
            f"--to={folder / 'x.csv'}",
            "--exporter=autograder.plugins.lms.LmsExportPlugin",
            "--LmsExportPlugin.lms=blackboard",
        ],
        cwd=ROOT,
        env=tool_env(),
        capture_output=True,
        text=True,
    )
    assert done.returncode != 0 and "blackboard" in done.stderr and "canvas" in done.stderr, (
        done.stderr
    )


def test_make_export_grades_writes_all_three_beside_the_gradebook(gradebook):
    folder, _ = gradebook
    done = subprocess.run(
        ["make", "export-grades", f"GRADES_DIR={folder}"],
        cwd=ROOT,
        env=tool_env(),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert (folder / "grades.csv").read_text().startswith("assignment,duedate,timestamp,student_id")
    assert (
        (folder / "grades-canvas.csv")
        .read_text()
        .startswith("Student,ID,SIS User ID,SIS Login ID,Section")
    )
    assert (folder / "grades-moodle.csv").read_text().startswith("Email address,ID number")
