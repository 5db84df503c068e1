"""The grader's own cost of one graded notebook in a class's first gradebook rows, and in a full
term's gradebook.

    python benchmarks/gradebook_growth.py [--students 1000] [--assignments
    00_environment,07_multi_device_training]
                                          [--repeat 5]

``benchmarks/cluster_scale.py`` projects a class of a thousand from the
grader's handling of one notebook measured in a class of 200 (nbgrader's
autograde of the executed notebook into the gradebook, and its feedback);
that handling is serial on the grader however many workers there are, so
if it grew with the gradebook, the projection would be short. This
measures it both ways in one run, in one SQLite gradebook:

1. ``python -m autograder grade`` grades the demo student ``ada``'s
   submissions of ``--assignments`` (the canary included), as a class's
   first grading does;
2. the baseline: nbgrader's ``autograde`` and ``generate_feedback`` of each
   of those submissions again, as the grader calls them for each finished
   job, ``--repeat`` times (the median is kept);
3. every assignment of the course released into the gradebook, and
   ``--students`` more students each given a submission of every assignment
   with nbgrader's own ``Gradebook.add_submission`` (empty grades, the rows
   a term's grading leaves);
4. step 2 again in that gradebook.

It prints both medians per assignment and their ratio. Nothing here needs a
GPU: the checks run where ``make grade`` runs them (the CPU and the simulated
device on a machine without one).
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# the autograder package of this checkout
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from autograder.course.config import tool_env
from devcourse.instructor.paths import DEMO_CLASS, ROOT
from page import WRITE_PAGE_HELP, write_row

STUDENT = "ada"


def handling(api, assignments: list[str], repeat: int) -> dict[str, float]:
    """The median seconds of nbgrader's autograde plus feedback of ``STUDENT``'s submission of each
    assignment."""
    took = {}
    for name in assignments:
        runs = []
        for _ in range(repeat):
            began = time.perf_counter()
            graded = api.autograde(name, STUDENT, force=True, create=True)
            fed = api.generate_feedback(name, STUDENT, force=True)
            runs.append(time.perf_counter() - began)
            if not (graded["success"] and fed["success"]):
                raise SystemExit(
                    "nbgrader could not grade"
                    f" {STUDENT}/{name}:\n{graded.get('log')}\n{fed.get('log')}"
                )
        took[name] = statistics.median(runs)
    return took


def fill(api, db_url: str, course_id: str, students: int) -> tuple[int, float]:
    """Release every assignment into the gradebook; give ``students`` new students a submission of
    each."""
    from nbgrader.api import Gradebook

    source = Path(api.coursedir.root) / "source"
    names = sorted(p.name for p in source.iterdir() if p.is_dir() and any(p.glob("*.ipynb")))
    for name in names:
        outcome = api.generate_assignment(name, force=True)
        if not outcome["success"]:
            raise SystemExit(
                f"could not release {name}:\n{outcome.get('error') or outcome.get('log')}"
            )
    began = time.perf_counter()
    with Gradebook(db_url, course_id) as gradebook:
        for index in range(students):
            student = f"student-{index:05d}"
            gradebook.add_student(student)
            for name in names:
                gradebook.add_submission(name, student)
    return len(names), time.perf_counter() - began


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--students", type=int, default=1000)
    parser.add_argument(
        "--assignments",
        default="00_environment,07_multi_device_training",
        help=(
            "comma-separated: the submissions of ada timed (default: the smallest and the longest)"
        ),
    )
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--write-page", action="store_true", help=WRITE_PAGE_HELP)
    args = parser.parse_args()
    assignments = args.assignments.split(",")
    missing = [name for name in assignments if not (DEMO_CLASS / STUDENT / name).is_dir()]
    if missing:
        raise SystemExit(f"{STUDENT} of the demo class submitted no {', '.join(missing)}")
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.system()}; {STUDENT}'s "
        f"{', '.join(assignments)}; {args.students} more students; median of {args.repeat}",
        flush=True,
    )

    from autograder.course.config import config_of
    from autograder.record.gradebook import grading_environment, nbgrader_api

    with tempfile.TemporaryDirectory(prefix="gradebook-growth-") as place:
        root = Path(place)
        for name in assignments:
            shutil.copytree(DEMO_CLASS / STUDENT / name, root / "submitted" / STUDENT / name)
        workdir = root / "work"
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "autograder",
                "grade",
                "--submitted",
                str(root / "submitted"),
                "--workdir",
                str(workdir),
                "--quiet",
            ],
            cwd=ROOT,
            env=tool_env(),
            capture_output=True,
            text=True,
        )
        if done.returncode != 0:
            raise SystemExit(
                f"the grading failed ({done.returncode}):\n{done.stdout}\n{done.stderr}"
            )
        db_url = f"sqlite:///{workdir / 'gradebook.db'}"
        api = nbgrader_api(workdir, db_url)
        with grading_environment():
            before = handling(api, assignments, args.repeat)
            released, filling = fill(
                api, db_url, config_of(workdir).CourseDirectory.course_id, args.students
            )
            print(
                f"gradebook filled: {args.students} students x {released} assignments = "
                f"{args.students * released} submissions in {filling:.0f} s",
                flush=True,
            )
            after = handling(api, assignments, args.repeat)
    for name in assignments:
        print(
            f"{name}: {before[name]:.3f} s with 1 student, {after[name]:.3f} s with"
            f" {args.students + 1}: {after[name] / before[name]:.2f}x"
        )
    total_before, total_after = sum(before.values()), sum(after.values())
    result = (
        f"all timed: {total_after / total_before:.2f}x the grader's autograde and feedback of a"
        " notebook in the full gradebook"
    )
    print(result)
    if args.write_page:
        write_row(__file__, result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
