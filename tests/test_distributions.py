"""The three distributions built as wheels and installed, not editable, into one new virtual
environment, in order.

First the grader alone (pip resolves what it declares; no torch): it grades
``tests/fixtures/stats101``, a course as ``nbgrader quickstart`` lays one out (plain ``assert``
tests, hidden ones, a written answer, three students, no grading profile), with plain ``nbgrader
autograde``'s scores. Then the simulated accelerator with torch: its pytest plugin runs a test file
in a folder outside the repository. Last the course's package, which finds its device.
"""

import csv
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
COURSE = ROOT / "tests" / "fixtures" / "stats101"
# the CPU build requirements.txt pins: a range would let pip fetch a CUDA build
TORCH = "torch==2.13.0"
ASSIGNMENT = "ps1"


def _run(
    command: list, cwd: Path, env: dict | None = None, timeout: int = 600
) -> subprocess.CompletedProcess:
    done = subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{command}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A new virtual environment with the grader's wheel installed (not editable) and what it
    declares it needs, resolved by pip from the package index, as a user's ``pip install`` does; its
    python. No torch comes along."""
    place = tmp_path_factory.mktemp("installed")
    _run([sys.executable, "-m", "venv", str(place / "venv")], cwd=place)
    python = place / "venv" / "bin" / "python"
    _run(
        [str(python), "-m", "pip", "install", "-q", str(_wheel(place, "autograder"))],
        cwd=place,
        timeout=900,
    )
    return python


def _wheel(place: Path, name: str) -> Path:
    """The wheel of distribution ``name`` (the folder of its pyproject.toml; "devcourse": the
    checkout's root), built from a copy out of the checkout, since a build writes beside its
    source."""
    source = place / "source" / name
    skipped = shutil.ignore_patterns("__pycache__", "*.egg-info", "build")
    if name == "devcourse":
        source.mkdir(parents=True)
        for file in ("pyproject.toml", "README.md"):
            shutil.copy(ROOT / file, source / file)
        shutil.copytree(ROOT / "devcourse", source / "devcourse", ignore=skipped)
    else:
        shutil.copytree(ROOT / name, source, ignore=skipped)
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "-q",
            "-w",
            str(place / "dist"),
            str(source),
        ],
        cwd=place,
    )
    [wheel] = (place / "dist").glob(f"{name}-*.whl")
    return wheel


def _environment(python: Path) -> dict:
    """The environment of a program run by the installed grader: its bin first on PATH, nothing of
    this one's."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("PYTHON", "JUPYTER", "VIRTUAL_ENV"))
    }
    return dict(env, PATH=str(python.parent) + os.pathsep + env["PATH"])


