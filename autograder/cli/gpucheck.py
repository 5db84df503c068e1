"""``python -m autograder gpu-check`` (``make gpu-check``): the course and its grader on a real GPU."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from autograder.checks.gpu import CHECKS, DRY_RUN_REPORT, GPU_REPORT, STEPS, Context, render, run
from autograder.course.paths import ROOT

DESCRIPTION = 'make gpu-check: run the course and its grader on a real GPU, and write what happened'


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder gpu-check", description=DESCRIPTION)
    parser.add_argument("--dry-run", action="store_true", help="rehearse on a machine without CUDA")
    parser.add_argument("--only", default=",".join(STEPS), help=f"comma-separated checks (default: {','.join(STEPS)})")
    parser.add_argument("--report", type=Path, help="where to write the report")
    parser.add_argument("--size-mib", type=int, default=1024, help="checkpoint size for the loading check")
    args = parser.parse_args(argv)
    steps = [s.strip() for s in args.only.split(",") if s.strip()]
    unknown = [s for s in steps if s not in CHECKS]
    if unknown:
        parser.error(f"unknown checks: {', '.join(unknown)} (have: {', '.join(STEPS)})")
    import torch  # the machine's own PyTorch, with CUDA

    if not torch.cuda.is_available() and not args.dry_run:
        print(f"make gpu-check needs a CUDA GPU, and this machine has none that torch {torch.__version__} can use "
              f"(torch.version.cuda = {torch.version.cuda}, torch.cuda.is_available() = False).\n"
              "Nothing was run and no report was written. To rehearse on this machine: "
              "python -m autograder gpu-check --dry-run", file=sys.stderr)
        return 2
    ctx = Context(dry_run=not torch.cuda.is_available(), size_mib=args.size_mib)
    report = args.report or (GPU_REPORT if ctx.cuda else DRY_RUN_REPORT)
    if not ctx.cuda and report.resolve() == GPU_REPORT.resolve():
        parser.error(f"a dry run never writes {GPU_REPORT.relative_to(ROOT)}: that file holds GPU measurements only")
    report.parent.mkdir(parents=True, exist_ok=True)
    checks = run(steps, ctx, after_each=lambda so_far: report.write_text(render(so_far, ctx)))
    print(f"[gpu-check] report written to {report}")
    return 1 if any(c.status == "failed" for c in checks) else 0
