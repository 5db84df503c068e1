"""Where the grader finds a course: the course's folder it runs from, as nbgrader's commands do, and
its source.

A course's folder holds ``nbgrader_config.py`` and the instructor's notebooks in its
``source_directory`` (a course directory, :mod:`autograder.course.directory`, or a course's
repository). Run from one, the grader grades a folder of submissions against that source in a work
folder of its own (``build/grade`` there by default).
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

# the folder holding the grader's package: its processes start there
HOME = Path(__file__).resolve().parents[2]
CONFIG = "nbgrader_config.py"
WORKDIR = Path("build") / "grade"  # relative to the course's folder the grader runs from

# A copy an LMS or a browser renamed: ``00_environment (1).ipynb``, ``00_environment-1.ipynb``.
RENAMED = re.compile(r"^(?P<stem>.+?)(?: \(\d+\)|-\d+)$")


def course_folder(folder: Path | None = None) -> Path | None:
    """The course's folder the grader runs from (``folder``, default the current one): where it
    holds ``nbgrader_config.py`` and the source folder that names; None where it does not."""
    folder = Path.cwd() if folder is None else Path(folder).resolve()
    if not (folder / CONFIG).is_file():
        return None
    return folder if source_of(folder, config_in(folder)).is_dir() else None


def config_in(folder: Path):
    """The settings of the ``nbgrader_config.py`` in ``folder`` (a traitlets ``Config``)."""
    from traitlets.config.loader import PyFileConfigLoader

    return PyFileConfigLoader(CONFIG, path=str(Path(folder).resolve())).load_config()


def source_of(folder: Path, config) -> Path:
    """The instructor's notebooks of the course in ``folder``: its
    ``CourseDirectory.source_directory``."""
    return folder / config.get("CourseDirectory", {}).get("source_directory", "source")


def source_assignments(source: Path) -> list[str]:
    """The assignments of a course's source: its folders that hold a notebook, by name (nbgrader's
    layout)."""
    return (
        sorted(p.name for p in source.iterdir() if p.is_dir() and any(p.glob("*.ipynb")))
        if source.is_dir()
        else []
    )


def copy_source(source: Path, target: Path, ignore: list[str]) -> None:
    """Copy a course's ``source`` into ``target``, less what ``ignore`` (its
    ``CourseDirectory.ignore``) names: checkpoints, caches, and files a notebook writes beside
    itself when it runs. Left out, they neither reach the students nor change what the grader keys
    the canary's references on."""
    shutil.copytree(source, target, dirs_exist_ok=True, ignore=shutil.ignore_patterns(*ignore))
