"""Jobs on a Dask cluster: each job's folder travels to a worker, runs there in the same sandbox,
and comes back.

On the worker, :func:`run_bundle` unpacks the job, makes it runnable there
(:func:`autograder.run.jobfile.relocate`) and starts the runner as a process of its own (student
code never runs in the worker's process). :class:`DaskExecutor` writes the results into the job's
folder once, when its future completes, so a job Dask runs again after its worker died is not
counted twice.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import io
import os
import secrets
import shutil
import tarfile
import tempfile
import threading
import time
from concurrent.futures import Future
from pathlib import Path

from autograder.run import sandbox
from autograder.run.executors.base import ClusterError, Executor
from autograder.run.executors.cluster import (
    CONNECT_TIMEOUT_S,
    RAN_ON,
    apart,
    check_scheduler,
    one_line,
    unanswered,
)
from autograder.run.executors.pool import new_zygote, no_zygote
from autograder.run.jobfile import relocate
from autograder.run.process import Runners, execute
from autograder.run.zygote import Zygote
from autograder.settings import Settings

WORKERLESS_S = 120  # jobs waiting, and no worker that can run them: the cluster cannot grade
INPUTS = ("job.json", "in.ipynb", "verdict.json")  # what the grader wrote, besides the working copy
JOB_PREFIX = "grade-job-"  # a worker's temporary folder for one job
# in that folder: its worker process (id, start time, pid namespace), for a later job's sweep
OWNER = "owner"


class SandboxUnavailable(RuntimeError):
    """On a worker: it cannot build the sandbox's namespaces; the job does not run there (unless
    ``--no-sandbox``)."""


# a Dask worker's, made at its first job that can use one, kept for its life
_WORKER_ZYGOTE: list[Zygote] = []
_WORKER_ZYGOTE_LOCK = threading.Lock()


def worker_zygote(settings: Settings) -> Zygote | None:
    """On a Dask worker: the zygote its jobs' runners are forked from, or None where they start
    fresh."""
    if no_zygote(settings):
        return None
    with _WORKER_ZYGOTE_LOCK:
        if not _WORKER_ZYGOTE:
            _WORKER_ZYGOTE.append(new_zygote(settings))
            atexit.register(_WORKER_ZYGOTE[0].close)
        return _WORKER_ZYGOTE[0]


def pack(folder: Path, skip: tuple[str, ...] = ()) -> bytes:
    """The files of ``folder`` (but the top-level names in ``skip``) as a gzipped tar archive."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for path in sorted(folder.iterdir()):
            if path.name not in skip:
                archive.add(path, arcname=path.name)
    return buffer.getvalue()


def unpack(data: bytes, folder: Path) -> None:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        archive.extractall(folder, filter="data")


# What a Dask worker runs for a job: a builtin (eval) of this expression, so that the task itself
# unpickles on any worker; on one without the course, the import fails in the task and the job's
# future carries the ModuleNotFoundError, instead of the worker dying as it unpickles the task.
ON_WORKER = (
    "__import__('autograder.run.executors.dask', fromlist=['run_bundle']).run_bundle(bundle,"
    " settings, stop)"
)


def run_bundle(bundle: bytes, settings: dict, stop: str | None = None) -> bytes:
    """On a worker: run one packed job in a sandbox of this machine; return its results, packed.

    ``settings`` are the grader's :class:`Settings` as a dict. The job's folder
    is unpacked into a new temporary folder, which the sandbox hides from the
    kernel (but for the job's working copy), together with this machine's copy
    of the course. ``stop`` names the Dask event the grader sets when its run
    is stopped: the job's runner is then ended as the local pool ends its own.
    """
    settings = Settings.from_dict(settings)
    isolation = sandbox.isolation_of(settings)
    # a worker runs students' code only as the local pool would
    if settings.sandbox and not isolation.namespaces:
        raise SandboxUnavailable(
            f"worker {_worker_name()} cannot build the grading sandbox: {isolation.reason} "
            "(grade with --no-sandbox to accept a worker without it)"
        )
    sweep_orphans(Path(tempfile.gettempdir()))
    with tempfile.TemporaryDirectory(prefix=JOB_PREFIX) as place:
        root = Path(place)
        (root / OWNER).write_text(_identity(os.getpid()) or "")
        os.chmod(root, 0o755)
        folder, ipc_root = root / "job", root / "ipc"
        folder.mkdir()
        ipc_root.mkdir()
        os.chmod(ipc_root, 0o755)
        unpack(bundle, folder)
        relocate(folder / "job.json", settings, ipc_root, hide=[str(root)])
        runners = Runners()
        with _ended_when_set(stop, runners):
            execute(folder / "job.json", settings, runners, zygote=worker_zygote(settings))
        (folder / RAN_ON).write_text(_worker_name() + "\n")
        return pack(folder, skip=(*INPUTS, "work"))


