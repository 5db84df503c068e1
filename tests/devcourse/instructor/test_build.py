"""Every exercise is proven both ways, and the proof itself can fail.

That every solution passes every test, hidden ones included, is proven by
nbval running ``solutions/`` (a failing test is a cell that raises) and by the
grader giving the demo student ``ada`` full marks (``tests/autograder/batch/test_grade.py``);
``make both-ways`` runs nbgrader's own validate on them too. Here: the
student versions pass none.
"""

import shutil

import nbformat
import pytest

from devcourse.instructor import cli
from devcourse.instructor import build, paths


@pytest.mark.parametrize("name", paths.assignments())
def test_student_version_with_hidden_tests_passes_none(name, tmp_path):
    stub = tmp_path / name / f"{name}.ipynb"
    build.student_version(paths.solution_path(name), stub)
    ok, output = build.validate(stub, invert=True)
    assert ok, output


def test_student_version_stubs_answers_and_keeps_hidden_tests(tmp_path):
    stub = tmp_path / "nb.ipynb"
    build.student_version(paths.solution_path("00_environment"), stub)
    cells = nbformat.read(stub, as_version=4).cells
    answers = [c for c in cells if c.metadata.get("nbgrader", {}).get("solution")]
    assert answers and all(
        "raise NotImplementedError()" in c.source for c in answers if c.cell_type == "code"
    )
    written = [c for c in answers if c.cell_type == "markdown"]  # Exercise 4, graded by hand
    assert written and all(c.source == "YOUR ANSWER HERE" for c in written)
    assert not any("BEGIN SOLUTION" in c.source for c in cells)
    assert any("BEGIN HIDDEN TESTS" in c.source for c in cells)
    assert all(not c.get("outputs") for c in cells if c.cell_type == "code")


def test_validate_reports_a_wrong_answer_as_a_failure(tmp_path):
    """The both-ways check would notice a solution that stopped passing."""
    nb = nbformat.read(paths.solution_path("00_environment"), as_version=4)
    for cell in nb.cells:
        if cell.metadata.get("nbgrader", {}).get("grade_id") == "list_devices":
            cell.source = "def list_devices():\n    return ['cpu']"
    broken = tmp_path / "broken.ipynb"
    nbformat.write(nb, broken)
    ok, output = build.validate(broken)
    assert not ok and "VALIDATION FAILED" in output
    ok, output = build.validate(broken, invert=True)
    assert not ok, "a notebook that passes some tests is not a student version"


def test_times_runs_and_validates_a_notebook_and_names_the_machine():
    run_s, validate_s = build.timings("00_environment")
    assert run_s > 0 and validate_s > 0, (run_s, validate_s)
    assert "cores" in build.machine()


def test_times_exits_1_when_a_notebook_is_over_a_limit(monkeypatch, capsys):
    seconds = {
        "00_environment": (5.0, 8.0),
        "01_device_placement": (61.0, 8.0),
        "02_cross_device_errors": (9.0, 31.0),
    }
    monkeypatch.setattr(build, "timings", seconds.get)
    assert cli.build(["times", "00_environment"]) == 0
    assert cli.build(["times", *seconds]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert (
        lines[-2].endswith("run over")
        and lines[-1].endswith("Validate over")
        and "over" not in lines[-3]
    )


def test_the_graders_copy_of_the_solutions_leaves_out_what_a_run_writes_beside_them(
    tmp_path, monkeypatch
):
    """08's memory picture, written when the solution runs, neither reaches a work folder nor
    changes its key.

    A new work folder's ``source/`` is what the canary's references are keyed on
    (``autograder.judge.reference``): a picture left by running the solution made every new work
    folder key 08 anew and run its canary again.
    """
    from autograder.batch import workdir
    from autograder.prepare.submission import fingerprint

    solutions = tmp_path / "solutions"
    shutil.copytree(
        paths.SOLUTIONS / "08_portable_models_and_memory",
        solutions / "08_portable_models_and_memory",
        ignore=shutil.ignore_patterns("memory_timeline.png"),
    )
    clean = tmp_path / "clean"
    build.copy_solutions(clean, solutions)
    for stray in (
        "08_portable_models_and_memory/memory_timeline.png",
        ".ipynb_checkpoints/x-checkpoint.ipynb",
        "08_portable_models_and_memory/__pycache__/m.cpython-311.pyc",
    ):
        (solutions / stray).parent.mkdir(parents=True, exist_ok=True)
        (solutions / stray).write_bytes(b"written by a run")
    # a file the notebook reads
    (solutions / "08_portable_models_and_memory" / "data.csv").write_text("a,b\n")
    copied = tmp_path / "copied"
    build.copy_solutions(copied, solutions)
    assert sorted(p.relative_to(copied).as_posix() for p in copied.rglob("*") if p.is_file()) == [
        "08_portable_models_and_memory/08_portable_models_and_memory.ipynb",
        "08_portable_models_and_memory/data.csv",
    ]
    (copied / "08_portable_models_and_memory" / "data.csv").unlink()
    assert fingerprint(copied, recursive=True) == fingerprint(clean, recursive=True)

    made = []
    monkeypatch.setattr(
        workdir,
        "copy_source",
        lambda source, target, ignore: made.append((source, target, ignore)) or target.mkdir(),
    )
    # run from the course's checkout, as the tests are
    workdir.open_workdir(tmp_path / "work", None)
    assert made == [
        (
            paths.SOLUTIONS,
            tmp_path / "work" / "source",
            list(build.course_config().CourseDirectory.ignore),
        )
    ], "a new work folder copies the solutions another way"
