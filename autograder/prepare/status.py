"""What the runner says of one notebook's run: ``status.json`` in the job's folder, as a value.

:func:`autograder.run.runner.run` fills and writes it; the judge and the class run read it
(:meth:`Status.read`), which turns a missing, corrupt or foreign file into a stop that says so.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from autograder.settings import fields_of


@dataclass
class Status:
    # why the notebook stopped before its end (the first limit reached, a dead kernel), or ""
    stopped: str = ""
    cell: int | None = None  # the index of the cell that was running when it stopped
    probe: str | None = None  # the grade_id of the probe that was running when it stopped
    seconds: float = 0.0  # from its first cell to its end: what its limits per notebook count
    start_s: float | None = None  # what starting its kernel took
    warm: bool = False  # its kernel was started before the job was handed to it
    cells_s: float | None = None  # its cells (phase A)
    probes_s: float | None = None  # its probes in the same kernel (phase B)
    # after a stop, phase B in a fresh kernel: "done", or why that one stopped
    probes_again: str = ""
    cgroup: str = ""  # why it ran without a cgroup of its own, where it did
    disk_full: int = 0  # the disk limit in MiB, when the submission filled it
    # When its runner began, its first cell began and it ended (seconds since the epoch), and the
    # processor time its kernels took from the first cell (what its limits count): its profile.
    began_at: float = 0.0
    cells_at: float = 0.0
    ended_at: float = 0.0
    cpu_s: float = 0.0
    start_cpu_s: float = 0.0  # the processor time its first kernel took to start, the guard's too
    runner_cpu_s: float = 0.0  # the runner's own processor time: nbclient, the watch, its writes

    @classmethod
    def read(cls, path: Path) -> Status:
        """The status written at ``path``. None written (the runner was killed, or never started) or
        one that does not read as a status (corrupt, or another version's) is a stop that says
        which."""
        try:
            found = json.loads(path.read_text())
        except FileNotFoundError:
            return cls(stopped="the runner did not finish; see runner.log")
        except (OSError, UnicodeDecodeError, ValueError) as error:
            return cls(
                stopped=f"its status.json could not be read ({type(error).__name__}: {error})"
            )
        try:
            return cls(**fields_of(cls, found, "a status"))
        except ValueError as error:
            return cls(stopped=f"its status.json {error}")

    def write(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self)))