def _identity(pid: int) -> str | None:
    """A process's id, start time and pid namespace (a later process given the same id is not taken
    for it); None where there is no such process, or only its exit status is left (a zombie).
    Without ``/proc`` (macOS), its id alone."""
    if not Path("/proc/self/stat").exists():
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except PermissionError:  # there, but another user's
            pass
        return str(pid)
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        namespace = os.readlink("/proc/self/ns/pid")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2 :].split()
    return None if fields[0] in "ZX" else f"{pid} {fields[19]} {namespace}"


def sweep_orphans(folder: Path) -> list[Path]:
    """Remove the job folders in ``folder`` whose worker process has ended; return them.

    A worker ended mid-job (SIGKILL, the out-of-memory killer, a Slurm preemption) cannot remove its
    job's temporary folder; the next job a worker of this machine starts removes it. A folder whose
    owner is unknown (being made, or of an older grader) or ran in another pid namespace (a
    container that shares this folder) is left.
    """
    removed, mine = [], (_identity(os.getpid()) or "").split()
    for place in folder.glob(f"{JOB_PREFIX}*"):
        try:
            owner = (place / OWNER).read_text().split()
        except OSError:
            continue
        if not owner or not owner[0].isdigit() or owner[2:] != mine[2:]:
            continue
        if _identity(int(owner[0])) != " ".join(owner):
            shutil.rmtree(place, ignore_errors=True)
            removed.append(place)
    return removed


@contextlib.contextmanager
def _ended_when_set(stop: str | None, runners: Runners):
    """While the block runs, end ``runners`` as soon as the Dask event named ``stop`` is set."""
    if stop is None:
        yield
        return
    from distributed import Event, get_client

    # The worker's client, named: the listener's thread is not the task's, where Dask would find it.
    event, finished = Event(stop, client=get_client()), threading.Event()

    def listen() -> None:
        while not finished.is_set():
            try:
                if event.wait(timeout=1.0):
                    runners.stop()
                    return
            except Exception:  # noqa: BLE001 - the scheduler is gone: the job runs to its own end
                return

    threading.Thread(target=listen, name="grading-stop", daemon=True).start()
    try:
        yield
    finally:
        # not waited for: it sees this within its 1 s wait, and a job's end must not wait for that
        finished.set()


def _worker_name() -> str:
    from distributed import get_worker

    try:
        worker = get_worker()
    except ValueError:  # not in a worker (called directly)
        return os.uname().nodename
    return f"{worker.name} {worker.address}"


