"""``python -m autograder grade``: autograde a class, sandboxed, in parallel, with limits (``make grade``).

Prints what it checks and how, grades (:func:`autograder.batch.grade`), then prints the table and writes
``scores.csv``, ``scores.png`` and ``report.txt`` into the work folder. Exit codes: 0 graded, 2 bad input or a
cluster that cannot run a job, 3 the instructor's solution did not pass, 128 + N stopped by signal N.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import sys
import time
from pathlib import Path

from autograder.batch import INTERRUPTS, ChoiceError, GradingStopped, grade
from autograder.cli.guide import guide, shown
from autograder.course.config import gradebook_problem, shown_url
from autograder.course.directory import CourseError, is_course_dir, parse_due
from autograder.course.paths import WORKDIR, course_folder
from autograder.course.profile import CourseProfile, ProfileError, profile_name_of, profile_named
from autograder.judge.reference import CACHE_ENV, REFERENCES, CanaryFailed
from autograder.record.gradebook import gradebook_url
from autograder.record.report import format_table, write_csv, write_histogram
from autograder.record.state import StateError, read_state
from autograder.run import bytecode, cgroups, sandbox
from autograder.run.cgroups import usable_cores
from autograder.run.executors import ClusterError, start_zygote_early
from autograder.run.executors.cluster import check_scheduler
from autograder.run.process import RUNNERS
from autograder.run.watch import RUN_MARKER
from autograder.settings import (
    CELL_TIMEOUT_S,
    DISK_LIMIT_MIB,
    GRADEBOOK_ENV,
    MAX_CODE_CELLS,
    MAX_NOTEBOOK_MIB,
    MAX_PROCESSES,
    MEMORY_LIMIT_MIB,
    RECORDED_LIMIT_MIB,
    TIME_LIMIT_S,
    WALL_PER_PROCESSOR_S,
    Limits,
    Pair,
    Settings,
)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m autograder grade", description=__doc__.split("\n\n")[0],
                                     epilog="Writes report.txt, scores.csv, scores.png and feedback/ "
                                            "in the work folder.")
    _what(parser)
    _limits(parser)
    _record(parser)
    _how(parser)
    _cluster(parser)
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    return parser


def _what(parser: argparse.ArgumentParser) -> None:
    """What is graded: whose submissions, of which assignments, where."""
    parser.add_argument("--course", type=Path, metavar="DIR",
                        help="an nbgrader course directory (nbgrader quickstart, or python -m autograder course init): "
                             "grade what its submitted/ holds (nbgrader collect, zip_collect) into its gradebook; "
                             "nothing in it is emptied")
    parser.add_argument("--submitted", type=Path, default=None,
                        help="folder of <student>/<assignment>/ submissions, copied into the work folder's "
                             "submitted/ first (default: the course's demo class, where its profile has one; "
                             "none with --course)")
    parser.add_argument("--workdir", type=Path, default=WORKDIR,
                        help="work folder without --course, emptied when the course or the submissions folder "
                             "differ from its last run's (default: build/grade in the course's folder)")
    parser.add_argument("--assignment", action="append", default=[], metavar="NAME",
                        help="grade only this assignment (repeatable; default: all)")
    parser.add_argument("--student", action="append", default=[], metavar="ID",
                        help="grade only this student (repeatable; default: all)")
    parser.add_argument("--regrade", action="store_true",
                        help="grade the chosen submissions again even if unchanged since an earlier run graded "
                             "them (by default only new or changed submissions are graded)")
    parser.add_argument("--due", action="append", default=[], metavar="NAME=WHEN",
                        help="record an assignment's due date first, e.g. ps1='2026-10-05 17:00 UTC' "
                             "(repeatable; a demo class has its own)")


def _limits(parser: argparse.ArgumentParser) -> None:
    """How much each submission may use."""
    parser.add_argument("--jobs", type=int, default=usable_cores(),
                        help="notebooks graded at once (default: one per core this process may use, here %(default)s)")
    parser.add_argument("--cell-timeout", type=float, default=CELL_TIMEOUT_S, metavar="SECONDS",
                        help="processor-time limit of one cell, all its processes together (default: %(default)g; "
                             f"wall time: {WALL_PER_PROCESSOR_S}x as much)")
    parser.add_argument("--time-limit", type=float, default=TIME_LIMIT_S, metavar="SECONDS",
                        help="processor-time limit of one notebook (default: %(default)g; wall time: "
                             f"{WALL_PER_PROCESSOR_S}x as much)")
    parser.add_argument("--memory-limit-mib", type=int, default=MEMORY_LIMIT_MIB, metavar="MIB",
                        help="memory limit of every process of a submission, 0 for none (default: %(default)s)")
    parser.add_argument("--disk-limit-mib", type=int, default=DISK_LIMIT_MIB, metavar="MIB",
                        help="all that a submission writes, together, with namespaces (a tmpfs of this size, "
                             "in memory), 0 for none (default: %(default)s)")
    parser.add_argument("--max-processes", type=int, default=MAX_PROCESSES, metavar="N",
                        help="processes and threads of a submission, together, 0 for no limit (default: %(default)s)")
    parser.add_argument("--recorded-limit-mib", type=int, default=RECORDED_LIMIT_MIB, metavar="MIB",
                        help="what the tests of one notebook record, together, when the grader runs them again; a "
                             "notebook past it gets 0 points (default: %(default)s)")


def _record(parser: argparse.ArgumentParser) -> None:
    """Where scores and feedback go."""
    parser.add_argument("--db-url", default=None,
                        help=f"gradebook URL, e.g. postgresql://user:password@host/db for several graders "
                             f"(default: ${GRADEBOOK_ENV}, else SQLite in the work folder)")
    parser.add_argument("--no-feedback", action="store_true", help="skip the feedback HTML")
    parser.add_argument("--feedback-apart", choices=("auto", "yes", "no"), default="auto",
                        help="make the feedback HTML in a process of its own while the grader goes on: yes, no, or "
                             "auto (the default): where this machine has a core left over from the jobs and the "
                             "grader, as a cluster's grader has")


def _how(parser: argparse.ArgumentParser) -> None:
    """How the notebooks run: sandbox, references, warm starts."""
    parser.add_argument("--no-sandbox", action="store_true",
                        help="run kernels without namespaces (limits on time and memory still hold)")
    parser.add_argument("--canary", choices=("graded", "all"), default="graded",
                        help="run the instructor's solution first, in the same sandbox, and stop unless it gets "
                             "full marks (its run is the reference submissions are judged against): of each "
                             "assignment that has submissions to grade, or of every assignment chosen (--assignment), "
                             "submissions or not: run before the deadline, it makes the references the first grading "
                             "then reuses (default: %(default)s); "
                             "a reference kept from an earlier run is reused while the solution, the grader, "
                             "Python's packages, the devices and the limits are the same")
    parser.add_argument("--rerun-canary", action="store_true",
                        help="run the instructor's solution even where a kept reference could be reused")
    parser.add_argument("--reference-cache", metavar="DIR", default=None,
                        help="also keep references in DIR, shared by several work folders on this machine "
                             f"(default: ${CACHE_ENV} if set; the work folder keeps its own either way)")
    parser.add_argument("--keep-work", action="store_true",
                        help="keep each submission's working copy (jobs/STUDENT/ASSIGNMENT/NOTEBOOK/work, with what "
                             "its kernel wrote: the kernel writes there, not to a bounded tmpfs, so --disk-limit-mib "
                             "does not hold) after grading; by default it is removed once the notebook is graded")
    parser.add_argument("--no-warm", action="store_true",
                        help="start no kernel before its job's turn (by default, on this machine, the kernels of "
                             "the next --jobs notebooks start in their sandboxes, the course's packages imported, "
                             "while the current ones run: as many more kernels in memory, the start off each "
                             "notebook's time)")
    parser.add_argument("--no-zygote", action="store_true",
                        help="start every runner and kernel as a new Python (by default, on Linux with the sandbox's "
                             "namespaces, they are forked from one process that has imported IPython and the "
                             "course's packages once, so no kernel imports them itself)")


def _cluster(parser: argparse.ArgumentParser) -> None:
    """Where the notebooks run: this machine, or a Dask cluster."""
    cluster = parser.add_mutually_exclusive_group()
    cluster.add_argument("--scheduler", metavar="tcp://HOST:PORT",
                         help="run the jobs on this Dask scheduler's workers (each in the same sandbox, on its "
                              "machine; start workers with python -m autograder worker ADDRESS)")
    cluster.add_argument("--dask-local", type=int, default=0, metavar="N",
                         help="start a Dask cluster of N worker processes on this machine for the run")
    parser.add_argument("--gpu-jobs", action="store_true",
                        help="on a Dask cluster, each job asks for the resource GPU=1 (workers started with --gpu K)")


def main(argv: list[str] | None = None) -> int:
    options = parser()
    args = options.parse_args(argv)
    problem = _check(args, options)
    if problem is not None:
        return problem
    settings = _settings(args, options)
    # Every process of this run carries the marker (a test or a wrapper may have chosen it): the zygote's too.
    os.environ.setdefault(RUN_MARKER, secrets.token_hex(8))
    start_zygote_early(settings)
    db_url = gradebook_url(settings, args.workdir)
    if settings.db_url or os.environ.get(GRADEBOOK_ENV):
        problem = gradebook_problem(db_url)
        if problem:
            options.exit(2, f"cannot open the gradebook at {shown_url(db_url)}: {problem}\n")
    header = _header(args, settings, db_url)
    print("\n".join(header), flush=True)
    started = time.monotonic()
    try:
        with INTERRUPTS.installed():
            results = grade(args.submitted, args.workdir, settings)
    except (ChoiceError, ClusterError) as error:
        print(f"grade: {error}", file=sys.stderr, flush=True)
        return 2
    except CanaryFailed as failure:
        print(str(failure), file=sys.stderr, flush=True)
        return 3
    except GradingStopped as stopped:
        print(stopped_text(stopped, args.workdir), file=sys.stderr, flush=True)
        return 128 + stopped.signum if stopped.signum else 2
    except KeyboardInterrupt:  # before the first student: the canary or the set-up
        RUNNERS.stop()
        print(f"grading was stopped by {signal.Signals(INTERRUPTS.received).name} before any student was graded",
              file=sys.stderr, flush=True)
        return 128 + INTERRUPTS.received
    profile = profile_named(settings.profile)
    demo = profile.demo_class()
    demo_graded = (demo is not None and args.submitted is not None
                   and args.submitted.resolve() == demo.submitted.resolve())
    _report(results, args.workdir.resolve(), settings, header, time.monotonic() - started, profile, demo=demo_graded)
    return 0


def _check(args, options: argparse.ArgumentParser) -> int | None:
    """Bad input said in one line (argparse exits 2); the exit code where a cluster does not answer."""
    if args.gpu_jobs and not (args.scheduler or args.dask_local):
        options.error("--gpu-jobs is for a Dask cluster: add --scheduler or --dask-local")
    if args.scheduler:
        try:
            check_scheduler(args.scheduler)  # first: an address that does not answer costs seconds, not a set-up
        except ClusterError as error:
            print(f"grade: {error}", file=sys.stderr, flush=True)
            return 2
    if args.course is not None:
        if not is_course_dir(args.course):
            options.error(f"{args.course} is not a course directory (no nbgrader_config.py): make one with "
                          "nbgrader quickstart, or python -m autograder course init")
        args.workdir = args.course
    elif course_folder() is None:  # --submitted alone grades against the course's source, where the grader runs
        options.error("name the course to grade: --course DIR, an nbgrader course directory (nbgrader quickstart), "
                      "or run from a course's folder (its nbgrader_config.py and source folder)")
    elif args.submitted is None:
        demo = _profile(args.workdir, options).demo_class()
        if demo is None:
            options.error("name the submissions to grade: --submitted DIR (a folder of <student>/<assignment>/), or "
                          "--course DIR to grade what a course directory's submitted/ holds")
        args.submitted = demo.submitted
    if args.submitted is not None and not args.submitted.is_dir():
        options.error(f"no submissions folder at {args.submitted}")
    return None


def _settings(args, options: argparse.ArgumentParser) -> Settings:
    try:
        due = parse_due(args.due) if args.due else None
    except CourseError as error:
        options.error(str(error))
    profile = profile_name_of(args.workdir)
    _profile(args.workdir, options)  # a profile that cannot be used stops here, in one line
    limits = Limits(cell_timeout_s=args.cell_timeout, time_limit_s=args.time_limit, memory_mib=args.memory_limit_mib,
                    disk_mib=args.disk_limit_mib, max_processes=args.max_processes,
                    recorded_mib=args.recorded_limit_mib)
    return Settings(profile=profile, jobs=args.jobs, limits=limits, db_url=args.db_url,
                    feedback=not args.no_feedback,
                    feedback_apart={"auto": None, "yes": True, "no": False}[args.feedback_apart],
                    progress=not args.quiet, sandbox=not args.no_sandbox, canary=args.canary,
                    rerun_canary=args.rerun_canary, reference_cache=args.reference_cache,
                    keep_work=args.keep_work, assignments=tuple(args.assignment), students=tuple(args.student),
                    regrade=args.regrade, due=due, scheduler=args.scheduler, dask_local=args.dask_local,
                    gpu_jobs=args.gpu_jobs, warm=not args.no_warm, zygote=not args.no_zygote)


def _profile(workdir: Path, options: argparse.ArgumentParser) -> CourseProfile:
    """The grading profile the work folder's course names; one that cannot be used ends the command in one line."""
    try:
        return profile_named(profile_name_of(workdir))
    except ProfileError as error:
        options.error(str(error))


