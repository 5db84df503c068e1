"""What ``autograder gpu-check`` (:mod:`.gpucheck`) writes: each check's outcome, what the checks
share, and the report in markdown, ``docs/gpu-log.md`` on a GPU and ``build/gpu-report-dry-run.md``
on a rehearsal."""

from __future__ import annotations

import datetime
import platform
from dataclasses import dataclass, field

import torch

from devcourse.instructor.paths import ROOT

GPU_REPORT = ROOT / "docs" / "gpu-log.md"  # the runs' log; docs/gpu-report.md sums it up
DRY_RUN_REPORT = ROOT / "build" / "gpu-report-dry-run.md"
WORKDIR = ROOT / "build" / "gpu-check"


@dataclass
class Check:
    """One check's outcome: ``passed``, ``failed`` or ``not run``, with a markdown body."""

    name: str
    status: str
    summary: str
    details: list[str] = field(default_factory=list)
    seconds: float | None = None  # how long the check took, set by run()


class Context:
    """What the checks need to know about this run."""

    def __init__(self, dry_run: bool, size_mib: int):
        self.cuda = torch.cuda.is_available()
        self.dry_run = dry_run
        self.size_mib = size_mib
        self.device = torch.device("cuda", 0) if self.cuda else torch.device("cpu")
        WORKDIR.mkdir(parents=True, exist_ok=True)


def render(checks: list[Check], ctx: Context) -> str:
    """The report as markdown: a title saying what machine and mode, a summary table, a section per
    check."""
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if ctx.cuda:
        title = f"# GPU report: {torch.cuda.get_device_name(0)}"
        note = (
            f"Measured on {torch.cuda.device_count()} x {torch.cuda.get_device_name(0)} by `make"
            f" gpu-check`, {when}."
        )
    else:
        title = "# GPU check, dry run on a machine without a GPU"
        note = (
            f"Dry run on a CPU-only machine ({platform.machine()}, torch {torch.__version__}),"
            f" {when}. Nothing here was measured on a GPU; checks that need one say `not run`."
        )
    lines = [title, "", note, "", "| check | status | seconds | summary |", "|---|---|---|---|"]
    lines += [
        f"| {c.name} | {c.status} | {'' if c.seconds is None else f'{c.seconds:.0f}'} |"
        f" {c.summary} |"
        for c in checks
    ]
    for c in checks:
        lines += ["", f"## {c.name}: {c.status}", "", c.summary, ""] + c.details
    return "\n".join(lines) + "\n"
