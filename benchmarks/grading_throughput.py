"""Grade the same submissions with plain sequential nbgrader and with make grade; print the ratio.

    python benchmarks/grading_throughput.py [--students ada,grace,linus,margaret] [--assignments
    00_environment,...]

Six runs over the same copy of some demo students' submissions, one after
another in this one run:

1. plain nbgrader, as an instructor runs it: ``nbgrader generate_assignment``,
   ``autograde`` and ``generate_feedback`` for each assignment, sequentially;
2. the notebooks nbgrader graded in run 1 (the student's answers with the
   instructor's tests, hidden ones included), outputs cleared, each executed
   alone in a fresh kernel, one after another: the baseline for the grader's
   overhead;
3. ``make grade`` (``python -m autograder grade``, one notebook per core and
   more while a core is idle, sandboxed where the machine allows it, feedback
   included);
4. ``make grade --jobs 1``: its wall time over run 2, per notebook, is the
   grader's own cost for one notebook, everything included (its start, the
   sandbox, the guard, the gradebook, the feedback).
5. ``make grade`` again, in a new work folder, with the references run 3
   kept: the canary is not run again, as in a grading whose references were
   made ahead (``--canary all`` while the students work, as
   docs/instructors.md does) or kept by an earlier day's;
6. ``make grade --jobs 1`` with those references: run 4 without the canary,
   the grader's cost for one notebook.

Runs 3 and 4 run the instructor's solutions first (``--rerun-canary``), as
a grading without references made ahead must. The targets are judged on
runs 5 and 6, where ``make grade`` runs the same notebooks as plain
nbgrader: the canary's notebooks are a fixed cost per assignment, the same
for a class of four as for a class of a thousand, so in this benchmark's
class of four they weigh a hundred times what they weigh in a real one.
Runs 3 and 4 are printed beside them, with the most any grader could reach
with the canary in the run.

Targets on 2 cores: run 5 grades at least 3 times as fast as run 1, and the
overhead per notebook (run 6 over run 2) is at most 0.3 s. Where run 4's time went is printed
from its jobs' status files: starting each kernel (off the notebook's time
when it was started ahead, see ``--no-warm``) and running the notebooks,
the instructor's solutions (the canary) included. Where the cores' time went in runs 3 and 5
is printed too (:mod:`autograder.record.profile`): the notebooks' and the canary's processor
time, kernel starts, the runners, the grader, no process computing, all of it beyond the
notebooks' own (which a change to the grader moves whatever the machine's speed that day), and
the cores no job held before the first job, between jobs and after the last one began. Also
checks that plain nbgrader and make grade give every submission the same score. Exits 1 if a
target is missed.

It also prints the most a grader could gain on this machine: run 2's
processor time (the kernels' and every process they started, user and
system), spread over all the cores without a gap, is the least time in which
these notebooks can run once each in kernels started fresh; with the second
pass of their tests (run 6's probes) added, it is about the least time for
grading them as ``make grade`` does, and with the canary's cells and probes
(run 4) added, for a grading that runs the canary. Run 1 over each of those is about the
most this grader can reach here (a kernel forked from the zygote costs less
to start than a fresh one, so not a strict bound). And it prints run 6's
overhead without the probes: the grader's own cost per notebook, beyond the
second pass of the tests that its verdict needs.

Only students whose code is harmless take part by default: plain nbgrader
runs student code with the instructor's rights and no limits, so the demo
class's cheats (one of them writes to any file it can find), its endless loop
and its 12 GiB cache are left out.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import torch
from nbclient import NotebookClient

# the autograder package of this checkout
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from devcourse.instructor.build import copy_solutions
from autograder.course.config import course_config, tool_env
from autograder.record.profile import profile
from autograder.run.cgroups import usable_cores
from autograder.run.idle import busy_s
from devcourse.instructor.paths import DEMO_CLASS, ROOT, SOLUTIONS
from page import WRITE_PAGE_HELP, machine, write_block, write_row

HONEST = ["ada", "grace", "linus", "margaret"]
TARGET_SPEEDUP = 3.0
TARGET_OVERHEAD_S = 0.3


def copy_class(
    students: list[str], folder: Path, assignments: list[str] | None = None
) -> list[Path]:
    """Copy the students' submissions into ``folder`` (of ``assignments`` only, when given); return
    their notebooks."""
    known = sorted(path.name for path in SOLUTIONS.iterdir() if path.is_dir())
    unknown = sorted(set(assignments or ()) - set(known))
    if unknown:
        raise SystemExit(f"no assignment named {', '.join(unknown)} (have: {', '.join(known)})")
    for student in students:
        if not (DEMO_CLASS / student).is_dir():
            raise SystemExit(f"no demo student named {student!r} in {DEMO_CLASS}")
        (folder / student).mkdir(parents=True)
        for submission in sorted((DEMO_CLASS / student).iterdir()):  # one folder per assignment
            if not assignments or submission.name in assignments:
                shutil.copytree(submission, folder / student / submission.name)
    notebooks = sorted(folder.glob("*/*/*.ipynb"))
    if not notebooks:
        raise SystemExit("those students submitted none of those assignments")
    return notebooks


def children_cpu_s() -> float:
    """Processor time, user and system, of this process's children that have ended (and theirs), in
    seconds."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def execute_alone(notebooks: list[Path], timeout: float, sockets: Path) -> tuple[float, float]:
    """Run 2: every notebook, outputs cleared, in a fresh kernel of its own, errors allowed, one
    after another.

    The kernel talks over IPC sockets, as the grader's kernels do. Returns the wall time and the
    kernels' processor time (each kernel is this process's child and is waited for; the processes a
    notebook starts are waited for by its kernel, so theirs is counted too).
    """
    from jupyter_client.manager import AsyncKernelManager
    from jupyter_core.utils import run_sync

    sockets.mkdir()
    cpu = children_cpu_s()
    started = time.perf_counter()
    for index, path in enumerate(notebooks):
        nb = nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code":
                cell.outputs, cell.execution_count = [], None
        manager = AsyncKernelManager(
            transport="ipc",
            ip=str(sockets / f"k{index}"),
            connection_file=str(sockets / f"k{index}.json"),
        )
        try:
            NotebookClient(
                nb,
                km=manager,
                timeout=timeout,
                allow_errors=True,
                resources={"metadata": {"path": str(path.parent)}},
            ).execute()
        finally:
            run_sync(manager.shutdown_kernel)(now=True)
    return time.perf_counter() - started, children_cpu_s() - cpu