def _header(args, settings: Settings, db_url: str) -> list[str]:
    """What the run says before it starts: what is graded where, the devices, the limits, the references."""
    isolation, limits = sandbox.isolation_of(settings), settings.limits
    profile = profile_named(settings.profile)
    devices, not_checked = profile.devices(), profile.not_checked()
    where = (f"on the Dask scheduler at {settings.scheduler}" if settings.scheduler else
             f"on a Dask cluster of {settings.dask_local} local worker(s)" if settings.dask_local else
             f"with {settings.jobs} notebook(s) at a time")
    header = [f"Grading {args.submitted or args.course / 'submitted'} {where}.",
              f"Gradebook: {shown_url(db_url)}",
              *([f"Devices every submission is checked on: {devices}"] if devices else []),
              *(f"Not checked on this machine (the checks that ask for it say so in their output): {machine}"
                for machine in not_checked),
              "Limits on each submission:",
              *(f"  {line}" for line in isolation.describe(limits.memory_mib, limits.time_limit_s,
                                                             limits.cell_timeout_s,
                                                             0 if settings.keep_work else limits.disk_mib,
                                                             limits.max_processes, cgroups.find().describe(),
                                                             cgroups.find().counts_cpu)),
              f"  notebook: at most {MAX_CODE_CELLS} code cells and {MAX_NOTEBOOK_MIB} MiB, and "
              f"{limits.recorded_mib} MiB of values its tests record together; past one, 0 points for it",
              *bytecode.advice(bytecode.uncompiled())]
    checked_first = {"graded": "of each assignment with submissions",
                     "all": "of every assignment" + (" chosen" if settings.assignments else "")}[settings.canary]
    # It runs before the progress bar starts: say what the wait is for.
    header.append(f"First the instructor's solution {checked_first} runs in the same sandbox "
                  f"(--canary {settings.canary}), new submissions starting beside it: the reference for the grading; "
                  f"it stops unless it gets full marks. "
                  f"A reference kept from an earlier run with the same solution, grader, packages, devices and "
                  f"limits is reused (--rerun-canary runs it anyway).")
    return header


