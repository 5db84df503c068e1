"""A grading kernel as jupyter_client starts it: its environment and its first cell."""

from __future__ import annotations

import functools
import os
from pathlib import Path

from autograder.inside import guard, recorder
from autograder.run.watch import RUN_MARKER

# IPython shows a frame of a library file through stack_data, which parses the whole file, for every
# frame of every error; a file longer than ultratb.FAST_THRESHOLD lines, and a notebook's own cell
# always, is shown from its raw lines instead. The threshold at -1 shows every frame that way: a
# library frame keeps its file, line, function and the lines around it. The feedback keeps the
# cells' frames only and counts the others (autograder.record.hints), so it reads the same. Set
# before the guard's snapshot, which keeps it; the cell binds no name in the student's namespace.
TRACEBACK_SOURCE = "__import__('IPython.core.ultratb').core.ultratb.FAST_THRESHOLD = -1\n"


def first_cell(recorder_name: str, guard_name: str, kernel: dict) -> str:
    """What a grading kernel runs first: frames shown raw, then the recorder and the guard installed
    under the run's names (the recorder first, so that the guard's snapshot holds it and puts it
    back before each test), the guard with what the course's kernels import and run first
    (``kernel``: the job's ``KernelSetup``)."""
    setup = {
        key: kernel.get(key) or default
        for key, default in (("packages", ()), ("setup", ""), ("plain_tensor", ""))
    }
    return (
        TRACEBACK_SOURCE
        + source_of(recorder)
        + f"\ninstall({recorder_name!r}, plain_tensor={setup['plain_tensor']!r})\ndel install\n"
        + source_of(guard)
        + f"\ninstall({guard_name!r}, packages={tuple(setup['packages'])!r},"
        f" setup={setup['setup']!r}, plain_tensor={setup['plain_tensor']!r})\ndel install\n"
    )


@functools.cache
def source_of(module) -> str:
    """The source of a module of :mod:`autograder.inside`, as the grader sends it to a kernel."""
    return Path(module.__file__).read_text()


# PyTorch's intra-op threads in every grading kernel, on every machine (see kernel_env)
KERNEL_THREADS = "1"


def kernel_env(home: str, base: dict[str, str] | None = None) -> dict[str, str]:
    """The kernel's environment: what Python, PyTorch and CUDA need of ``base`` (default: this
    process's), and nothing else of the grader's.

    PyTorch's CPU operators run in one thread (``OMP_NUM_THREADS`` and ``MKL_NUM_THREADS`` are
    :data:`KERNEL_THREADS`, whatever ``base`` says). A sum or a product split over more threads can
    round differently, so a student's values would differ in their last bits from the solution's,
    which the hidden checks compare exactly, wherever the two ran with different counts: a reference
    kept from a day when the grader ran with another ``OMP_NUM_THREADS``, or a canary and a
    student's job on Dask workers of different sizes, so a correct student would lose points. One
    thread each also keeps a machine graded one notebook per core from running cores x cores
    threads.
    """
    keep = ("PATH", "LANG", "TZ", "PYTHONPATH", "LD_LIBRARY_PATH", RUN_MARKER)
    env = {
        key: value
        for key, value in (os.environ if base is None else base).items()
        if key in keep or key.startswith(("LC_", "CUDA_", "NVIDIA_", "NCCL_"))
    }
    env.update(
        HOME=home,
        IPYTHONDIR=f"{home}/.ipython",
        MPLCONFIGDIR=f"{home}/.matplotlib",
        MPLBACKEND="agg",
        PYTHONDONTWRITEBYTECODE="1",
        JPY_SESSION_NAME="submission.ipynb",
        OMP_NUM_THREADS=KERNEL_THREADS,
        MKL_NUM_THREADS=KERNEL_THREADS,
    )
    return env
