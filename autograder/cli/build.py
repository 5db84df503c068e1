"""``python -m autograder build execute|course|both-ways|times [NAMES]``: this course's notebooks, from solutions/."""

from __future__ import annotations

import argparse

from autograder.course import build
from autograder.course.paths import COURSE, ROOT, assignments, solution_path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder build",
                                     description="Turn instructor notebooks into everything else, and prove each "
                                                 "exercise both ways.")
    sub = parser.add_subparsers(dest="command", required=True)
    for command, what in (("execute", "re-run solution notebooks and store their outputs"),
                          ("course", "regenerate course/ from solutions/"),
                          ("both-ways", "solutions pass every test; student versions pass none"),
                          ("times", f"how long each notebook runs (limit {build.RUN_LIMIT_S:g} s) and Validate "
                                    f"takes (limit {build.VALIDATE_LIMIT_S:g} s); exit 1 if one is over")):
        sub.add_parser(command, help=what).add_argument("names", nargs="*", help="assignments (default: all)")
    args = parser.parse_args(argv)
    names = args.names or assignments()
    unknown = sorted(set(names) - set(assignments()))
    if unknown:
        parser.error(f"no such assignment: {', '.join(unknown)} (have: {', '.join(assignments())})")
    if args.command == "execute":
        for name in names:
            print(f"executing {solution_path(name).relative_to(ROOT)}")
            build.execute(solution_path(name))
    elif args.command == "course":
        build.generate_course(names=names)
        print(f"wrote {', '.join(names)} into {COURSE.relative_to(ROOT)}/")
    elif args.command == "times":
        return build.times(names)
    else:
        return build.both_ways(names)
    return 0