def _report(results, workdir: Path, settings: Settings, header: list[str], seconds: float, profile: CourseProfile,
            demo: bool = False) -> None:
    if not results:  # no submissions yet: a run that made the references ahead (--canary all) says so
        print(references_text(workdir, settings), flush=True)
        return
    results_shown = shown(results, settings.assignments, settings.students)
    table = format_table(results_shown)
    write_csv(results, workdir / "scores.csv")
    write_histogram(results, workdir / "scores.png")
    footer = (f"Graded in {seconds:.0f} s. Written to {workdir}: scores.csv, scores.png, report.txt"
              + (", feedback/" if settings.feedback else ""))
    (workdir / "report.txt").write_text("\n".join([*header, "", table, "", footer]) + "\n")
    after = guide(results_shown, workdir, profile, demo=demo,
                  whole_class=not settings.assignments and not settings.students)
    print("\n".join(["", table, "", footer, *after]))


def references_text(workdir: Path, settings: Settings) -> str:
    """What a run with no submissions says: the assignments whose references it checked, ready for the grading.

    Only those this run made or found kept under the same key (``state.json``'s ``last_run``): a reference the
    work folder keeps of another assignment may be of an older solution, grader or machine.
    """
    try:
        state = read_state(workdir)
    except StateError:  # the run says so; no reference counts as checked
        state = None
    checked = (state.last_run.get("references") or []) if state is not None else []
    if settings.on_cluster:
        return (f"No submissions to grade. The instructor's solution passed on the cluster for: "
                f"{', '.join(checked) or 'none'} (a cluster's grading runs it again each time).")
    if not checked:
        return ("No submissions to grade, and no reference was checked (--canary all makes the references of the "
                "assignments chosen with --assignment ahead of the submissions).")
    return (f"No submissions to grade. References ready for: {', '.join(checked)} (in {workdir / REFERENCES}; "
            f"a grading with the same solution, grader, packages, devices and limits reuses them).")


def stopped_text(stopped: GradingStopped, workdir: Path) -> str:
    """What a stopped run says: its cause first, then what was graded, what not, and how to go on."""
    def names(pairs):
        return ", ".join(Pair(*pair).key for pair in pairs) or "none"

    return "\n".join([
        f"{stopped}: {len(stopped.graded)} submission(s) graded, {len(stopped.not_graded)} not.",
        f"Graded (in the gradebook): {names(stopped.graded)}",
        f"Not graded: {names(stopped.not_graded)}",
        f"Run the same command again to grade only what is not graded yet (work folder {workdir}).",
    ])
