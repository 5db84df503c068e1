"""``python -m autograder review STUDENT/ASSIGNMENT --release|--confirm``: decide a withheld
score."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autograder.course.paths import WORKDIR
from autograder.record.gradebook import gradebook_url
from autograder.record.review import ReviewError, confirm, release
from autograder.settings import Settings

DESCRIPTION = "Review a withheld score: release it (graded as it ran) or confirm it (0 points)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder review", description=DESCRIPTION)
    parser.add_argument("pair", metavar="STUDENT/ASSIGNMENT")
    decision = parser.add_mutually_exclusive_group(required=True)
    decision.add_argument("--release", action="store_true", help="grade it as it ran")
    decision.add_argument("--confirm", action="store_true", help="keep 0 points")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=WORKDIR,
        help="the grading run's work folder (default: build/grade)",
    )
    parser.add_argument(
        "--db-url", default=None, help="the gradebook the run used (default: as grade finds it)"
    )
    args = parser.parse_args(argv)
    student, _, assignment = args.pair.partition("/")
    if not student or not assignment:
        parser.error("name the submission as STUDENT/ASSIGNMENT")
    workdir = args.workdir.resolve()
    try:
        db_url = gradebook_url(Settings(db_url=args.db_url), workdir)
        if args.release:
            score = release(workdir, student, assignment, db_url)
            print(f"{args.pair}: released, {score:g} points")
        else:
            confirm(workdir, student, assignment, db_url)
            print(f"{args.pair}: confirmed, 0 points")
    except ReviewError as error:
        print(f"review: {error}", file=sys.stderr)
        return 2
    return 0
