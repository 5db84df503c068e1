"""Where a grading job runs, apart from what it does (:mod:`~autograder.run.executors.base`, the
seam): :class:`LocalPool`, this machine's cores (the default), or :class:`DaskExecutor`, a Dask
cluster (``--scheduler tcp://HOST:PORT``, ``--dask-local N``). On a CPU-only machine both run every
job on the CPU.
"""

from __future__ import annotations

from autograder.run.executors.base import ClusterError, Executor
from autograder.run.executors.dask import DaskExecutor
from autograder.run.executors.pool import (
    LocalPool,
    naming_checked,
    start_zygote_early,
)
from autograder.settings import Settings

__all__ = [
    "ClusterError",
    "DaskExecutor",
    "Executor",
    "LocalPool",
    "executor_for",
    "naming_checked",
    "start_zygote_early",
]


def executor_for(settings: Settings) -> Executor:
    """The executor ``settings`` ask for (raises :class:`ClusterError` for a cluster it cannot
    reach)."""
    if settings.on_cluster:
        return DaskExecutor(settings, settings.scheduler, settings.dask_local, settings.gpu_jobs)
    return LocalPool(settings)
