"""The seam between what a grading job does and where it runs: an executor takes a job file, returns
a future.

A job is a folder :mod:`autograder.run.jobfile` wrote; running it fills the folder with what the
runner writes (``out.ipynb``, ``status.json``, ``observations.json``, ``probes.log``,
``runner.log``, ``kernel.log``). The future is done when those files are in the job's folder on this
machine, so the grader reads them the same way whoever ran the job.
"""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path


class ClusterError(Exception):
    """A cluster the grader cannot use, or a job it could not run; the message says why.

    Raised before anything is graded (no scheduler), or carried by a job's future: the run stops
    there.
    """


class Executor:
    """Runs job files; see the module's docstring."""

    description = ""
    local_cores = 0  # the cores of this machine its jobs keep busy

    def submit(self, job_file: Path) -> Future:
        raise NotImplementedError

    def stop(self) -> None:
        """A stopped run: end the jobs that are running, start no more."""

    def close(self) -> None:
        """The run is over."""
