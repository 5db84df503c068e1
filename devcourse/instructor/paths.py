"""Where this course's own files are in its checkout: the solutions, the student versions, the demo
class."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

# the course's checkout: devcourse is installed editable from it
ROOT = Path(__file__).resolve().parents[2]
SOLUTIONS = ROOT / "solutions"
COURSE = ROOT / "course"
STUDENTS_GUIDE = ROOT / "docs" / "students.md"
DEMO_DIR = ROOT / "demo_class"
DEMO_CLASS = DEMO_DIR / "submitted"
EXPECTED_SCORES = DEMO_DIR / "expected_scores.csv"
WORKDIR = ROOT / "build" / "grade"


def assignments() -> list[str]:
    """The assignment names, in teaching order: ``solutions/NN_topic/NN_topic.ipynb``."""
    return sorted(p.parent.name for p in SOLUTIONS.glob("*/*.ipynb") if p.stem == p.parent.name)


def solution_path(assignment: str) -> Path:
    return SOLUTIONS / assignment / f"{assignment}.ipynb"


def demo_due() -> dict[str, str]:
    """The demo class's due dates (UTC), weekly from 2026-09-07 17:00, for its work folder's
    gradebook; one of its submissions is late."""
    first = datetime(2026, 9, 7, 17, tzinfo=timezone.utc)
    return {
        name: (first + timedelta(weeks=number)).strftime("%Y-%m-%d %H:%M:%S UTC")
        for number, name in enumerate(assignments())
    }