class DaskExecutor(Executor):
    """Jobs on a Dask cluster: an existing scheduler's address, or ``local`` workers started here.

    A job the cluster could not run (its worker lacks the course, its workers kept dying, or no
    worker that can take it joined the scheduler for ``workerless_s`` seconds while jobs waited)
    completes with a :class:`ClusterError` that says why: the grader stops and grades nothing more,
    rather than scoring a student for the cluster's failure. With ``gpu=True`` each job asks for the
    resource ``GPU=1``, which workers started with ``python -m autograder worker ADDRESS --gpu K``
    offer.
    """

    def __init__(
        self,
        settings: Settings,
        address: str | None = None,
        local: int = 0,
        gpu: bool = False,
        workerless_s: float = WORKERLESS_S,
    ):
        try:
            from distributed import Client, LocalCluster
        except ImportError as error:
            raise ClusterError(
                f"Dask is not installed ({error}): pip install distributed"
            ) from None
        self.settings, self.gpu, self.cluster = settings, gpu, None
        self.local_cores = local
        self.run_id = secrets.token_hex(4)
        # set by stop(): the workers end the jobs they run
        self.stop_event = f"grade-stop-{self.run_id}"
        try:
            if local:
                self.cluster = apart(
                    lambda: LocalCluster(
                        n_workers=local,
                        threads_per_worker=1,
                        processes=True,
                        dashboard_address=None,
                        silence_logs=40,
                    )
                )
                address = self.cluster.scheduler_address
            else:
                check_scheduler(address)
            self.client = apart(
                lambda: Client(address, timeout=CONNECT_TIMEOUT_S, set_as_default=False)
            )
        except ClusterError:
            raise
        except Exception as error:  # noqa: BLE001 - refused, timed out, or something that is not a Dask scheduler
            if self.cluster is not None:
                self.cluster.close()
            raise unanswered(address, error) from None
        workers = len(self._able_workers())
        self.description = (
            f"a Dask cluster at {address} ({workers} worker(s){' with GPU=1' if gpu else ''} "
            f"when grading began{', jobs need GPU=1' if gpu else ''})"
        )
        self.address, self.workerless_s = address, workerless_s
        self.lock = threading.Lock()
        self.pending: dict = {}  # remote future -> the Future the grader waits on
        self.closed = threading.Event()
        self.watchdog = threading.Thread(target=self._watch, name="dask-workers", daemon=True)
        self.watchdog.start()

    def _able_workers(self) -> list[str]:
        """The workers that can run a job now (with ``gpu``, those that offer the resource GPU)."""
        workers = self.client.scheduler_info(n_workers=-1).get("workers", {})
        return [
            address
            for address, worker in workers.items()
            if not self.gpu or worker.get("resources", {}).get("GPU", 0) >= 1
        ]

    def submit(self, job_file: Path) -> Future:
        folder = job_file.parent
        done: Future = Future()
        key = f"grade-{self.run_id}-" + "-".join(folder.parts[-3:])
        arguments = {
            "bundle": pack(folder),
            "settings": dataclasses.asdict(self.settings),
            "stop": self.stop_event,
        }
        with self.lock:
            remote = self.client.submit(
                eval,
                ON_WORKER,
                arguments,
                key=key,
                pure=False,
                resources={"GPU": 1} if self.gpu else None,
            )
            self.pending[remote] = done

        def arrived(remote_future) -> None:
            with self.lock:
                if self.pending.pop(remote_future, None) is None:
                    return  # the watchdog already failed it
            reason = None
            try:
                if remote_future.cancelled():
                    raise ClusterError(f"job {key} was cancelled")
                # once per job: only the future that finished writes
                unpack(remote_future.result(), folder)
            except BaseException as error:  # noqa: BLE001 - the cluster could not run it: the grader stops, it scores nothing
                reason = (
                    error
                    if isinstance(error, ClusterError)
                    else ClusterError(
                        f"the Dask cluster at {self.address} could not run job {key}: "
                        f"{type(error).__name__}: {one_line(error)}"
                        + (
                            " (is the course installed on every worker?)"
                            if isinstance(error, ImportError)
                            else ""
                        )
                    )
                )
                with contextlib.suppress(OSError):  # a stopped run may have removed the folder
                    (folder / "runner.log").write_text(f"{reason}\n")
            if not self.settings.keep_work:
                shutil.rmtree(folder / "work", ignore_errors=True)
            if reason is None:
                done.set_result(None)
            else:
                done.set_exception(reason)

        remote.add_done_callback(arrived)
        return done

    def _watch(self) -> None:
        """Fail every waiting job once no worker that can run them has been there for
        ``workerless_s``."""
        since = None
        while not self.closed.wait(1.0):
            with self.lock:
                waiting = bool(self.pending)
            try:
                able = bool(self._able_workers()) if waiting else True
            except Exception:  # noqa: BLE001 - the scheduler is gone: as good as no worker
                able = False
            if able:
                since = None
                continue
            since = since or time.monotonic()
            if time.monotonic() - since < self.workerless_s:
                continue
            with self.lock:
                failed, self.pending = self.pending, {}
            need = (
                "with the resource GPU=1 (python -m autograder worker ADDRESS --gpu K) "
                if self.gpu
                else ""
            )
            reason = ClusterError(
                f"no Dask worker {need}has been connected to the scheduler at {self.address} "
                f"for {self.workerless_s:g} s while {len(failed)} job(s) waited"
            )
            self.client.cancel(list(failed), force=True)
            for done in failed.values():
                done.set_exception(reason)

    def stop(self) -> None:
        """Cancel the jobs not begun, and have the workers end those they run (as the local pool
        does)."""
        from distributed import Event

        with self.lock:
            remote = list(self.pending)
        with contextlib.suppress(Exception):  # a scheduler that is gone runs nothing more anyway
            Event(self.stop_event, client=self.client).set()
        self.client.cancel(remote, force=True)

    def close(self) -> None:
        self.closed.set()
        self.client.close()
        if self.cluster is not None:
            self.cluster.close()
