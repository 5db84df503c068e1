"""``python -m autograder grade``: autograde a class, sandboxed, in parallel, with limits (``make
grade``).

Prints what it checks and how, grades (:func:`autograder.batch.grade`), then prints the table and
writes ``scores.csv``, ``scores.png`` and ``report.txt`` into the work folder. Exit codes: 0 graded,
2 bad input or a cluster that cannot run a job, 3 the instructor's solution did not pass, 128 + N
stopped by signal N.
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
from autograder.cli.options import parser
from autograder.course.config import gradebook_problem, shown_url
from autograder.course.directory import CourseError, is_course_dir, parse_due
from autograder.course.paths import course_folder
from autograder.course.profile import (
    CourseProfile,
    DemoClass,
    ProfileError,
    checked_on,
    profile_name_of,
    profile_named,
)
from autograder.judge.reference import REFERENCES, CanaryFailed
from autograder.record.gradebook import gradebook_url, load_nbgrader
from autograder.record.report import format_table, load_plotting, write_csv, write_histogram
from autograder.record.state import StateError, read_state
from autograder.run import bytecode, cgroups, sandbox
from autograder.run.executors import ClusterError, naming_checked, start_zygote_early
from autograder.run.executors.cluster import check_scheduler
from autograder.run.idle import IdleCores
from autograder.run.process import RUNNERS
from autograder.run.startup import settled
from autograder.run.watch import RUN_MARKER
from autograder.settings import (
    GRADEBOOK_ENV,
    MAX_CODE_CELLS,
    MAX_NOTEBOOK_MIB,
    Limits,
    Pair,
    Settings,
)


def main(argv: list[str] | None = None) -> int:
    options = parser()
    args = options.parse_args(argv)
    problem = _check(args, options)
    if problem is not None:
        return problem
    settings = _settings(args, options)
    # Every process of this run carries the marker (a test or a wrapper may have chosen it): the
    # zygote's too.
    os.environ.setdefault(RUN_MARKER, secrets.token_hex(8))
    early = start_zygote_early(settings)
    named = naming_checked(settings)
    load_nbgrader()  # while the zygote imports, before it names the devices for the header
    if early:  # and the report's, drawn at the end with the other cores idle
        load_plotting()
    settings = named()
    settled()
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
        print(
            f"grading was stopped by {signal.Signals(INTERRUPTS.received).name} before any student"
            " was graded",
            file=sys.stderr,
            flush=True,
        )
        return 128 + INTERRUPTS.received
    profile = profile_named(settings.profile)
    demo = profile.demo_class()
    if demo is not None and (
        args.submitted is None or args.submitted.resolve() != demo.submitted.resolve()
    ):
        demo = None  # other submissions than the demo class's
    _report(
        results,
        args.workdir.resolve(),
        settings,
        header,
        time.monotonic() - started,
        profile,
        demo=demo,
    )
    return 0


def _check(args, options: argparse.ArgumentParser) -> int | None:
    """Bad input said in one line (argparse exits 2); the exit code where a cluster does not
    answer."""
    if args.gpu_jobs and not (args.scheduler or args.dask_local):
        options.error("--gpu-jobs is for a Dask cluster: add --scheduler or --dask-local")
    if args.scheduler:
        try:
            # first: an address that does not answer costs seconds, not a set-up
            check_scheduler(args.scheduler)
        except ClusterError as error:
            print(f"grade: {error}", file=sys.stderr, flush=True)
            return 2
    if args.course is not None:
        if not is_course_dir(args.course):
            options.error(
                f"{args.course} is not a course directory (no nbgrader_config.py): make one with "
                "nbgrader quickstart, or python -m autograder course init"
            )
        args.workdir = args.course
    elif course_folder() is None:
        # --submitted alone grades against the course's source, where the grader runs
        options.error(
            "name the course to grade: --course DIR, an nbgrader course directory (nbgrader"
            " quickstart), or run from a course's folder (its nbgrader_config.py and source folder)"
        )
    elif args.submitted is None:
        demo = _profile(args.workdir, options).demo_class()
        if demo is None:
            options.error(
                "name the submissions to grade: --submitted DIR (a folder of"
                " <student>/<assignment>/), or --course DIR to grade what a course directory's"
                " submitted/ holds"
            )
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
    limits = Limits(
        cell_timeout_s=args.cell_timeout,
        time_limit_s=args.time_limit,
        memory_mib=args.memory_limit_mib,
        disk_mib=args.disk_limit_mib,
        max_processes=args.max_processes,
        recorded_mib=args.recorded_limit_mib,
    )
    return Settings(
        profile=profile,
        jobs=args.jobs,
        limits=limits,
        db_url=args.db_url,
        feedback=not args.no_feedback,
        feedback_apart={"auto": None, "yes": True, "no": False}[args.feedback_apart],
        progress=not args.quiet,
        sandbox=not args.no_sandbox,
        canary=args.canary,
        rerun_canary=args.rerun_canary,
        reference_cache=args.reference_cache,
        keep_work=args.keep_work,
        assignments=tuple(args.assignment),
        students=tuple(args.student),
        regrade=args.regrade,
        due=due,
        scheduler=args.scheduler,
        dask_local=args.dask_local,
        gpu_jobs=args.gpu_jobs,
        warm=not args.no_warm,
        zygote=not args.no_zygote,
    )


def _profile(workdir: Path, options: argparse.ArgumentParser) -> CourseProfile:
    """The grading profile the work folder's course names; one that cannot be used ends the command
    in one line."""
    try:
        return profile_named(profile_name_of(workdir))
    except ProfileError as error:
        options.error(str(error))


def _header(args, settings: Settings, db_url: str) -> list[str]:
    """What the run says before it starts: what is graded where, the devices, the limits, the
    references."""
    isolation, limits = sandbox.isolation_of(settings), settings.limits
    devices, not_checked = checked_on(settings)
    where = (
        f"on the Dask scheduler at {settings.scheduler}"
        if settings.scheduler
        else (
            f"on a Dask cluster of {settings.dask_local} local worker(s)"
            if settings.dask_local
            else f"with {settings.jobs or cgroups.usable_cores()} notebook(s) at a time"
            + ("" if settings.jobs or not IdleCores().readable else ", more while a core is idle")
        )
    )
    header = [
        f"Grading {args.submitted or args.course / 'submitted'} {where}.",
        f"Gradebook: {shown_url(db_url)}",
        *([f"Devices every submission is checked on: {devices}"] if devices else []),
        *(
            "Not checked on this machine (the checks that ask for it say so in their output):"
            f" {machine}"
            for machine in not_checked
        ),
        "Limits on each submission:",
        *(
            f"  {line}"
            for line in isolation.describe(
                limits.memory_mib,
                limits.time_limit_s,
                limits.cell_timeout_s,
                0 if settings.keep_work else limits.disk_mib,
                limits.max_processes,
                cgroups.find().describe(),
                cgroups.find().counts_cpu,
            )
        ),
        (
            f"  notebook: at most {MAX_CODE_CELLS} code cells and {MAX_NOTEBOOK_MIB} MiB, and"
            f" {limits.recorded_mib} MiB of values its tests record together; past one, 0 points"
            " for it"
        ),
        *bytecode.advice(bytecode.uncompiled()),
    ]
    checked_first = {
        "graded": "of each assignment with submissions",
        "all": "of every assignment" + (" chosen" if settings.assignments else ""),
    }[settings.canary]
    # It runs before the progress bar starts: say what the wait is for.
    header.append(
        f"First the instructor's solution {checked_first} runs in the same sandbox (--canary"
        f" {settings.canary}), new submissions starting beside it: the reference for the grading;"
        " it stops unless it gets full marks. A reference kept from an earlier run with the same"
        " solution, grader, packages, devices and limits is reused (--rerun-canary runs it"
        " anyway)."
    )
    return header


def _report(
    results,
    workdir: Path,
    settings: Settings,
    header: list[str],
    seconds: float,
    profile: CourseProfile,
    demo: DemoClass | None = None,
) -> None:
    # no submissions yet: a run that made the references ahead (--canary all) says so
    if not results:
        print(references_text(workdir, settings), flush=True)
        return
    results_shown = shown(results, settings.assignments, settings.students)
    table = format_table(results_shown)
    write_csv(results, workdir / "scores.csv")
    write_histogram(results, workdir / "scores.png")
    footer = (
        f"Graded in {seconds:.0f} s. Written to {workdir}: scores.csv, scores.png, report.txt"
        + (", feedback/" if settings.feedback else "")
    )
    (workdir / "report.txt").write_text("\n".join([*header, "", table, "", footer]) + "\n")
    after = guide(
        results_shown,
        workdir,
        profile,
        demo=demo,
        whole_class=not settings.assignments and not settings.students,
    )
    print("\n".join(["", table, "", footer, *after]))


def references_text(workdir: Path, settings: Settings) -> str:
    """What a run with no submissions says: the assignments whose references it checked, ready for
    the grading.

    Only those this run made or found kept under the same key (``state.json``'s ``last_run``): a
    reference the work folder keeps of another assignment may be of an older solution, grader or
    machine.
    """
    try:
        state = read_state(workdir)
    except StateError:  # the run says so; no reference counts as checked
        state = None
    checked = (state.last_run.get("references") or []) if state is not None else []
    if settings.on_cluster:
        return (
            "No submissions to grade. The instructor's solution passed on the cluster for: "
            f"{', '.join(checked) or 'none'} (a cluster's grading runs it again each time)."
        )
    if not checked:
        return (
            "No submissions to grade, and no reference was checked (--canary all makes the"
            " references of the assignments chosen with --assignment ahead of the submissions)."
        )
    return (
        f"No submissions to grade. References ready for: {', '.join(checked)} (in"
        f" {workdir / REFERENCES}; a grading with the same solution, grader, packages, devices and"
        " limits reuses them)."
    )


def stopped_text(stopped: GradingStopped, workdir: Path) -> str:
    """What a stopped run says: its cause first, then what was graded, what not, and how to go
    on."""

    def names(pairs):
        return ", ".join(Pair(*pair).key for pair in pairs) or "none"

    return "\n".join(
        [
            (
                f"{stopped}: {len(stopped.graded)} submission(s) graded, {len(stopped.not_graded)}"
                " not."
            ),
            f"Graded (in the gradebook): {names(stopped.graded)}",
            f"Not graded: {names(stopped.not_graded)}",
            (
                "Run the same command again to grade only what is not graded yet (work folder"
                f" {workdir})."
            ),
        ]
    )