def plain_nbgrader(submitted: Path, workdir: Path) -> float:
    """Run 1: nbgrader's own commands, one assignment after another, as documented."""
    workdir.mkdir(parents=True)
    shutil.copy(ROOT / "nbgrader_config.py", workdir)
    # less what nbgrader ignores, as an instructor's course has it
    copy_solutions(workdir / "source")
    shutil.copytree(submitted, workdir / "submitted")
    assignments = sorted({path.name for path in submitted.glob("*/*") if path.is_dir()})
    flags = [
        "--CourseDirectory.source_directory=source",
        "--CourseDirectory.release_directory=release",
        f"--CourseDirectory.db_url=sqlite:///{workdir / 'gradebook.db'}",
        "--force",
        "--log-level=ERROR",
    ]
    started = time.perf_counter()
    for name in assignments:
        for command in ["generate_assignment", "autograde", "generate_feedback"]:
            _quietly([sys.executable, "-m", "nbgrader", command, name, *flags], workdir)
    return time.perf_counter() - started


# a make grade run's work folder -> its start and end (seconds since the epoch), and the processor
# time the machine spent while it ran (None where it cannot be read): its processes are not all
# among this process's waited-for children (a kernel's sandbox reaps its own), so the machine's
# count, on a machine otherwise quiet
WALL: dict[Path, tuple[float, float]] = {}
CPU: dict[Path, float | None] = {}


