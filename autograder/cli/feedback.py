"""``python -m autograder feedback COURSE ASSIGNMENT``: an assignment's feedback again, as
formgrader holds it now."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autograder.course.directory import CourseError
from autograder.record.feedback import regenerate


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m autograder feedback",
        description=(
            "Make an assignment's feedback again in a course directory, with the scores and"
            " comments formgrader holds now; then nbgrader release_feedback sends it."
        ),
    )
    parser.add_argument("course", type=Path, help="the course directory")
    parser.add_argument("assignment")
    parser.add_argument("--student", action="append", help="only this student (repeatable)")
    args = parser.parse_args(argv)
    try:
        notes = regenerate(args.course, args.assignment, args.student)
    except CourseError as error:
        print(f"feedback: {error}", file=sys.stderr)
        return 2
    for (student, name), lines in sorted(notes.items()):
        print(f"{student} {name}: " + "; ".join(lines), file=sys.stderr)
    made = sorted((args.course / "feedback").glob(f"*/{args.assignment}/*.html"))
    print(f"Feedback for {args.assignment}: {len(made)} page(s) in {args.course / 'feedback'}")
    return 1 if notes else 0
