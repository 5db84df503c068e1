"""The grader installed from a wheel, with no checkout around it, grades a small nbgrader course of another's.

The course (``tests/fixtures/stats101``) is as ``nbgrader quickstart`` lays one out: an ``nbgrader_config.py``
holding only its course id, one assignment of two notebooks with plain ``assert`` tests (hidden ones too) and a
written answer graded by hand, and three students' submissions. It names no grading profile: no ``devcourse``, no
torch in its kernels. Its scores and maximums are plain ``nbgrader autograde``'s, run on a copy beside it.
"""

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
COURSE = Path(__file__).resolve().parents[2] / "fixtures" / "stats101"
ASSIGNMENT = "ps1"


def _run(command: list, cwd: Path, env: dict | None = None, timeout: int = 600) -> subprocess.CompletedProcess:
    done = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A new virtual environment with the grader's wheel installed (not editable) and what it declares it needs,
    resolved by pip from the package index, as a user's ``pip install`` does; its python. No torch comes along."""
    place = tmp_path_factory.mktemp("installed")
    source = place / "autograder"  # what the wheel is built from, out of the checkout (a build writes beside it)
    skipped = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    shutil.copytree(ROOT / "autograder", source, ignore=skipped)
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(place / "dist"), str(source)], cwd=place)
    _run([sys.executable, "-m", "venv", str(place / "venv")], cwd=place)
    python = place / "venv" / "bin" / "python"
    [wheel] = (place / "dist").glob("autograder-*.whl")
    _run([str(python), "-m", "pip", "install", "-q", str(wheel)], cwd=place, timeout=900)
    return python


def _environment(python: Path) -> dict:
    """The environment of a program run by the installed grader: its bin first on PATH, nothing of this one's."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTHON", "JUPYTER", "VIRTUAL_ENV"))}
    return dict(env, PATH=str(python.parent) + os.pathsep + env["PATH"])


def _plain_nbgrader(course: Path) -> dict[str, tuple[float, float]]:
    """student -> (score, maximum) of plain nbgrader's generate_assignment, autograde and export."""
    env = dict(os.environ, PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    for step in (["generate_assignment", ASSIGNMENT], ["autograde", ASSIGNMENT], ["export"]):
        _run([sys.executable, "-m", "nbgrader", *step, "--log-level=WARN"], cwd=course, env=env)
    with open(course / "grades.csv", newline="") as handle:
        return {r["student_id"]: (float(r["score"]), float(r["max_score"])) for r in csv.DictReader(handle)}


def test_the_installed_grader_grades_another_course_as_plain_nbgrader_does(installed, tmp_path):
    plain, graded = tmp_path / "plain", tmp_path / "graded"
    for course in (plain, graded):
        shutil.copytree(COURSE / "course", course)
        shutil.copytree(COURSE / "submissions", course / "submitted")
    expected = _plain_nbgrader(plain)
    assert expected == {"alice": (5, 6), "bob": (3, 6), "carol": (4, 6)}, expected
    env = _environment(installed)
    command = installed.parent / "autograder"  # the command the wheel puts on PATH
    done = _run([str(command), "grade", "--course", str(graded), "--jobs", "2", "--quiet"], cwd=tmp_path, env=env)
    with open(graded / "scores.csv", newline="") as handle:
        rows = {r["student"]: r for r in csv.DictReader(handle)}
    assert {student: (float(r["score"]), float(r["max_score"])) for student, r in rows.items()} == expected, done.stdout
    assert "Devices every submission is checked on" not in done.stdout  # the plain profile: nothing to say
    assert "1 points of written answers to grade by hand" in rows["alice"]["note"]
    for student in expected:
        page = graded / "feedback" / student / ASSIGNMENT / "problem2.html"
        assert page.is_file() and "### BEGIN HIDDEN TESTS" not in page.read_text(), student
    assert (graded / "reference" / ASSIGNMENT / "problem1.json").is_file(), "the instructor's solution ran first"
    assert "Limits on each submission" in (graded / "report.txt").read_text()
    where = _run([str(installed), "-c", "import autograder; print(autograder.__file__)"], cwd=tmp_path, env=env)
    assert str(installed.parent.parent) in where.stdout, "the grader came from the wheel, not the checkout"
    no_torch = subprocess.run([str(installed), "-c", "import torch"], capture_output=True, text=True, env=env)
    assert "No module named 'torch'" in no_torch.stderr, "the grader needs no torch, and pip brought none"


def test_bad_input_is_one_line_and_writes_nothing(installed, tmp_path):
    env = _environment(installed)
    course = tmp_path / "course"  # this course's profile named, in an environment without the course's package
    shutil.copytree(COURSE / "course", course)
    with open(course / "nbgrader_config.py", "a") as handle:
        handle.write('c.Grader.profile = "autograder.course.profile.DeviceCourse"\n')
    before = sorted(tmp_path.rglob("*"))
    cases = {
        "not a course": ["grade", "--course", str(tmp_path / "nothing-here")],
        "no course named": ["grade"],
        "unknown verb": ["frobnicate"],
        "profile not installed": ["grade", "--course", str(course)],
    }
    for case, arguments in cases.items():
        done = subprocess.run([str(installed.parent / "autograder"), *arguments], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 2, (case, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr and done.stderr.strip(), (case, done.stderr)
    assert "needs the package 'devcourse', which is not installed here" in done.stderr, done.stderr
    assert sorted(tmp_path.rglob("*")) == before, "nothing written"
