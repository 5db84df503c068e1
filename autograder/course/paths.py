"""Where this course's own files are in its checkout: the solutions, the student versions, the demo class.

Every path here is inside the repository; a grader installed elsewhere, grading another course, uses none
of them (see :mod:`autograder.course.directory` for a course directory of any course).
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the folder holding the autograder package: the checkout, or site-packages
SOLUTIONS = ROOT / "solutions"
COURSE = ROOT / "course"
STUDENTS_GUIDE = ROOT / "docs" / "students.md"
DEMO_CLASS = ROOT / "demo_class" / "submitted"
WORKDIR = ROOT / "build" / "grade"

# A copy an LMS or a browser renamed: ``00_environment (1).ipynb``, ``00_environment-1.ipynb``.
RENAMED = re.compile(r"^(?P<stem>.+?)(?: \(\d+\)|-\d+)$")


def checkout() -> Path | None:
    """This course's checkout, where the grader runs from one (its solutions and nbgrader_config.py beside the
    package); None for a grader installed from a wheel."""
    return ROOT if (ROOT / "solutions").is_dir() and (ROOT / "nbgrader_config.py").is_file() else None


def assignments() -> list[str]:
    """The assignment names, in teaching order: ``solutions/NN_topic/NN_topic.ipynb``."""
    return sorted(p.parent.name for p in SOLUTIONS.glob("*/*.ipynb") if p.stem == p.parent.name)


def solution_path(assignment: str) -> Path:
    return SOLUTIONS / assignment / f"{assignment}.ipynb"


def demo_due() -> dict[str, str]:
    """The demo class's due dates (UTC), weekly from 2026-09-07 17:00, for its work folder's gradebook; one of
    its submissions is late."""
    first = datetime(2026, 9, 7, 17, tzinfo=timezone.utc)
    return {name: (first + timedelta(weeks=number)).strftime("%Y-%m-%d %H:%M:%S UTC")
            for number, name in enumerate(assignments())}
