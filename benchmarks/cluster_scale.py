"""Grade a class replicated to N submissions on a Dask cluster of 1, then 2 workers; project a term
at scale.

    python benchmarks/cluster_scale.py [--submissions 200] [--assignments 00_environment]
                                       [--workers 1,2] [--project-workers 50] [--no-feedback]
                                       [--feedback-in-line]

The honest demo students' submissions (``ada``, ``grace``, ``linus``,
``margaret``) of the chosen assignments are copied round-robin into one
class of ``--submissions`` students (``ada-001``, ``grace-002``, ...). The
class is graded by ``python -m autograder grade --dask-local W`` once per
worker count W, each run in a work folder of its own, one after another in
this one run: the canary, the sandbox, the probes, the gradebook, each
student's feedback, all of it, as an instructor's run does it
(``--no-feedback`` leaves the feedback out). The feedback pages are made by a
process of their own (``--feedback-apart yes``), as a cluster's grader does
by itself, its machine running no notebook (here the local workers share the
machine, so auto would choose otherwise); ``--feedback-in-line`` has the
grader make them itself, one job at a time. Every copy must get the score
its original gets in ``expected_scores.csv``.

It prints, per worker count, the wall time, submissions per minute and per
worker, the speedup over one worker (the ratio against the baseline of this
same run), and two costs that set what a big cluster can do:

* the worker's cost of one notebook: the runner's time in the sandbox (from
  the grader's state file), which more workers divide;
* the grader's own cost of one notebook: its time between a job's results
  arriving and the next (judging, nbgrader's autograde, the gradebook write,
  the feedback when made in line; the state file's ``last_run``), spent one
  job at a time on the grader's machine however many workers there are;
* the feedback process's cost of one notebook (its processor time for the
  pages), also one at a time, beside the grader.

From them, "on paper": the wall time of ``--project-students`` students x
``--project-notebooks`` notebooks on ``--project-workers`` workers, as the
largest of the workers' share and the two serial parts.

On a CPU-only machine everything runs on the CPU; with 2 cores, more than 2
workers only compete for them.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# the autograder package of this checkout
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from autograder.course.config import tool_env
from devcourse.instructor.demo import EXPECTED_SCORES
from devcourse.instructor.paths import DEMO_CLASS, ROOT
from page import WRITE_PAGE_HELP, write_row

HONEST = ["ada", "grace", "linus", "margaret"]


def replicate(assignments: list[str], count: int, folder: Path) -> dict[tuple[str, str], str]:
    """``count`` submissions copied round-robin from the honest students; returns (copy, assignment)
    -> original."""
    originals = [
        (student, name)
        for name in assignments
        for student in HONEST
        if (DEMO_CLASS / student / name).is_dir()
    ]
    if not originals:
        raise SystemExit(f"no honest demo submission of {', '.join(assignments)}")
    made = {}
    for index in range(count):
        student, name = originals[index % len(originals)]
        copy = f"{student}-{index:03d}"
        shutil.copytree(DEMO_CLASS / student / name, folder / copy / name)
        made[copy, name] = student
    return made


def grade(submitted: Path, workdir: Path, workers: int, feedback: str = "apart") -> float:
    """``feedback``: "apart" (a process of its own), "in-line" (the grader's), or "none"."""
    started = time.perf_counter()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "autograder",
            "grade",
            "--submitted",
            str(submitted),
            "--workdir",
            str(workdir),
            "--dask-local",
            str(workers),
            "--quiet",
            *{
                "apart": ["--feedback-apart", "yes"],
                "in-line": ["--feedback-apart", "no"],
                "none": ["--no-feedback"],
            }[feedback],
        ],
        cwd=ROOT,
        env=tool_env(),
        capture_output=True,
        text=True,
    )
    took = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(
            f"grading with {workers} worker(s) failed"
            f" ({done.returncode}):\n{done.stdout}\n{done.stderr}"
        )
    return took


def check_scores(workdir: Path, made: dict[tuple[str, str], str]) -> None:
    with EXPECTED_SCORES.open() as handle:
        expected = {(r["student"], r["assignment"]): r["score"] for r in csv.DictReader(handle)}
    with (workdir / "scores.csv").open() as handle:
        got = {(r["student"], r["assignment"]): r["score"] for r in csv.DictReader(handle)}
    wrong = [
        f"{copy}/{name}: {got.get((copy, name))!r}, expected {expected[original, name]!r}"
        for (copy, name), original in made.items()
        if got.get((copy, name)) != expected[original, name]
    ]
    if wrong:
        raise SystemExit(
            f"scores differ from expected_scores.csv in {workdir}:\n" + "\n".join(wrong[:20])
        )


