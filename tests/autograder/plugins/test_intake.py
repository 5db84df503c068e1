"""Submissions downloaded from Canvas or Moodle reach nbgrader's submitted/ folder through
nbgrader's own zip_collect with the course's collector plugin, renamed copies included."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from autograder.course.config import tool_env
from devcourse.instructor.paths import COURSE, ROOT
from autograder.plugins.intake import parse

NAME = "00_environment"


@pytest.mark.parametrize(
    "path,student,late",
    [
        (f"/x/extracted/subs/hoppergrace_12345_678901_{NAME}.ipynb", "12345", ""),
        (f"/x/extracted/subs/hoppergrace_LATE_12345_678902_{NAME}-1.ipynb", "12345", "late"),
        (f"/x/extracted/subs/lovelaceada_222_333_{NAME} (1).ipynb", "222", ""),
        (f"/x/extracted/all/Grace Hopper_4711_assignsubmission_file_/{NAME}.ipynb", "4711", ""),
        (f"/x/extracted/all/Ada Lovelace_815_assignsubmission_file_/{NAME} (2).ipynb", "815", ""),
        (f"/x/extracted/all/Ada Lovelace_815_assignsubmission_file_{NAME}.ipynb", "815", ""),
    ],
)
def test_lms_names_give_the_student_and_the_course_notebook(path, student, late):
    assert parse(path) == {"student_id": student, "file_id": f"{NAME}.ipynb", "late": late}


@pytest.mark.parametrize(
    "path",
    [
        f"/x/extracted/{NAME}.ipynb",
        "/x/extracted/notes_from_class.ipynb",
        "/x/extracted/Ada Lovelace_815_assignsubmission_file_/",
    ],
)
def test_other_names_are_not_guessed(path):
    assert parse(path) is None


def test_nbgraders_zip_collect_files_canvas_and_moodle_downloads(tmp_path):
    course = tmp_path / "course"
    shutil.copytree(COURSE / NAME, course / "release" / NAME)
    (course / "nbgrader_config.py").write_text(
        "c = get_config()\nc.ZipCollectApp.collector_plugin ="
        " 'autograder.plugins.intake.LmsCollectorPlugin'\n"
    )
    archive = course / "downloaded" / NAME / "archive"
    archive.mkdir(parents=True)
    notebook = (COURSE / NAME / f"{NAME}.ipynb").read_bytes()
    with zipfile.ZipFile(archive / "submissions.zip", "w") as canvas:  # Canvas: one flat folder
        canvas.writestr(f"hoppergrace_12345_678901_{NAME}.ipynb", notebook)
        canvas.writestr(
            f"lovelaceada_LATE_222_333_{NAME}-1.ipynb", notebook.replace(b"YOUR CODE HERE", b"ada")
        )
        canvas.writestr("hoppergrace_12345_678901_scratch.txt", b"not a notebook")
    with zipfile.ZipFile(archive / "moodle-all.zip", "w") as moodle:  # Moodle: a folder per student
        moodle.writestr(f"Linus T_4711_assignsubmission_file_/{NAME} (1).ipynb", notebook)
    env = dict(tool_env(), PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-m", "nbgrader", "zip_collect", NAME, "--force"],
        cwd=course,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    submitted = sorted(
        str(p.relative_to(course / "submitted")) for p in (course / "submitted").rglob("*.ipynb")
    )
    assert submitted == [
        f"12345/{NAME}/{NAME}.ipynb",
        f"222/{NAME}/{NAME}.ipynb",
        f"4711/{NAME}/{NAME}.ipynb",
    ]
    assert b"ada" in (course / "submitted" / "222" / NAME / f"{NAME}.ipynb").read_bytes()
    assert (
        "lovelaceada_LATE_222_333_00_environment-1.ipynb is marked late in its name" in done.stderr
    ), done.stderr
    # an LMS's names hold no submission time: nbgrader writes no timestamp.txt, so no late penalty
    # applies
    assert os.listdir(course / "submitted" / "12345" / NAME) == [f"{NAME}.ipynb"]


def test_the_grader_takes_a_renamed_copy_when_the_notebook_itself_is_missing(tmp_path):
    from autograder.batch.workdir import submitted_notebook

    assert submitted_notebook(tmp_path, NAME) is None
    older, newer = tmp_path / f"{NAME} (1).ipynb", tmp_path / f"{NAME}-2.ipynb"
    older.write_text("{}")
    newer.write_text("{}")
    os.utime(older, (1_000_000, 1_000_000))
    (tmp_path / f"{NAME}_notes.ipynb").write_text("{}")  # another notebook, not a copy
    assert submitted_notebook(tmp_path, NAME) == newer
    exact = tmp_path / f"{NAME}.ipynb"
    exact.write_text("{}")
    assert submitted_notebook(tmp_path, NAME) == exact


def test_a_renamed_download_is_graded_in_full_and_the_report_says_so(tmp_path):
    import csv

    from autograder.cli import grade
    from devcourse.instructor.paths import DEMO_CLASS

    submitted = tmp_path / "submitted" / "ada" / NAME
    submitted.mkdir(parents=True)
    shutil.copy(DEMO_CLASS / "ada" / NAME / f"{NAME}.ipynb", submitted / f"{NAME} (1).ipynb")
    for path in [tmp_path, *tmp_path.rglob("*")]:
        # the sandboxed kernel reads its copy as another user
        path.chmod(0o755 if path.is_dir() else 0o644)
    workdir = tmp_path / "work"
    assert (
        grade.main(
            ["--submitted", str(tmp_path / "submitted"), "--workdir", str(workdir), "--quiet"]
        )
        == 0
    )
    with (workdir / "scores.csv").open() as handle:
        row = next(r for r in csv.DictReader(handle) if r["assignment"] == NAME)
    # 2: Exercise 4, by hand
    assert (row["student"], row["score"], row["max_score"]) == ("ada", "8", "10"), row
    assert "2 points of written answers to grade by hand" in row["note"], row
    assert f"graded {NAME} (1).ipynb as {NAME}.ipynb" in (workdir / "report.txt").read_text()
