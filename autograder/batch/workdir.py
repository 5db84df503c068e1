"""The work folder of a run: its copy of the course and of the submissions, and what earlier runs
left in it."""

from __future__ import annotations

import contextlib
import shutil
import sys
from pathlib import Path

from autograder.batch.stop import ChoiceError
from autograder.course.config import config_of, course_directory
from autograder.course.directory import is_course_dir
from autograder.course.paths import RENAMED, copy_source, course_folder, source_of
from autograder.prepare.submission import fingerprint
from autograder.record.gradebook import EXECUTED
from autograder.record.state import StateError, WorkState, read_state, write_state
from autograder.settings import Pair

# a submission's time (late penalty), feedback key
SUBMISSION_FILES = ("timestamp.txt", "submission_secret.txt")


def submitted_notebook(folder: Path, notebook: str) -> Path | None:
    """``folder/<notebook>.ipynb``, else the newest copy an LMS or a browser renamed (``<notebook>
    (1).ipynb``, ``<notebook>-2.ipynb``), else None."""
    exact = folder / f"{notebook}.ipynb"
    if exact.is_file():
        return exact
    copies = [
        path
        for path in folder.glob("*.ipynb")
        if path.is_file()
        and (match := RENAMED.match(path.stem))
        and match.group("stem") == notebook
    ]
    return max(copies, key=lambda path: (path.stat().st_mtime, path.name), default=None)


def take_in(intake: Path, workdir: Path) -> None:
    """Copy each ``intake/<student>/<assignment>/`` folder into ``workdir/submitted/`` where it
    differs."""
    for folder in sorted(intake.glob("*/*")):
        if not folder.is_dir() or folder.name.startswith(".") or folder.parent.name.startswith("."):
            continue
        target = workdir / "submitted" / folder.parent.name / folder.name
        if target.is_dir() and fingerprint(target, recursive=True) == fingerprint(
            folder, recursive=True
        ):
            continue
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(folder, target, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))


def open_workdir(workdir: Path, intake: Path | None) -> WorkState:
    """Ready ``workdir`` for a run; return its state.

    A course directory (:mod:`autograder.course.directory`) is never emptied: its ``source/`` is the
    instructor's, and when it changed every submission is graded again. Any other work folder
    mirrors the source of the course's folder the grader runs from
    (:func:`~autograder.course.paths.course_folder`) and one submissions folder; it is emptied first
    when either differs from its last run's.
    """
    course_dir = is_course_dir(workdir)
    source = workdir / "source" if course_dir else _course_source()
    course = fingerprint(source, recursive=True, suffix=".ipynb")
    try:
        state = read_state(workdir)
    except StateError as error:
        # every submission is graded afresh; the gradebook keeps what it had
        print(f"{error}: grading every submission as if for the first time", file=sys.stderr)
        state = None
    if not course_dir and (
        state is None or state.course != course or state.intake != (str(intake) if intake else None)
    ):
        if workdir.exists():
            shutil.rmtree(workdir)
        workdir.mkdir(parents=True)
        copy_source(source, workdir / "source", course_directory(workdir).ignore)
        state = None
    # the instructor's decisions on withheld scores stay
    if state is None or state.course != course:
        state = WorkState(
            course=course,
            intake=str(intake) if intake else None,
            **({"withheld": state.withheld, "reviewed": state.reviewed} if state else {}),
        )
    state.finished = False
    (workdir / "submitted").mkdir(exist_ok=True)
    if intake is not None:
        take_in(intake, workdir)
    write_state(workdir, state)
    return state


def _course_source() -> Path:
    folder = course_folder()
    if folder is None:
        raise ChoiceError(
            f"{Path.cwd()} is not a course's folder (its nbgrader_config.py and source folder): run"
            " from one, or grade a course directory (--course DIR)"
        )
    return source_of(folder, config_of(folder))


def has_earlier(workdir: Path, state: WorkState, pair: tuple[str, str]) -> bool:
    """Whether an earlier run left anything of the pair: a score, a withheld or reviewed row,
    executed notebooks."""
    return state.earlier(Pair(*pair).key) or (workdir / EXECUTED / pair[0] / pair[1]).exists()


def discard(workdir: Path, pairs: list[tuple[str, str]]) -> None:
    """What a stopped run's unfinished pairs wrote is not graded: nothing of it stays."""
    for student, name in pairs:
        shutil.rmtree(workdir / "jobs" / student / name, ignore_errors=True)
        with contextlib.suppress(OSError):
            (workdir / "jobs" / student).rmdir()  # if no other assignment of theirs is there