def _plain_nbgrader(course: Path) -> dict[str, tuple[float, float]]:
    """student -> (score, maximum) of plain nbgrader's generate_assignment, autograde and export."""
    env = dict(os.environ, PATH=str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"])
    for step in (["generate_assignment", ASSIGNMENT], ["autograde", ASSIGNMENT], ["export"]):
        _run([sys.executable, "-m", "nbgrader", *step, "--log-level=WARN"], cwd=course, env=env)
    with open(course / "grades.csv", newline="") as handle:
        return {
            r["student_id"]: (float(r["score"]), float(r["max_score"]))
            for r in csv.DictReader(handle)
        }


def test_the_installed_grader_grades_another_course_as_plain_nbgrader_does(installed, tmp_path):
    plain, graded = tmp_path / "plain", tmp_path / "graded"
    for course in (plain, graded):
        shutil.copytree(COURSE / "course", course)
        shutil.copytree(COURSE / "submissions", course / "submitted")
    expected = _plain_nbgrader(plain)
    assert expected == {"alice": (5, 6), "bob": (3, 6), "carol": (4, 6)}, expected
    env = _environment(installed)
    command = installed.parent / "autograder"  # the command the wheel puts on PATH
    done = _run(
        [str(command), "grade", "--course", str(graded), "--jobs", "2", "--quiet"],
        cwd=tmp_path,
        env=env,
    )
    with open(graded / "scores.csv", newline="") as handle:
        rows = {r["student"]: r for r in csv.DictReader(handle)}
    assert {
        student: (float(r["score"]), float(r["max_score"])) for student, r in rows.items()
    } == expected, done.stdout
    # the plain profile: nothing to say
    assert "Devices every submission is checked on" not in done.stdout
    assert "1 points of written answers to grade by hand" in rows["alice"]["note"]
    for student in expected:
        page = graded / "feedback" / student / ASSIGNMENT / "problem2.html"
        assert page.is_file() and "### BEGIN HIDDEN TESTS" not in page.read_text(), student
    assert (graded / "reference" / ASSIGNMENT / "problem1.json").is_file(), (
        "the instructor's solution ran first"
    )
    assert "Limits on each submission" in (graded / "report.txt").read_text()
    where = _run(
        [str(installed), "-c", "import autograder; print(autograder.__file__)"],
        cwd=tmp_path,
        env=env,
    )
    assert str(installed.parent.parent) in where.stdout, (
        "the grader came from the wheel, not the checkout"
    )
    no_torch = subprocess.run(
        [str(installed), "-c", "import torch"], capture_output=True, text=True, env=env
    )
    assert "No module named 'torch'" in no_torch.stderr, (
        "the grader needs no torch, and pip brought none"
    )


def test_bad_input_is_one_line_and_writes_nothing(installed, tmp_path):
    env = _environment(installed)
    # this course's profile named, in an environment without the course's package
    course = tmp_path / "course"
    shutil.copytree(COURSE / "course", course)
    with open(course / "nbgrader_config.py", "a") as handle:
        handle.write('c.Grader.profile = "devcourse.instructor.profile.DeviceCourse"\n')
    before = sorted(tmp_path.rglob("*"))
    cases = {
        "not a course": ["grade", "--course", str(tmp_path / "nothing-here")],
        "no course named": ["grade"],
        "unknown verb": ["frobnicate"],
        "profile not installed": ["grade", "--course", str(course)],
    }
    for case, arguments in cases.items():
        done = subprocess.run(
            [str(installed.parent / "autograder"), *arguments],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 2, (case, done.stdout, done.stderr)
        assert "Traceback" not in done.stderr and done.stderr.strip(), (case, done.stderr)
    assert "needs the package 'devcourse', which is not installed here" in done.stderr, done.stderr
    usage = _run([str(installed.parent / "autograder"), "--help"], cwd=tmp_path, env=env).stdout
    assert "grade" in usage and "gpu-check" not in usage, (
        "the grader alone has no verb of this course"
    )
    assert sorted(tmp_path.rglob("*")) == before, "nothing written"


PLUGIN_TEST = """
import torch


def test_a_second_device_with_the_cpus_values(simdevices):
    first, second = simdevices[:2]
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2)
    x = torch.ones(4, 3)
    assert torch.equal(layer.to(second)(x.to(second)).cpu(), layer.cpu()(x))
    assert str(second) == "sim:1" and torch.accelerator.device_count() >= 2


def test_mixing_devices_fails_as_on_a_gpu(simdevices):
    try:
        torch.ones(2, device=simdevices[0]) @ torch.ones(2)
    except RuntimeError as error:
        assert "Expected all tensors to be on the same device" in str(error)
    else:
        raise AssertionError("no error")
"""


@pytest.fixture(scope="module")
def with_simdevice(installed, tmp_path_factory) -> Path:
    """The same environment once the grader's tests ran, with the simulated accelerator, torch and
    pytest."""
    place = tmp_path_factory.mktemp("simdevice")
    _run(
        [
            str(installed),
            "-m",
            "pip",
            "install",
            "-q",
            str(_wheel(place, "simdevice")),
            TORCH,
            "pytest",
        ],
        cwd=place,
        timeout=900,
    )
    return installed


def test_the_simulated_devices_pytest_plugin_runs_another_projects_tests(with_simdevice, tmp_path):
    project = tmp_path / "another_project"
    project.mkdir()
    (project / "test_on_a_second_device.py").write_text(PLUGIN_TEST)
    env = _environment(with_simdevice)
    done = _run(
        [
            str(with_simdevice),
            "-m",
            "pytest",
            "-p",
            "no:cacheprovider",
            "-W",
            "error",
            "--simdevice",
            "2",
        ],
        cwd=project,
        env=env,
    )
    assert "2 passed" in done.stdout and "simdevice: 2 simulated device(s) on" in done.stdout, (
        done.stdout
    )
    alone = _run(
        [str(with_simdevice), "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=project, env=env
    )
    assert "2 passed" in alone.stdout, alone.stdout  # the fixture turns two on by itself
    where = _run(
        [str(with_simdevice), "-c", "import simdevice; print(simdevice.__file__)"],
        cwd=tmp_path,
        env=env,
    )
    assert str(with_simdevice.parent.parent) in where.stdout, (
        "simdevice came from its wheel, not the checkout"
    )


def test_the_course_package_installs_on_the_two_and_finds_its_device(with_simdevice, tmp_path):
    place = tmp_path / "course"
    place.mkdir()
    env = _environment(with_simdevice)
    _run(
        [str(with_simdevice), "-m", "pip", "install", "-q", str(_wheel(place, "devcourse"))],
        cwd=place,
        timeout=900,
    )
    code = (
        "import devcourse, devcourse.simdevice as course_sim, simdevice\n"
        "from devcourse.grading import device_matrix\n"
        "assert course_sim is simdevice\n"
        "print([str(entry.device) for entry in device_matrix()], devcourse.__file__)"
    )
    done = _run([str(with_simdevice), "-c", code], cwd=place, env=env)
    assert "['cpu', 'sim:0', 'sim:1']" in done.stdout, done.stdout
    assert str(with_simdevice.parent.parent) in done.stdout, (
        "devcourse came from its wheel, not the checkout"
    )
    usage = _run([str(with_simdevice.parent / "autograder"), "--help"], cwd=place, env=env).stdout
    assert "gpu-check" in usage and "this course on a CUDA machine" in usage, (
        "the course's verbs plug in"
    )
    profile = _run(
        [
            str(with_simdevice),
            "-c",
            (
                "from autograder.course.profile import profile_named; "
                "print(profile_named('devcourse.instructor.profile.DeviceCourse').devices())"
            ),
        ],
        cwd=place,
        env=env,
    )
    assert "sim:0 (simulated)" in profile.stdout, profile.stdout