def make_grade(
    submitted: Path, workdir: Path, jobs: int | None, warm: bool = True, kept: bool = False
) -> float:
    """Runs 3 to 6: the course's grading command, as ``make grade`` runs it, each in a work folder
    of its own.

    It includes what plain nbgrader does not do: the run of the instructor's solution of every
    assignment it grades (the canary, which is also the reference each test's probe is judged
    against), and the second pass of each notebook's tests as probes. Runs 3 and 4 run the canary
    (``--rerun-canary``), as a grading without references made ahead does; runs 5 and 6 (``kept``)
    reuse the references run 3 kept, as a grading whose references were made ahead, or kept by an
    earlier run on the same machine with the same solutions and packages, does
    (:mod:`autograder.judge.reference`).
    """
    started, WALL[workdir], busy = time.perf_counter(), (time.time(), 0.0), busy_s()
    _quietly(
        [
            sys.executable,
            "-m",
            "autograder",
            "grade",
            "--submitted",
            str(submitted),
            "--workdir",
            str(workdir),
            *(["--jobs", str(jobs)] if jobs else []),
            "--quiet",
            "--reference-cache",
            str(workdir.parent / "references"),
            *([] if kept else ["--rerun-canary"]),
            *([] if warm else ["--no-warm"]),
        ],
        ROOT,
    )
    WALL[workdir], after = (WALL[workdir][0], time.time()), busy_s()
    CPU[workdir] = after - busy if busy is not None and after is not None else None
    return time.perf_counter() - started