def costs(workdir: Path) -> tuple[float, float, float]:
    """From the grader's state file: the runners' time, all jobs together, the grader's own time for
    them, and the feedback process's (0 with the feedback in line or none)."""
    state = json.loads((workdir / "state.json").read_text())
    return (
        sum(row.get("seconds", 0) for row in state["rows"].values()),
        state["last_run"]["grader_s"],
        state["last_run"].get("feedback_apart_s", 0.0),
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--submissions", type=int, default=200)
    parser.add_argument(
        "--assignments", default="00_environment", help="comma-separated (default 00_environment)"
    )
    parser.add_argument(
        "--workers", default="1,2", help="worker counts to grade with, the first is the baseline"
    )
    parser.add_argument("--project-workers", type=int, default=50)
    parser.add_argument("--project-students", type=int, default=1000)
    parser.add_argument("--project-notebooks", type=int, default=9)
    parser.add_argument(
        "--no-feedback", action="store_true", help="grade without the students' feedback"
    )
    parser.add_argument(
        "--feedback-in-line",
        action="store_true",
        help="the grader makes the feedback itself (default: a process of its own beside it)",
    )
    parser.add_argument("--write-page", action="store_true", help=WRITE_PAGE_HELP)
    args = parser.parse_args()
    counts = [int(part) for part in args.workers.split(",")]
    feedback = "none" if args.no_feedback else "in-line" if args.feedback_in_line else "apart"
    assignments = args.assignments.split(",")
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.system()}; "
        f"{args.submissions} submissions of {', '.join(assignments)}; workers {counts}; "
        f"{'no feedback' if args.no_feedback else 'feedback made ' + feedback.replace('-', ' ')}",
        flush=True,
    )
    with tempfile.TemporaryDirectory(prefix="cluster-scale-") as place:
        root = Path(place)
        made = replicate(assignments, args.submissions, root / "submitted")
        runs = []
        for workers in counts:
            workdir = root / f"work-{workers}"
            wall = grade(root / "submitted", workdir, workers, feedback)
            check_scores(workdir, made)
            busy, own, pages = costs(workdir)
            runs.append((workers, wall, busy, own, pages))
            print(
                f"{workers} worker(s): {wall:.0f} s wall, {60 * len(made) / wall:.1f}"
                f" submissions/min, {60 * len(made) / wall / workers:.1f} per worker per min;"
                f" runners busy {busy:.0f} s in all, the grader's own handling {own:.0f} s"
                + (f", the feedback process's {pages:.0f} s" if pages else ""),
                flush=True,
            )
    base_workers, base_wall, base_busy, base_own, base_pages = runs[0]
    for workers, wall, *_ in runs[1:]:
        print(f"speedup of {workers} workers over {base_workers}: {base_wall / wall:.2f}x")
    per_job = base_busy / len(made)  # a worker's time for one notebook
    # the grader's own, per notebook: one at a time however many workers
    serial = base_own / len(made)
    # the feedback process's, per notebook: one at a time too, beside the grader
    apart = base_pages / len(made)
    notebooks = args.project_students * args.project_notebooks
    shares = {
        "the workers": notebooks * per_job / args.project_workers,
        "the grader": notebooks * serial,
        "the feedback process": notebooks * apart,
    }
    pace = max(shares, key=shares.get)
    print(
        f"per notebook: {per_job:.1f} s on a worker, {serial:.2f} s on the grader (wall not spent"
        f" in runners, {base_workers} worker(s))"
        + (f", {apart:.2f} s in the feedback process" if apart else "")
    )
    print(
        f"on paper: {args.project_students} students x {args.project_notebooks} notebooks ="
        f" {notebooks} notebooks on {args.project_workers} workers like these:"
        f" {shares[pace] / 3600:.2f} h ({pace} set the pace; "
        + ", ".join(f"{who} {seconds / 3600:.2f} h" for who, seconds in shares.items())
        + ")"
    )
    if args.write_page:
        walls = " and ".join(f"{wall:.0f} s" for _, wall, *_ in runs)
        speedups = ", ".join(f"{base_wall / wall:.2f}x" for _, wall, *_ in runs[1:])
        write_row(
            __file__,
            f"{args.submissions} submissions of {', '.join(assignments)}, workers {counts}: {walls}"
            + (f": {speedups}" if speedups else ""),
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
