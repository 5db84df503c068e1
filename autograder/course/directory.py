"""The instructor's course directory: made once per term, then every nbgrader command and the grader
use it.

``python -m autograder course init DIR`` (:func:`init`) lays out what nbgrader expects and the
grader adds (``nbgrader_config.py``, ``source/``, ``release/``, the gradebook, the exchange); later
nbgrader's ``submitted/``, ``autograded/``, ``feedback/`` and the grader's own files join them. Due
dates are kept in the gradebook (:func:`set_due`).
"""

from __future__ import annotations

from pathlib import Path

from autograder.course.config import (
    config_of,
    course_config,
    course_directory,
    gradebook_problem,
    tools_on_path,
)
from autograder.course.paths import (
    CONFIG,
    copy_source,
    course_folder,
    source_assignments,
    source_of,
)

# Paths and the gradebook are this folder's own; everything else is the course's policy, from the
# repository.
OWN = {
    ("CourseDirectory", name)
    for name in ("root", "source_directory", "release_directory", "db_url")
}


class CourseError(Exception):
    """A course directory that cannot be made or used; the message says why."""


def is_course_dir(folder: Path) -> bool:
    return (Path(folder) / CONFIG).is_file()


def config_text(db_url: str | None, exchange: str | None, course_id: str | None) -> str:
    """The course directory's nbgrader_config.py: the course's policy, then this folder's own
    settings."""
    policy = course_config()
    lines = [
        (
            '"""nbgrader settings of this course directory (written by python -m autograder course'
            " init)."
        ),
        "",
        "Paths are relative to this file's folder, so the folder can be moved. Run nbgrader and",
        "formgrader from this folder.",
        '"""',
        "",
        "import os",
        "",
        "c = get_config()  # noqa: F821",
        "",
        (
            "# The course's policy (stubs, time limits, late penalty), as the course repository"
            " sets it."
        ),
    ]
    for section in sorted(policy):
        for name, value in sorted(policy[section].items()):
            if (
                (section, name) in OWN
                or (section, name) == ("CourseDirectory", "course_id")
                and course_id
            ):
                continue
            lines.append(f"c.{section}.{name} = {value!r}")
    lines += [
        "",
        "# This course directory.",
        "HERE = os.path.dirname(os.path.abspath(__file__))",
        "c.CourseDirectory.root = HERE",
        'c.CourseDirectory.source_directory = "source"',
        'c.CourseDirectory.release_directory = "release"',
    ]
    if course_id:
        lines.append(f"c.CourseDirectory.course_id = {course_id!r}")
    lines.append(
        f"c.CourseDirectory.db_url = {db_url!r}"
        if db_url
        else 'c.CourseDirectory.db_url = "sqlite:///" + os.path.join(HERE, "gradebook.db")'
    )
    lines += [
        (
            "# Where students fetch assignments and submit them; on a shared JupyterHub, a folder"
            " every"
        ),
        "# student can write to (nbgrader's default is /srv/nbgrader/exchange).",
        (
            f"c.Exchange.root = {exchange!r}"
            if exchange
            else 'c.Exchange.root = os.path.join(HERE, "exchange")'
        ),
    ]
    return "\n".join(lines) + "\n"


def parse_due(items: list[str]) -> dict[str, str]:
    """``NAME=WHEN`` pairs -> {name: when}; WHEN as nbgrader reads it (``2026-10-05 17:00 UTC``), or
    ``now``.

    ``now`` is this moment to the microsecond, as nbgrader stamps a submission:
    what was handed in before it is on time, what comes after is late.
    """
    from datetime import datetime, timezone

    from nbgrader.utils import parse_utc

    due = {}
    for item in items:
        name, _, when = item.partition("=")
        if not name or not when:
            raise CourseError(
                f"a due date is NAME=WHEN, e.g. ps1='2026-10-05 17:00 UTC'; got {item!r}"
            )
        if when.strip().lower() == "now":
            when = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M:%S.%f UTC")
        try:
            parse_utc(when)
        except (ValueError, OverflowError) as error:
            raise CourseError(f"cannot read the due date {when!r} of {name}: {error}") from None
        due[name] = when
    return due


def set_due(folder: Path, due: dict[str, str], db_url: str | None = None) -> None:
    """Record due dates in the course directory's gradebook (the late penalty counts from them)."""
    from nbgrader.api import Gradebook
    from nbgrader.utils import parse_utc

    settings = course_directory(folder)
    known = {p.name for p in (Path(folder) / "source").iterdir() if p.is_dir()}
    unknown = sorted(set(due) - known)
    if unknown:
        raise CourseError(f"no assignment named {', '.join(unknown)} in {folder}/source")
    with tools_on_path(), Gradebook(db_url or settings.db_url, settings.course_id) as gradebook:
        for name, when in due.items():
            gradebook.update_or_create_assignment(name, duedate=parse_utc(when))


def _api(folder: Path):
    """nbgrader's API on the course directory ``folder``, as its own ``nbgrader_config.py`` sets
    it."""
    from nbgrader.apps import NbGraderAPI

    return NbGraderAPI(config=config_of(folder))


def init(
    folder: Path,
    db_url: str | None = None,
    due: dict[str, str] | None = None,
    exchange: str | None = None,
    course_id: str | None = None,
) -> list[str]:
    """Make a course directory in ``folder`` (absent or empty) with every assignment of the course's
    folder the command runs from (:func:`~autograder.course.paths.course_folder`) released; return
    their names.

    It holds ``nbgrader_config.py`` (course id, stubs, late policy, this folder's paths, the
    gradebook's URL, the exchange's folder), ``source/NAME/`` (copied from the course's source,
    edited here for the term), ``release/NAME/`` (nbgrader generate_assignment), ``gradebook.db``
    unless ``db_url`` names PostgreSQL, and ``exchange/`` unless ``exchange`` names another. The
    grader never empties a course directory: grading again grades what is new or changed
    (:mod:`autograder.batch`).
    """
    folder = Path(folder).resolve()
    course = course_folder()
    if course is None:
        raise CourseError(
            f"run this from a course's folder (its {CONFIG} and source folder, such as the course's"
            f" repository): its source is what the course directory gets; {Path.cwd()} is not one"
        )
    if is_course_dir(folder):
        raise CourseError(
            f"{folder} is a course directory already; its gradebook and submissions are kept"
        )
    if folder.exists() and any(folder.iterdir()):
        raise CourseError(f"{folder} is not empty: make the course directory in a new folder")
    if db_url and (problem := gradebook_problem(db_url)):
        raise CourseError(f"cannot open the gradebook at {db_url.split('@')[-1]}: {problem}")
    folder.mkdir(parents=True, exist_ok=True)
    source = source_of(course, config_of(course))
    names = source_assignments(source)
    try:
        copy_source(source, folder / "source", course_directory(course).ignore)
        (folder / CONFIG).write_text(config_text(db_url, exchange, course_id))
        if db_url:  # it may hold the database's password: the instructor's to read alone
            (folder / CONFIG).chmod(0o600)
        with tools_on_path():
            api = _api(folder)
            for name in names:
                outcome = api.generate_assignment(name, force=True)
                if not outcome["success"]:
                    raise CourseError(
                        f"nbgrader could not release {name}: "
                        f"{outcome.get('error') or outcome.get('log')}"
                    )
        set_due(folder, due or {}, db_url)
    except BaseException:
        (folder / CONFIG).unlink(missing_ok=True)  # not a course directory: init can be run again
        raise
    return names