def _quietly(command: list[str], cwd: Path) -> None:
    """Run a command; show what it printed only if it fails."""
    done = subprocess.run(command, cwd=cwd, env=tool_env(), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(
            f"failed ({done.returncode}): {' '.join(command)}\n{done.stdout}\n{done.stderr}"
        )


def statuses(workdir: Path) -> dict[Path, dict]:
    return {path: json.loads(path.read_text()) for path in sorted(workdir.rglob("status.json"))}


def canary_jobs(found: dict[Path, dict]) -> list[dict]:
    return [s for path, s in found.items() if "(canary)" in path.parts]


def total(key: str, jobs) -> float:
    """The sum of one time of the jobs' status files (a job stopped early may have none)."""
    return sum(s.get(key) or 0 for s in jobs)


def where_time_went(found: dict[Path, dict]) -> str:
    """Run 4's jobs, from their status files: their kernels' starts, their cells, their probes, the
    canary's share."""
    canary = canary_jobs(found)
    starts = [s["start_s"] for s in found.values() if s.get("start_s") is not None]
    return (
        f"{len(found)} jobs, {len(canary)} of them the canary's: kernel starts {sum(starts):.1f} s"
        f" ({sum(starts) / max(1, len(starts)):.2f} s each,"
        f" {sum(1 for s in found.values() if s.get('warm'))} started ahead), cells"
        f" {total('cells_s', found.values()):.1f} s, probes {total('probes_s', found.values()):.1f}"
        " s; the canary's cells and probes"
        f" {total('cells_s', canary) + total('probes_s', canary):.1f} s"
    )


def plain_scores(workdir: Path) -> dict[tuple[str, str], float]:
    from nbgrader.api import Gradebook

    with Gradebook(
        f"sqlite:///{workdir / 'gradebook.db'}", course_config().CourseDirectory.course_id
    ) as book:
        return {
            (s.student.id, s.assignment.name): s.score
            for a in book.assignments
            for s in book.assignment_submissions(a.name)
        }


def our_scores(workdir: Path) -> dict[tuple[str, str], float]:
    with (workdir / "scores.csv").open() as handle:
        return {
            (row["student"], row["assignment"]): float(row["score"])
            for row in csv.DictReader(handle)
            if row["score"] != ""
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--students",
        default=",".join(HONEST),
        help="demo students to grade, comma-separated (default: %(default)s)",
    )
    parser.add_argument(
        "--assignments",
        default="",
        help="grade only these assignments, comma-separated (default: all the students submitted)",
    )
    parser.add_argument(
        "--no-warm",
        action="store_true",
        help="make grade --no-warm (kernels started at their turn)",
    )
    parser.add_argument(
        "--jobs",
        type=int,
        default=None,
        help="make grade --jobs in runs 3 and 5 (default: none, make grade's own, one per core and"
        " more while a core is idle)",
    )
    parser.add_argument("--write-page", action="store_true", help=WRITE_PAGE_HELP)
    args = parser.parse_args()
    students = [name.strip() for name in args.students.split(",") if name.strip()]
    timeout = float(course_config().ExecutePreprocessor.timeout)
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.system()}; torch"
        f" {torch.__version__}"
    )
    with tempfile.TemporaryDirectory(prefix="grading-benchmark-") as tmp:
        tmp = Path(tmp)
        # the sandboxed kernels run as nobody and must reach their copies below
        os.chmod(tmp, 0o755)
        assignments = [name.strip() for name in args.assignments.split(",") if name.strip()]
        notebooks = copy_class(students, tmp / "class", assignments)
        count = len(notebooks)
        print(
            f"{count} notebooks of {len(students)} students"
            f" ({', '.join(students)}){' in ' + ', '.join(assignments) if assignments else ''};"
            f" cell timeout {timeout:g} s\n"
        )
        graded = [
            tmp / "plain" / "autograded" / path.relative_to(tmp / "class") for path in notebooks
        ]
        warm = not args.no_warm
        jobs_flag = f" --jobs {args.jobs}" if args.jobs else ""
        alone_cpu = []

        def alone_run(notebooks, timeout, sockets):
            wall, cpu = execute_alone(notebooks, timeout, sockets)
            alone_cpu.append(cpu)
            return wall

        runs = [
            (
                "1. plain nbgrader: generate, autograde, feedback",
                lambda: plain_nbgrader(tmp / "class", tmp / "plain"),
            ),
            (
                "2. each graded notebook executed alone",
                lambda: alone_run(graded, timeout, tmp / "sockets"),
            ),
            (
                f"3. make grade{jobs_flag}",
                lambda: make_grade(tmp / "class", tmp / "ours", args.jobs, warm),
            ),
            ("4. make grade --jobs 1", lambda: make_grade(tmp / "class", tmp / "ours1", 1, warm)),
            (
                f"5. make grade{jobs_flag}, references ready",
                lambda: make_grade(tmp / "class", tmp / "ours5", args.jobs, warm, kept=True),
            ),
            (
                "6. make grade --jobs 1, references ready",
                lambda: make_grade(tmp / "class", tmp / "ours6", 1, warm, kept=True),
            ),
        ]
        seconds = []
        for label, run in runs:
            seconds.append(run())
            print(
                f"{label:<56} {seconds[-1]:7.1f} s  ({seconds[-1] / count:5.1f} s per notebook)",
                flush=True,
            )
        plain, alone, ours, ours_one, ours_kept, ours_one_kept = seconds
        for later in ("ours5", "ours6"):
            if any((tmp / later / "jobs" / "(canary)").glob("*")):
                raise SystemExit(
                    f"run {later[-1]} ran the canary: the references of run 3 were not kept"
                )
        print(f"   run 2: the kernels' processor time {alone_cpu[0]:.1f} s")
        run4 = statuses(tmp / "ours1")
        print(f"   run 4: {where_time_went(run4)}")
        probes_s = total("probes_s", statuses(tmp / "ours6").values())
        canary = canary_jobs(run4)
        canary_s = total("cells_s", canary) + total("probes_s", canary)
        print(f"   run 6: the probes (each test's second pass) {probes_s:.1f} s")
        profiles = {}
        for number, folder in (("3", "ours"), ("5", "ours5")):
            cores = args.jobs or usable_cores()
            found = profile(tmp / folder, *WALL[tmp / folder], cores, CPU[tmp / folder])
            profiles[number] = found.lines()
            print(f"   run {number}, where the cores' time went: " + "\n   ".join(found.lines()))
        plain_result, our_result = plain_scores(tmp / "plain"), our_scores(tmp / "ours")
        for later in ("ours5", "ours6"):
            if our_scores(tmp / later) != our_result:
                raise SystemExit(f"run {later[-1]} scored differently from run 3")

    speedup, speedup_canary = plain / ours_kept, plain / ours
    overhead, overhead_canary = (ours_one_kept - alone) / count, (ours_one - alone) / count
    cores = os.cpu_count() or 1
    floor_once, floor_graded = alone_cpu[0] / cores, (alone_cpu[0] + probes_s) / cores
    floor_first = floor_graded + canary_s / cores
    differ = {
        pair: (plain_result.get(pair), our_result.get(pair))
        for pair in sorted(set(plain_result) | set(our_result))
        if plain_result.get(pair) != our_result.get(pair)
    }
    result = (
        f"throughput: make grade {speedup:.2f}x plain nbgrader on the same notebooks, the"
        f" references ready (target at least {TARGET_SPEEDUP}x on 2 cores)"
    )
    # what the targets of the throughput are judged on: the share of the most possible reached
    reached, reached_canary = (
        speedup / (plain / floor_graded),
        speedup_canary / (plain / floor_first),
    )
    print(f"\n{result}")
    print(f"            {reached:.0%} of the most possible with the probes")
    print(
        "            with the canary run in the grading (no references made ahead):"
        f" {speedup_canary:.2f}x, {reached_canary:.0%} of the most possible with it"
    )
    print(
        f"            most possible on these {cores} cores: {plain / floor_once:.2f}x running each"
        f" notebook once ({floor_once:.1f} s), {plain / floor_graded:.2f}x with the probes"
        f" ({floor_graded:.1f} s), {plain / floor_first:.2f}x with the canary's cells and probes"
        f" too ({floor_first:.1f} s)"
    )
    print(
        f"overhead of make grade over executing alone: {overhead:+.2f} s per notebook, the"
        f" references ready (target at most {TARGET_OVERHEAD_S:g} s),"
        f" {overhead - probes_s / count:+.2f} s of it beside the probes' {probes_s / count:.2f} s"
    )
    print(f"            with the canary run in the grading: {overhead_canary:+.2f} s per notebook")
    print(
        f"scores: plain nbgrader and make grade agree on all {len(our_result)} submissions"
        if not differ
        else "scores differ (student, assignment: plain, make grade): "
        + "; ".join(f"{s}/{a}: {p}, {o}" for (s, a), (p, o) in differ.items())
    )
    if args.write_page:
        write_row(
            __file__,
            f"{speedup:.2f}x plain nbgrader with the references ready, {reached:.0%} of the most"
            f" possible ({plain / floor_graded:.2f}x); with the canary in the run"
            f" {speedup_canary:.2f}x, {reached_canary:.0%} of {plain / floor_first:.2f}x;"
            f" {overhead:+.2f} s per notebook over executing alone",
        )
        runs = [(label, wall) for (label, _), wall in zip(runs, seconds)]
        limits = [
            ("references ready", speedup, plain / floor_graded, "with the probes"),
            ("canary in the run", speedup_canary, plain / floor_first, "with the canary's too"),
        ]
        write_block(__file__, page_block(runs, count, limits, profiles, not differ))
    return 0 if speedup >= TARGET_SPEEDUP and overhead <= TARGET_OVERHEAD_S and not differ else 1


def page_block(
    runs: list[tuple[str, float]],
    count: int,
    limits: list[tuple[str, float, float, str]],
    profiles: dict[str, list[str]],
    agree: bool,
) -> str:
    """The benchmark's block of docs/benchmarks.md: each run's time, the throughput against the most
    possible, and where the cores' time went in runs 3 and 5."""
    lines = [
        f"Its latest run, on {machine()}, printed:",
        "",
        "| run | wall | per notebook |",
        "|---|---|---|",
        *(f"| {label} | {wall:.1f} s | {wall / count:.1f} s |" for label, wall in runs),
        "",
        "| throughput | make grade | most possible | reached |",
        "|---|---|---|---|",
        *(
            f"| {name} | **{got:.2f}x** | {most:.2f}x ({how}) | **{got / most:.0%}** |"
            for name, got, most, how in limits
        ),
        "",
        "Every submission got the same score both ways."
        if agree
        else "Some submissions were scored differently (see the script's output).",
    ]
    for number, profile_lines in profiles.items():
        lines += ["", f"Where the cores' time went in run {number}:", "", "```"]
        lines += [*profile_lines, "```"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
