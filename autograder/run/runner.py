"""Execute one assembled notebook in a sandboxed kernel (one process per notebook).

``python -m autograder.run.runner JOB.json``, started for every job and run outside the sandbox like
nbgrader's executor, runs the cells in a kernel with limits
(:class:`~autograder.run.session.Session`), then the tests' probes
(:mod:`autograder.prepare.probes`), and writes what it found.
"""

from __future__ import annotations

import copy
import json
import resource
import signal
import sys
import threading
import time
from pathlib import Path

import nbformat

from autograder.course.cells import test_id
from autograder.inside import launcher
from autograder.prepare.status import Status
from autograder.run import sandbox
from autograder.run.jobspec import JobSpec
from autograder.run.session import OverRecorded, Session, wall_limit


def passed_tests(cells: list) -> list[str]:
    """The grade_ids of the test cells that ran and raised nothing, in order."""
    return [
        test_id(cell)
        for cell in cells
        if test_id(cell)
        and cell.execution_count is not None
        and not any(o.output_type == "error" for o in cell.outputs)
    ]


class Cancelled(Exception):
    """A warm runner's job was taken back before it began (the run stopped): it writes nothing."""


def run(job: JobSpec, go=None, launchers: list | None = None) -> Status | None:
    """Phase A in one kernel, then phase B: in the same kernel, or, when phase A stopped halfway (a
    limit, a dead kernel), in a fresh one (:func:`_probes_again`), so that the tests passed before
    the stop keep their points.

    ``go`` (a warm start) is called once the first kernel is up in its sandbox; the first cell runs
    when it returns True. When it returns False, or the runner is told to end while it starts or
    waits, the job is taken back: nothing is written and None is returned. The limits per notebook,
    and ``status.seconds``, count from its return. Written: the notebook as phase A left it (the
    only output shown), what each probe recorded (``observations.json``) and the status; what did
    not run records nothing, so its tests earn nothing."""
    from nbclient.exceptions import DeadKernelError

    nb = nbformat.read(job.notebook_in, as_version=4)
    spec = sandbox.Spec(**job.sandbox)
    status = Status(warm=go is not None, began_at=time.time())
    started = time.monotonic()
    now: dict = {"session": None, "ending": False, "before_go": go is not None}

    def end(reason: str) -> None:  # no further session starts
        now["ending"] = True
        if now["session"] is not None:
            now["session"].kill(reason)
        status.stopped = status.stopped or reason
        if now["before_go"]:  # a warm runner, starting or waiting: its job is taken back, at once
            now["before_go"] = False
            raise Cancelled(reason)

    # SIGINT: Ctrl-C reaches the whole process group
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(
            signum,
            lambda number, _frame: end(f"grading was stopped ({signal.Signals(number).name})"),
        )
    wall_s = wall_limit(job.time_limit_s)
    watchdog = threading.Timer(
        wall_s, end, args=(f"time limit of {wall_s:g} s of wall time per notebook",)
    )
    if go is None:
        watchdog.start()
    shown, observations = None, {}
    try:
        now["session"] = first = Session(job, spec, status, "k", launchers)
        with first.started():
            status.start_s = round(time.monotonic() - started, 2)
            if go is not None:
                if not go():
                    raise Cancelled("taken back")
                now["before_go"] = False
                started = time.monotonic()
                watchdog.start()
            status.start_cpu_s = round(first.count_from_here(), 2)
            status.cells_at = time.time()
            began = time.monotonic()
            status.cell = first.cells(nb.cells)
            status.cells_s = round(time.monotonic() - began, 2)
            shown = copy.deepcopy(nb)  # phase A as it ended: nothing the probes do can change it
            if status.cell is None:
                first.probes(passed_tests(nb.cells), observations)
                status.probes_s = round(time.monotonic() - began - status.cells_s, 2)
        if not now["ending"]:
            _probes_again(job, spec, nb, status, observations, now, launchers, first.notebook_cpu_s)
    except Cancelled:  # its kernel, if one started, ended with first.started(); the watchdog below
        return None
    except DeadKernelError:
        now["session"]._died()
    except Exception as error:  # noqa: BLE001 - the report says what happened; the batch goes on
        said = str(error) if isinstance(error, OverRecorded) else f"{type(error).__name__}: {error}"
        status.stopped = status.stopped or said
    finally:
        watchdog.cancel()
    status.seconds = round(time.monotonic() - started, 2)
    status.ended_at = time.time()
    if now["session"] is not None:  # the last session's count holds the first's
        status.cpu_s = round(now["session"].notebook_cpu_s, 2)
    status.runner_cpu_s = _own_cpu_s()
    nbformat.write(shown if shown is not None else nb, job.notebook_out)
    Path(job.observations_out).write_text(json.dumps(observations))
    status.write(Path(job.status_out))
    return status


def _probes_again(
    job: JobSpec, spec, nb, status: Status, observations: dict, now: dict, launchers, cpu_s: float
):
    """Phase B where phase A stopped halfway: in a fresh kernel (``now["session"]``, for the
    runner's end), the cells before the stop again, output unseen, then the probes of the tests they
    passed."""
    wanted = passed_tests(nb.cells[: status.cell]) if status.cell is not None else []
    if not wanted:
        return
    again = Status()  # phase B's own: its stop is probes_again, never the notebook's
    now["session"] = second = Session(job, spec, again, "k2", launchers, cpu_before_s=cpu_s)
    cells = [
        nbformat.v4.new_code_cell(c.source, metadata=c.metadata) if c.cell_type == "code" else c
        for c in nb.cells[: status.cell]
    ]
    with second.started():
        if second.cells(cells) is None:
            second.probes(wanted, observations)
    status.probes_again = again.stopped or "done"


def _own_cpu_s() -> float:
    """This runner's processor time so far (a forked runner's counts from its fork), its kernels'
    apart."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    return round(used.ru_utime + used.ru_stime, 2)


def _go_from_stdin() -> bool:
    """A warm runner's go: a line ``go`` on standard input (end of input: taken back)."""
    return sys.stdin.readline().strip() == "go"


def start(job_file: str, warm: bool, launchers: list | None = None) -> None:
    """Run the job of ``job_file``; a warm runner waits for ``go`` on standard input first.

    A warm runner (``--warm``, started by :class:`autograder.run.executors.LocalPool` ahead of its
    job's turn) does everything up to the first cell, then waits for ``go``; the end of its input
    takes the job back and it writes nothing. The runner dies with its grader
    (``PR_SET_PDEATHSIG``), and SIGTERM, SIGHUP or SIGINT make it end its kernel's sandbox, write
    what it has and exit.
    """
    run(JobSpec.read(Path(job_file)), go=_go_from_stdin if warm else None, launchers=launchers)


if __name__ == "__main__":
    warm = sys.argv[3:] == ["--warm"]
    if len(sys.argv) != 3 + warm or not sys.argv[2].isdigit():
        sys.exit("usage: python -m autograder.run.runner JOB.json GRADER_PID [--warm]")
    launcher.die_with_parent(int(sys.argv[2]), signal.SIGKILL)
    start(sys.argv[1], warm)
