"""``python -m autograder course init DIR`` / ``course due DIR NAME=WHEN``: a course directory for a
term."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autograder.course.config import course_config
from autograder.course.directory import CONFIG, CourseError, init, is_course_dir, parse_due, set_due

DESCRIPTION = (
    "The instructor's course directory: made once per term, then every nbgrader command and the"
    " grader use it"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder course", description=DESCRIPTION)
    commands = parser.add_subparsers(dest="command", required=True)
    make = commands.add_parser(
        "init", help="make a course directory with every assignment released"
    )
    make.add_argument("folder", type=Path, help="a new or empty folder")
    make.add_argument(
        "--db-url",
        help=(
            "the gradebook, e.g. postgresql://user:password@host/db "
            "(default: SQLite, gradebook.db in the folder)"
        ),
    )
    make.add_argument(
        "--exchange", help="nbgrader's exchange folder (default: exchange/ in the folder)"
    )
    make.add_argument(
        "--course-id",
        help=f"nbgrader's course id (default: {course_config().CourseDirectory.course_id})",
    )
    make.add_argument(
        "--due",
        action="append",
        default=[],
        metavar="NAME=WHEN",
        help="an assignment's due date, e.g. ps1='2026-10-05 17:00 UTC' (repeatable)",
    )
    later = commands.add_parser("due", help="set due dates in a course directory's gradebook")
    later.add_argument("folder", type=Path)
    later.add_argument(
        "due",
        nargs="+",
        metavar="NAME=WHEN",
        help="WHEN as in init, or now (closes it this moment)",
    )
    args = parser.parse_args(argv)
    try:
        if args.command == "init":
            names = init(
                args.folder, args.db_url, parse_due(args.due), args.exchange, args.course_id
            )
            print(
                f"Course directory {args.folder.resolve()}: {len(names)} assignments in source/ and"
                " release/."
            )
            print(
                "Next: nbgrader release_assignment NAME (from that folder), then collect, then "
                f"python -m autograder grade --course {args.folder}"
            )
        else:
            if not is_course_dir(args.folder):
                raise CourseError(f"{args.folder} is not a course directory (no {CONFIG})")
            due = parse_due(args.due)
            set_due(args.folder, due)
            print("Due: " + ", ".join(f"{name} {when}" for name, when in due.items()))
    except CourseError as error:
        print(f"course: {error}", file=sys.stderr)
        return 2
    return 0
