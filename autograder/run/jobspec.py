"""What a ``job.json`` holds: everything a runner needs to run one notebook's job on this machine,
as a value.

:func:`autograder.prepare.job.prepare` gives what the job runs (probes, guard),
:mod:`autograder.run.jobfile` adds this machine's paths, limits and sandbox and writes it;
:mod:`autograder.run.runner` reads it (:meth:`JobSpec.read`), refusing a file that is corrupt or of
another version with its path and what is wrong.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from autograder.settings import fields_of


class JobSpecError(ValueError):
    """A job file that cannot be run: its path and what is wrong with it."""


@dataclass
class JobSpec:
    guard_name: str  # the kernel's name for the grader's guard
    recorder_name: str  # ... and for the probes' recorder
    probes: list  # [grade_id, the probe's cell source], in the notebook's order
    notebook_in: str  # the assembled notebook to run
    notebook_out: str  # the notebook as phase A left it
    status_out: str  # the run's status (autograder.prepare.status.Status)
    observations_out: str  # what each probe recorded
    probes_log: str  # what the probes printed, for the instructor
    ipc_dir: str  # the kernel's sockets
    workdir: str  # the submission's working copy
    cell_timeout_s: float
    time_limit_s: float
    recorded_bytes: int  # what a notebook's probes may record, together
    sandbox: dict  # autograder.run.sandbox.Spec's fields
    # {"version", "parents"}: where its cgroup is made, if anywhere
    cgroups: dict = field(default_factory=dict)
    kernel: dict = field(default_factory=dict)  # the course profile's KernelSetup

    @classmethod
    def read(cls, path: Path) -> JobSpec:
        """The job file at ``path``, or :class:`JobSpecError` saying what is wrong with it."""
        try:
            found = json.loads(Path(path).read_text())
        except (OSError, UnicodeDecodeError, ValueError) as error:
            raise JobSpecError(
                f"job file {path} cannot be read: {type(error).__name__}: {error}"
            ) from None
        try:
            return cls(**fields_of(cls, found, "a job"))
        except ValueError as error:
            raise JobSpecError(
                f"job file {path} {error} (prepare the job again: grade again)"
            ) from None

    def write(self, path: Path) -> None:
        Path(path).write_text(json.dumps(asdict(self)))
