"""A prepared job made runnable on this machine: its ``job.json``, with this machine's paths, limits
and sandbox.

The local pool's jobs get theirs from :func:`ready`, a cluster worker's from :func:`relocate` of a
job prepared on the grader's machine.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import nbformat

from autograder.course.config import DEFAULT_STUBS
from autograder.course.paths import course_folder
from autograder.course.profile import profile_named
from autograder.prepare.job import Job, prepare
from autograder.run import cgroups, sandbox
from autograder.run.jobspec import JobSpec
from autograder.settings import Settings

# The grader's package, wherever it is installed: a kernel imports its guard, and a course's code
# may start processes with its fork server. It holds code only (a course's files may lie beside it,
# in a checkout).
GRADER = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class RunContext:
    """What every job of one grading run shares."""

    settings: Settings
    isolation: sandbox.Isolation
    guard_name: str  # the kernel's name for the guard; the recorder's is this plus "_probe"
    ipc_root: Path  # the kernels' IPC folders are made in it
    # assignment -> notebook -> the source's import lines (course_imports)
    imports: dict[str, dict[str, str]]
    # where each sandbox gets a cgroup
    cgroups: cgroups.Cgroups = cgroups.Cgroups(0, reason="not asked for")
    # where the jobs run: the autograder.run.executors.Executor the batch made
    executor: object = None
    # what nbgrader writes into an answer cell (course.config.answer_stubs)
    stubs: tuple[str, str] = DEFAULT_STUBS


def hidden_course() -> list[str]:
    """The course's folder the grader runs from, where it runs from one: hidden from every kernel
    (its source, the hidden tests)."""
    found = course_folder()
    return [str(found)] if found is not None else []


def ready(
    job: Job,
    source: nbformat.NotebookNode,
    submitted: nbformat.NotebookNode,
    submitted_dir: Path,
    run: RunContext,
    reference: bool = False,
) -> Path:
    """Prepare ``job`` (:func:`autograder.prepare.job.prepare`) and write its job file for this run;
    return it.

    The kernel does not see the course's folder (where the grader runs from one), the work folder,
    or the folder of submissions.
    """
    description = prepare(
        job,
        source,
        submitted,
        submitted_dir,
        run.guard_name,
        run.imports[job.assignment][job.notebook],
        reference,
        run.stubs,
        profile_named(run.settings.profile or "").stand_ins,
    )
    hide = [*hidden_course(), str(job.folder.parents[3]), str(submitted_dir.parents[1])]
    _place(job.folder, description, run.settings, run.isolation, run.ipc_root, hide, run.cgroups)
    return job.folder / "job.json"


def _place(
    folder: Path,
    description: dict,
    settings: Settings,
    isolation: sandbox.Isolation,
    ipc_root: Path,
    hide: list[str],
    groups: cgroups.Cgroups,
) -> None:
    """Write ``folder/job.json``: ``description`` with this machine's paths, limits and sandbox for
    the job.

    The sandbox hides ``hide`` and brings back this Python's folders, none of them inside ``hide``
    but the environment, the grader's package (:data:`GRADER`) and the course's packages
    (:func:`autograder.run.sandbox.python_paths`). The kernel is
    set up as the course's grading profile says (:class:`autograder.course.profile.KernelSetup`).
    """
    profile, limits = profile_named(settings.profile or ""), settings.limits
    work = folder / "work"
    ipc = Path(tempfile.mkdtemp(prefix="k", dir=ipc_root))
    spec = sandbox.Spec(
        workdir=str(work),
        memory_mib=limits.memory_mib,
        namespaces=isolation.namespaces,
        user_namespace=isolation.user_namespace,
        max_processes=limits.max_processes,
        disk_mib=0 if settings.keep_work else limits.disk_mib,
        ipc_dir=str(ipc),
        hide=hide,
        read_only=sandbox.python_paths(hide, [GRADER, *profile.package_folders()]),
        read_write=[str(work), str(ipc)],
    )
    description.update(
        {
            "notebook_in": str(folder / "in.ipynb"),
            "notebook_out": str(folder / "out.ipynb"),
            "status_out": str(folder / "status.json"),
            "ipc_dir": str(ipc),
            "workdir": str(work),
            "cell_timeout_s": limits.cell_timeout_s,
            "time_limit_s": limits.time_limit_s,
            "recorded_bytes": limits.recorded_mib << 20,
            "observations_out": str(folder / "observations.json"),
            "probes_log": str(folder / "probes.log"),
            "sandbox": spec.__dict__,
            "cgroups": {"version": groups.version, "parents": groups.parents},
            "kernel": profile.kernel.as_dict(),
        }
    )
    if spec.as_nobody:
        for path in (work, ipc, *work.rglob("*")):
            os.chown(path, sandbox.NOBODY, sandbox.NOBODY)
    JobSpec(**description).write(folder / "job.json")


def relocate(job_file: Path, settings: Settings, ipc_root: Path, hide: list[str]) -> None:
    """Make a job prepared on another machine (unpacked at ``job_file``) runnable on this one.

    Its paths become this folder's, its sandbox this machine's (isolation,
    Python folders, cgroups), hiding this machine's copy of the course and
    ``hide``; what the job runs (notebook, probes, guard) is unchanged.
    """
    prepared = JobSpec.read(job_file)
    kept = {
        "guard_name": prepared.guard_name,
        "recorder_name": prepared.recorder_name,
        "probes": prepared.probes,
    }
    groups = cgroups.find()  # decided once per process, on a worker as on a grader
    cgroups.sweep(groups)
    _place(
        job_file.parent,
        kept,
        settings,
        sandbox.isolation_of(settings),
        ipc_root,
        [*hidden_course(), *hide],
        groups,
    )
