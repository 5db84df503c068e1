"""One kernel of a job in its own sandbox (:class:`Session`), started, fed cells and watched for the
submission's limits by :mod:`autograder.run.runner`."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import signal
import threading
from pathlib import Path

import nbformat

from autograder.prepare.probes import PROBE_TOKEN
from autograder.prepare.status import Status
from autograder.run import cgroups, sandbox
from autograder.run.jobspec import JobSpec
from autograder.run.kernel import first_cell, kernel_env
from autograder.run.provisioner import KERNEL, kernel_specs
from autograder.run.watch import cpu_counted, disk_used_mib, seal_ipc, tree_cpu_s, tree_usage
from autograder.settings import WALL_PER_PROCESSOR_S

# What the recorder publishes a probe's events as (autograder.inside.recorder writes the same type).
MIME = "application/vnd.course.probe+json"
# in the job's folder: what its kernels wrote to their standard output and error
KERNEL_LOG = "kernel.log"


class Session:
    """One kernel in its own sandbox, watched four times a second for the submission's limits.

    ``status`` is the notebook's status: the first limit a session reaches is its ``stopped``.
    Limits hold on the kernel and every process it started together: processor time per cell and per
    notebook (wall time bounded too, for code that waits), memory, processes and threads; the first
    time one is over, the whole sandbox is ended.
    """

    def __init__(
        self,
        job: JobSpec,
        spec: sandbox.Spec,
        status: Status,
        prefix: str,
        launchers: list | None = None,
        cpu_before_s: float = 0.0,
    ):
        """``launchers``: the kernel launchers a forked runner made ahead
        (:mod:`autograder.run.zygote`), each taken by the first kernel that starts;
        ``cpu_before_s``: the notebook's processor time in kernels before this."""
        from jupyter_client.manager import AsyncKernelManager
        from nbclient import NotebookClient

        self.job, self.status = job, status
        # the processor time of this session's sandbox
        self.cpu_before_s, self.cpu_s = cpu_before_s, 0.0
        self.cpu_at_cell: float | None = None  # ... when the running cell began
        self.group = None
        found = job.cgroups
        if found.get("version"):
            try:  # Linux enforces the limits too; the watch below stays as it is
                self.group = cgroups.Group.create(
                    cgroups.Cgroups(found["version"], found["parents"]),
                    spec.memory_mib,
                    spec.max_processes,
                )
                spec = dataclasses.replace(spec, cgroup_procs=self.group.joins)
            except OSError as error:
                status.cgroup = f"no cgroup: {error}"
        self.spec = spec = dataclasses.replace(
            spec, kernel_output=str(Path(job.notebook_in).parent / KERNEL_LOG)
        )
        ipc = Path(os.path.realpath(job.ipc_dir))  # the path the kernel sees inside the sandbox too
        specs = kernel_specs(
            Path(job.notebook_in).parent / f"{prefix}-kernelspec",
            spec.write(ipc / f"{prefix}-sandbox.json"),
        )
        self.km = AsyncKernelManager(
            kernel_name=KERNEL,
            kernel_spec_manager=specs,
            transport="ipc",
            ip=str(ipc / prefix),
            connection_file=str(ipc / f"{prefix}-kernel.json"),
        )
        self.km.launchers = launchers  # what the provisioner starts the kernel from, if anything
        self.km.write_connection_file()
        if spec.as_nobody:
            os.chown(self.km.connection_file, spec.uid, spec.gid)
        self.home = "/tmp/home" if spec.namespaces else str(ipc / "home")
        if not spec.namespaces:  # inside the sandbox, its own /tmp/home is made by the sandbox
            os.makedirs(self.home, exist_ok=True)
        self.killed, self.finished = threading.Event(), threading.Event()
        self.guard = nbformat.v4.new_code_cell(
            first_cell(job.recorder_name, job.guard_name, job.kernel)
        )
        self.nb = nbformat.v4.new_notebook(cells=[self.guard])
        cell_wall_s = wall_limit(job.cell_timeout_s)
        # After a cell's end its output (a probe's record among it) may come seconds later on a busy
        # machine: it is waited for as long as the cell may run, not nbclient's 4 s, after which it
        # would be dropped unsaid.
        self.client = NotebookClient(
            self.nb,
            km=self.km,
            timeout=cell_wall_s,
            iopub_timeout=cell_wall_s,
            raise_on_iopub_timeout=True,
            allow_errors=True,
            kernel_name=KERNEL,
            store_widget_state=False,
            interrupt_on_timeout=False,
            record_timing=False,
            startup_timeout=120,
        )

    def kill(self, reason: str) -> None:
        self.killed.set()
        self.status.stopped = self.status.stopped or reason
        process = self.process
        if process is not None:
            # the launcher ends all the kernel started, then itself; else below
            with contextlib.suppress(Exception):
                process.terminate()
                process.wait(timeout=5)
            for send in (lambda: os.killpg(process.pid, signal.SIGKILL), lambda: process.kill()):
                with contextlib.suppress(OSError):
                    send()

    def _memory_limit(self, why: str) -> str:
        return f"memory limit of {self.spec.memory_mib} MiB for all its processes together ({why})"

    def _process_limit(self, why: str) -> str:
        return f"process limit of {self.spec.max_processes} processes and threads together ({why})"

    def _out_of_memory(self) -> str | None:
        """The note when Linux's out-of-memory killer ended a process in the sandbox's cgroup, else
        None."""
        if self.group is None or not self.group.oom_kills():
            return None
        return self._memory_limit("Linux ended a process of it at the limit")

    def _died(self) -> None:
        self.status.stopped = self.status.stopped or self._out_of_memory() or "the kernel died"

    def _over(self) -> str | None:
        """The note of the cgroup's limit this sandbox reached, if one was (checked after every cell
        too)."""
        if self.group is None:
            return None
        # the sandbox is ended, as the count in the watch would end it
        if self.group.refused_forks():
            return self._process_limit("Linux refused more")
        return self._out_of_memory()

    @property
    def process(self):
        """The kernel's process as its provisioner started it (the sandbox's launcher), or None."""
        return getattr(self.km.provisioner, "process", None)

    @property
    def notebook_cpu_s(self) -> float:
        """The notebook's processor time so far, this session's included."""
        return self.cpu_before_s + self.cpu_s

    def count_from_here(self) -> float:
        """The notebook's processor time counts from now on (what starting the kernel took is left
        out); returns what it took."""
        used = self._used_cpu_s() or 0.0
        self.cpu_before_s = -used
        return used

    def _used_cpu_s(self) -> float | None:
        """The processor time of this sandbox so far: its cgroup's count where it keeps one (which
        no process leaves, reaped or not), else its process tree's from /proc; None when neither can
        be read."""
        if self.group is not None:
            used = self.group.cpu_s()
            if used is not None:
                return used
        process = self.process
        return tree_cpu_s(process.pid) if process is not None else None

    def _processor_time(self) -> str | None:
        """The note of the processor-time limit this sandbox reached, if one was: the running cell's
        or the notebook's."""
        used = self._used_cpu_s()
        if used is None:
            return None
        self.cpu_s = used
        started, job = self.cpu_at_cell, self.job
        if started is not None and used - started > job.cell_timeout_s:
            return f"time limit of {job.cell_timeout_s:g} s of processor time per cell"
        if self.notebook_cpu_s > job.time_limit_s:
            return f"time limit of {job.time_limit_s:g} s of processor time per notebook"
        return None

    def _watch(self) -> None:
        spec = self.spec
        while not self.finished.wait(0.25):
            process = self.process
            if process is None or self.killed.is_set():
                continue
            over = self._over() or self._processor_time()
            if over:
                self.kill(over)
                return
            # launcher, init
            used, tasks = tree_usage(process.pid, uncounted=2 if spec.namespaces else 1)
            if spec.memory_mib and used > spec.memory_mib:
                self.kill(self._memory_limit(f"{used:.0f} MiB in use"))
                return
            if spec.max_processes and tasks > spec.max_processes:
                self.kill(self._process_limit(f"{tasks} running"))
                return
            if spec.disk_mib and spec.namespaces:
                written = disk_used_mib(process.pid, spec.disk_mib)
                if written is not None and written >= spec.disk_mib - 1:
                    self.status.disk_full = spec.disk_mib

    @contextlib.contextmanager
    def started(self):
        """The kernel, started in its sandbox with its IPC folder sealed and the recorder and guard
        installed."""
        threading.Thread(target=self._watch, daemon=True).start()
        try:
            with self.client.setup_kernel(env=kernel_env(self.home), cwd=self.job.workdir):
                if self.spec.namespaces and self.spec.ipc_dir:
                    seal_ipc(self.km.provisioner.process.pid, self.spec.ipc_dir)
                self.client.execute_cell(self.guard, 0, store_history=False)
                errors = [o for o in self.guard.outputs if o.output_type == "error"]
                if errors:
                    raise RuntimeError(
                        f"the grader's guard could not be installed: {errors[0].ename}: "
                        f"{errors[0].evalue}"
                    )
                yield self
        finally:
            self.finished.set()
            if self.km.has_kernel and not self.killed.is_set():
                self.kill("")
            if self.group is not None:
                self.group.remove()

    def execute(self, cell, index: int, store_history: bool = True) -> bool:
        """Run one cell; False when the notebook stopped (a limit, the kernel died)."""
        from nbclient.exceptions import CellTimeoutError, DeadKernelError

        if self.killed.is_set():
            return False
        self.cpu_at_cell = self._used_cpu_s()
        try:
            self.client.execute_cell(cell, index, store_history=store_history)
        except CellTimeoutError:
            self.kill(f"time limit of {self.client.timeout:g} s of wall time per cell")
            return False
        except DeadKernelError:
            self._died()
            return False
        finally:
            self.cpu_at_cell = None
        # the cell that reached a limit is where the notebook stops, however quick it was
        over = self._over()
        if over:
            self.kill(over)
        return not self.killed.is_set()

    def cells(self, cells: list) -> int | None:
        """Run the code cells in order (their outputs kept in them); the index of the cell during
        which the notebook stopped, or None when every cell ran."""
        self.nb.cells[1:] = cells
        for index, cell in enumerate(cells):
            if cell.cell_type == "code" and not self.execute(cell, index + 1):
                return index
        return None

    def probes(self, wanted: list[str], observations: dict) -> None:
        """Phase B: the probes of the tests in ``wanted``, in the notebook's order; what each
        recorded."""
        for grade_id, code in self.job.probes:
            if grade_id not in wanted:
                continue
            self.status.probe = grade_id
            # The guard first, in a cell of its own: what student code hooked into IPython (a
            # transformer, a callback before each cell, linecache's cache) is gone before IPython
            # reads the probe's source.
            if not self.execute(
                nbformat.v4.new_code_cell(f"{self.job.guard_name}()"), 0, store_history=False
            ):
                return
            # this run's: a display of the same type from anywhere else lacks it
            token = secrets.token_hex(16)
            cell = nbformat.v4.new_code_cell(code.replace(repr(PROBE_TOKEN), repr(token)))
            # Index 0: display updates sent later land on the guard's cell, never on one shown.
            done = self.execute(cell, 0, store_history=False)
            payloads = [
                o.data[MIME]
                for o in cell.outputs
                if o.output_type == "display_data"
                and isinstance(o.get("data", {}).get(MIME), dict)
                and o.data[MIME].get("token") == token
            ]
            # for the instructor, never shown
            with open(self.job.probes_log, "a", errors="replace") as log:
                log.write(
                    f"--- {grade_id}\n"
                    + "".join(output_text(o) for o in cell.outputs)[-20000:]
                    + "\n"
                )
            if payloads:
                observations[grade_id] = {"events": payloads[-1].get("events")}
                recorded = sum(len(json.dumps(record)) for record in observations.values())
                if recorded > self.job.recorded_bytes:
                    observations.clear()
                    raise OverRecorded(
                        f"limit of {self.job.recorded_bytes >> 20} MiB of recorded values per "
                        "notebook: 0 points for it"
                    )
            if not done:
                return
        self.status.probe = None


def wall_limit(processor_s: float) -> float:
    """The wall time a cell or a notebook is given beside its limit of ``processor_s`` of processor
    time: more, for code that waits, where the processor time is counted (Linux); the same where it
    is not."""
    return processor_s * WALL_PER_PROCESSOR_S if cpu_counted() else processor_s


class OverRecorded(Exception):
    """A notebook's probes recorded more than its limit: none of what they recorded counts (they are
    cleared)."""


def output_text(output) -> str:
    """What an output says, as plain text (a probe's record left out)."""
    return (
        output.text
        if output.output_type == "stream"
        else "\n".join(output.traceback) + "\n"
        if output.output_type == "error"
        else ""
    )
