"""The grader's verbs this course adds (``autograder build``, ``demo``, ``gpu-check``,
``slurm-check``): each a ``main(argv) -> exit code`` that the grader's command line finds in the
``autograder.verbs`` entry point group."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def build(argv: list[str] | None = None) -> int:
    """this course: run solutions, make student versions, check both ways"""
    from devcourse.instructor import build as builder
    from devcourse.instructor.paths import COURSE, ROOT, assignments, solution_path

    parser = argparse.ArgumentParser(
        prog="autograder build",
        description=(
            "Turn instructor notebooks into everything else, and prove each exercise both ways."
        ),
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for command, what in (
        ("execute", "re-run solution notebooks and store their outputs"),
        ("course", "regenerate course/ from solutions/"),
        ("both-ways", "solutions pass every test; student versions pass none"),
        (
            "times",
            (
                f"how long each notebook runs (limit {builder.RUN_LIMIT_S:g} s) and Validate "
                f"takes (limit {builder.VALIDATE_LIMIT_S:g} s); exit 1 if one is over"
            ),
        ),
    ):
        sub.add_parser(command, help=what).add_argument(
            "names", nargs="*", help="assignments (default: all)"
        )
    args = parser.parse_args(argv)
    names = args.names or assignments()
    unknown = sorted(set(names) - set(assignments()))
    if unknown:
        parser.error(f"no such assignment: {', '.join(unknown)} (have: {', '.join(assignments())})")
    if args.command == "execute":
        for name in names:
            print(f"executing {solution_path(name).relative_to(ROOT)}")
            builder.execute(solution_path(name))
    elif args.command == "course":
        builder.generate_course(names=names)
        print(f"wrote {', '.join(names)} into {COURSE.relative_to(ROOT)}/")
    elif args.command == "times":
        return builder.times(names)
    else:
        return builder.both_ways(names)
    return 0


def demo(argv: list[str] | None = None) -> int:
    """this course: rebuild the demo class's submissions"""
    from devcourse.instructor.demo import build as build_demo
    from devcourse.instructor.paths import ROOT

    argparse.ArgumentParser(
        prog="autograder demo",
        description=(
            "Rebuild the demo class's submissions (demo_class/submitted) "
            "from the student versions in course/."
        ),
    ).parse_args(argv)
    for path in build_demo():
        print(f"wrote {path.relative_to(ROOT)}")
    return 0


def gpu_check(argv: list[str] | None = None) -> int:
    """this course on a CUDA machine: notebooks, grading, DDP, AMP, loading"""
    import torch  # the machine's own PyTorch, with CUDA

    from devcourse.instructor.gpucheck import (
        CHECKS,
        DRY_RUN_REPORT,
        GPU_REPORT,
        STEPS,
        Context,
        render,
        run,
    )
    from devcourse.instructor.paths import ROOT

    parser = argparse.ArgumentParser(
        prog="autograder gpu-check",
        description=(
            "make gpu-check: run the course and its grader on a real GPU, and write what happened"
        ),
    )
    parser.add_argument("--dry-run", action="store_true", help="rehearse on a machine without CUDA")
    parser.add_argument(
        "--only",
        default=",".join(STEPS),
        help=f"comma-separated checks (default: {','.join(STEPS)})",
    )
    parser.add_argument("--report", type=Path, help="where to write the report")
    parser.add_argument(
        "--size-mib", type=int, default=1024, help="checkpoint size for the loading check"
    )
    args = parser.parse_args(argv)
    steps = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in steps if s not in CHECKS]
    if unknown:
        parser.error(f"unknown checks: {', '.join(unknown)} (have: {', '.join(STEPS)})")
    if not torch.cuda.is_available() and not args.dry_run:
        print(
            "make gpu-check needs a CUDA GPU, and this machine has none that torch"
            f" {torch.__version__} can use (torch.version.cuda = {torch.version.cuda},"
            " torch.cuda.is_available() = False).\nNothing was run and no report was written. To"
            " rehearse on this machine: python -m autograder gpu-check --dry-run",
            file=sys.stderr,
        )
        return 2
    ctx = Context(dry_run=not torch.cuda.is_available(), size_mib=args.size_mib)
    report = args.report or (GPU_REPORT if ctx.cuda else DRY_RUN_REPORT)
    if not ctx.cuda and report.resolve() == GPU_REPORT.resolve():
        parser.error(
            f"a dry run never writes {GPU_REPORT.relative_to(ROOT)}: that file holds GPU"
            " measurements only"
        )
    report.parent.mkdir(parents=True, exist_ok=True)
    checks = run(steps, ctx, after_each=lambda so_far: report.write_text(render(so_far, ctx)))
    print(f"[gpu-check] report written to {report}")
    return 1 if any(c.status == "failed" for c in checks) else 0


def slurm_check(argv: list[str] | None = None) -> int:
    """grade part of the demo class through Slurm jobs"""
    from devcourse.instructor.slurmcheck import WORKDIR, check

    parser = argparse.ArgumentParser(
        prog="autograder slurm-check",
        description="grade part of the demo class on Slurm, through dask-jobqueue",
    )
    parser.add_argument("--queue", help="the Slurm partition (default: the cluster's default one)")
    parser.add_argument("--account", help="the Slurm account to charge")
    parser.add_argument(
        "--jobs", type=int, default=2, help="Slurm jobs to ask for, one worker each (default 2)"
    )
    parser.add_argument("--walltime", default="00:30:00")
    parser.add_argument("--memory", default="4GB", help="memory of each job (default 4GB)")
    parser.add_argument(
        "--gpu", action="store_true", help="one GPU per job, GPU jobs only (--gpu-jobs)"
    )
    parser.add_argument(
        "--scheduler-interface",
        metavar="NAME",
        help="the network interface the scheduler listens on (ib0, say; default: Dask's choice)",
    )
    parser.add_argument(
        "--assignment", default="01_device_placement", help="the demo class's assignment to grade"
    )
    parser.add_argument(
        "--start-timeout",
        type=float,
        default=600,
        metavar="SECONDS",
        help="how long to wait for the workers' jobs to start (default 600)",
    )
    parser.add_argument("--workdir", type=Path, default=WORKDIR)
    parser.add_argument(
        "--print-job-script", action="store_true", help="print the batch script and exit"
    )
    return check(parser.parse_args(argv))
