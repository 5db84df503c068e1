"""``python -m autograder slurm-check`` (``make slurm-check``): grade part of the demo class on Slurm."""

from __future__ import annotations

import argparse
from pathlib import Path

from autograder.checks.slurm import WORKDIR, check

DESCRIPTION = 'python -m autograder slurm-check: grade part of the demo class on Slurm, through dask-jobqueue'


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder slurm-check", description=DESCRIPTION)
    parser.add_argument("--queue", help="the Slurm partition (default: the cluster's default one)")
    parser.add_argument("--account", help="the Slurm account to charge")
    parser.add_argument("--jobs", type=int, default=2, help="Slurm jobs to ask for, one worker each (default 2)")
    parser.add_argument("--walltime", default="00:30:00")
    parser.add_argument("--memory", default="4GB", help="memory of each job (default 4GB)")
    parser.add_argument("--gpu", action="store_true", help="one GPU per job, GPU jobs only (--gpu-jobs)")
    parser.add_argument("--scheduler-interface", metavar="NAME",
                        help="the network interface the scheduler listens on (ib0, say; default: Dask's choice)")
    parser.add_argument("--assignment", default="01_device_placement", help="the demo class's assignment to grade")
    parser.add_argument("--start-timeout", type=float, default=600, metavar="SECONDS",
                        help="how long to wait for the workers' jobs to start (default 600)")
    parser.add_argument("--workdir", type=Path, default=WORKDIR)
    parser.add_argument("--print-job-script", action="store_true", help="print the batch script and exit")
    args = parser.parse_args(argv)
    return check(args)
