"""Turn instructor notebooks into everything else, and prove each exercise both ways.

``solutions/NN_topic/NN_topic.ipynb`` is the only notebook edited by hand. From it come the stored
outputs nbval compares (:func:`execute`), the student version in ``course/``
(:func:`generate_course`), and a student version that keeps the hidden tests
(:func:`student_version`), which must fail every test. See ``autograder build --help``.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat

from autograder.course.cells import has_hidden, is_test, nbgrader_meta
from autograder.course.config import tool_env
from autograder.course.paths import config_in, copy_source
from devcourse.instructor.paths import (
    COURSE,
    ROOT,
    SOLUTIONS,
    STUDENTS_GUIDE,
    assignments,
    solution_path,
)

CELL_TIMEOUT_S = 120


def course_config():
    """This course's nbgrader settings, from its checkout's ``nbgrader_config.py`` (a traitlets
    ``Config``)."""
    return config_in(ROOT)


def copy_solutions(target: Path, source: Path = SOLUTIONS) -> None:
    """Copy the instructor's notebooks (``solutions/``) into ``target``, less what nbgrader's config
    ignores (the files a notebook writes beside itself when it runs, 08's memory picture), as the
    grader copies a source."""
    copy_source(source, target, list(course_config().CourseDirectory.ignore))


def execute(path: Path) -> None:
    """Run a notebook top to bottom and store its outputs in place.

    Cells tagged ``raises-exception`` may raise; any other error stops the
    run. Widget state is not stored: it changes on every run.
    """
    from nbclient import NotebookClient

    nb = nbformat.read(path, as_version=4)
    nb.metadata.pop("widgets", None)
    client = NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",
        resources={"metadata": {"path": str(path.parent)}},
        store_widget_state=False,
    )
    client.execute()
    nb.metadata.pop("widgets", None)
    for cell in nb.cells:
        for output in cell.get("outputs", []):
            if "traceback" in output:
                output["traceback"] = [scrub_paths(line) for line in output["traceback"]]
            if "text" in output:
                output["text"] = scrub_paths(output["text"])
            if "evalue" in output:
                output["evalue"] = scrub_paths(output["evalue"])
    nbformat.write(nb, path)


def scrub_paths(text: str) -> str:
    """Replace this machine's install locations in ``text`` with neutral names.

    Stored tracebacks and warnings would otherwise show where the author's
    Python lives, which means nothing to a reader.
    """
    import sysconfig

    paths = sysconfig.get_paths()
    replacements = [
        (paths["purelib"], "<site-packages>"),
        (paths["platlib"], "<site-packages>"),
        (paths["stdlib"], "<python>"),
        (str(ROOT), "<course>"),
    ]
    for prefix, name in sorted(replacements, key=lambda pair: -len(pair[0])):
        text = text.replace(prefix, name)
    return text


def generate_course(release_dir: Path = COURSE, names: list[str] | None = None) -> None:
    """Write the student version of each assignment into ``release_dir`` with nbgrader, and the
    students' guide.

    Uses a throw-away gradebook, so it never touches an instructor's own. The guide,
    ``docs/students.md``, becomes ``README.md`` beside the assignments, with the pictures it shows.
    """
    names = names or assignments()
    release_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(STUDENTS_GUIDE, release_dir / "README.md")
    for picture in re.findall(r"\]\(([\w-]+\.png)\)", STUDENTS_GUIDE.read_text()):
        shutil.copy(STUDENTS_GUIDE.parent / picture, release_dir / picture)
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "nbgrader",
                    "generate_assignment",
                    name,
                    "--force",
                    f"--CourseDirectory.release_directory={release_dir}",
                    f"--CourseDirectory.db_url=sqlite:///{tmp}/gradebook.db",
                    "--log-level=WARN",
                ],
                cwd=ROOT,
                env=tool_env(),
                check=True,
            )
            mark_hidden_checks(release_dir / name / f"{name}.ipynb", solution_path(name))


def mark_hidden_checks(released: Path, solution: Path) -> None:
    """Mark each test cell of a student version whose solution has hidden checks (the mark only).

    ``metadata["course"]["hidden_checks"]`` is what Validate reads to tell a student how many points
    hidden checks are worth (:mod:`devcourse.validation`); nbgrader's checksums do not cover
    metadata.
    """
    hidden = {
        nbgrader_meta(cell)["grade_id"]
        for cell in nbformat.read(solution, as_version=4).cells
        if is_test(cell) and has_hidden(cell.source)
    }
    nb = nbformat.read(released, as_version=4)
    for cell in nb.cells:
        if is_test(cell) and nbgrader_meta(cell)["grade_id"] in hidden:
            cell.metadata["course"] = {"hidden_checks": True}
    nbformat.write(nb, released)


def student_version(solution: Path, destination: Path) -> None:
    """Write ``solution`` with its answers replaced by stubs but its hidden tests kept.

    It is what a student who wrote nothing would hand in, graded with every
    test the instructor has: no test should pass on it.
    """
    from nbgrader.preprocessors import ClearOutput, ClearSolutions

    config = course_config()  # the same stub nbgrader writes into course/
    nb = nbformat.read(solution, as_version=4)
    resources: dict = {}
    for preprocessor in (ClearSolutions(config=config), ClearOutput(config=config)):
        nb, resources = preprocessor.preprocess(nb, resources)
    destination.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, destination)


def validate(notebook: Path, invert: bool = False) -> tuple[bool, str]:
    """Run ``nbgrader validate`` (``--invert``: every test must fail); return (ok, output).

    ``nbgrader validate`` exits 0 whatever the outcome, so the verdict is read
    from its output.
    """
    command = [sys.executable, "-m", "nbgrader", "validate", str(notebook)]
    if invert:
        command.append("--invert")
    done = subprocess.run(
        command, cwd=notebook.parent, env=tool_env(), capture_output=True, text=True
    )
    output = done.stdout + done.stderr
    verdict = (
        "Success! The notebook does not pass any tests."
        if invert
        else "Success! Your notebook passes all the tests."
    )
    return verdict in output, output


# What a student waits for, on two cores: a notebook run top to bottom, and Validate of a finished
# one.
RUN_LIMIT_S, VALIDATE_LIMIT_S = 60.0, 30.0


def machine() -> str:
    """The CPU this runs on and its number of cores, for timings printed beside it."""
    import platform

    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return (
        f"{model},"
        f" {len(os.sched_getaffinity(0)) if hasattr(os, 'sched_getaffinity') else os.cpu_count()}"
        " cores"
    )


def timings(assignment: str) -> tuple[float, float]:
    """Seconds to run the solution notebook top to bottom in a fresh kernel, and to ``nbgrader
    validate`` it."""
    import time

    from nbclient import NotebookClient

    with tempfile.TemporaryDirectory() as tmp:
        copy = _copy_as_solution(assignment, Path(tmp))
        nb = nbformat.read(copy, as_version=4)
        start = time.monotonic()
        NotebookClient(
            nb,
            timeout=CELL_TIMEOUT_S,
            kernel_name="python3",
            resources={"metadata": {"path": str(copy.parent)}},
        ).execute(stderr=subprocess.DEVNULL)
        run_s = time.monotonic() - start
        start = time.monotonic()
        passes, output = validate(copy)
        validate_s = time.monotonic() - start
        if not passes:
            raise RuntimeError(f"{assignment}: the solution does not validate:\n{output}")
    return run_s, validate_s


def _copy_as_solution(assignment: str, into: Path) -> Path:
    target = into / assignment / f"{assignment}.ipynb"
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copy(solution_path(assignment), target)
    return target


def times(names: list[str]) -> int:
    """Print how long each notebook of ``names`` runs and Validate takes, against the limits; 1 if
    one is over."""
    print(f"on {machine()}; limits: run {RUN_LIMIT_S:g} s, Validate {VALIDATE_LIMIT_S:g} s")
    print(f"{'notebook':<34} {'run (s)':>8} {'Validate (s)':>13}")
    over = []
    for name in names:
        run_s, validate_s = timings(name)
        flags = (" run over" if run_s > RUN_LIMIT_S else "") + (
            " Validate over" if validate_s > VALIDATE_LIMIT_S else ""
        )
        print(f"{name:<34} {run_s:8.1f} {validate_s:13.1f}{flags}", flush=True)
        over += [name] if flags else []
    return 1 if over else 0


def both_ways(names: list[str]) -> int:
    """Print, for each of ``names``, whether its solution passes every test and its student version
    none; 1 if one does not (with nbgrader's output)."""
    failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name in names:
            passes, out = validate(_copy_as_solution(name, Path(tmp) / "solutions"))
            stub = Path(tmp) / "students" / name / f"{name}.ipynb"
            student_version(solution_path(name), stub)
            fails_all, out_inverted = validate(stub, invert=True)
            print(
                f"{name}: solution passes all tests: {passes}; student version passes none:"
                f" {fails_all}"
            )
            for ok, text in ((passes, out), (fails_all, out_inverted)):
                if not ok:
                    failed += 1
                    print(text)
    return 1 if failed else 0
