"""Where a grading job runs, apart from what it does: a pool of this machine's cores, or a Dask cluster.

A job is a folder that :func:`autograder.prepare.job.prepare` wrote (``job.json``, the
assembled notebook, the working copy); running it fills the folder with what
:mod:`autograder.run.runner` writes (``out.ipynb``, ``status.json``,
``observations.json``, ``probes.log``, ``runner.log``). An executor's
:meth:`~Executor.submit` takes the job file and returns a
:class:`concurrent.futures.Future` that is done when those files are in the
job's folder on this machine; the grader reads them from there as it always
does, so the same job code runs on either executor unchanged.

* :class:`LocalPool` (the default): one thread per ``--jobs``, each starting
  the runner in its sandbox (:func:`autograder.prepare.job.execute`).
* :class:`DaskExecutor` (``--scheduler tcp://HOST:PORT``, or ``--dask-local
  N`` for a cluster of N worker processes on this machine): each job's folder
  travels to a worker as a compressed archive (the workers need the course
  installed, not this machine's folders); the worker unpacks it in a temporary
  folder, rewrites its paths and sandbox for its own machine
  (:func:`autograder.prepare.job.relocate`), starts the runner there as a separate
  process, in the same sandbox as the local pool (student code never runs in
  the Dask worker's own process; a worker that cannot build the sandbox's
  namespaces refuses the job, unless the grader runs with ``--no-sandbox``),
  and sends the results back. They are written
  into the job's folder once, when the job's future completes: a job that Dask
  runs again after its worker died is not counted twice. With ``gpu=True``
  each job asks for the Dask resource ``GPU=1``, which only workers started
  with ``--resources GPU=1`` offer (``python -m autograder worker
  ADDRESS --gpu K`` starts one pinned to GPU K with ``CUDA_VISIBLE_DEVICES``).

On a CPU-only machine both run every job on the CPU (and the simulated
accelerator); nothing here needs a GPU.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import dataclasses
import io
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from autograder.course.config import tool_env
from autograder.course.paths import ROOT
from autograder.run import sandbox
from autograder.run.cgroups import usable_cores
from autograder.run.jobfile import relocate
from autograder.run.process import RUNNERS, Runners, execute, finish, launch
from autograder.run.runner import kernel_env
from autograder.run.zygote import Zygote
from autograder.run.zygote import usable as zygote_usable
from autograder.settings import Settings

CONNECT_TIMEOUT_S = 5
WORKERLESS_S = 120  # jobs waiting, and no worker that can run them: the cluster cannot grade
INPUTS = ("job.json", "in.ipynb", "verdict.json")  # what the grader wrote, besides the working copy
RAN_ON = "ran_on.txt"  # in a job's folder after a cluster ran it: the worker's name and address
JOB_PREFIX = "grade-job-"  # a worker's temporary folder for one job
OWNER = "owner"  # in that folder: its worker process (id, start time, pid namespace), for a later job's sweep


class ClusterError(Exception):
    """A cluster the grader cannot use, or a job it could not run; the message says why.

    Raised before anything is graded (no scheduler), or carried by a job's future: the run stops there.
    """


class SandboxUnavailable(RuntimeError):
    """On a worker: it cannot build the sandbox's namespaces; the job does not run there."""


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


class LocalPool(Executor):
    """``jobs`` runners at a time on this machine, and with ``settings.warm`` as many more started ahead.

    A warm runner is the runner of a job next in line: its kernel is started in the job's sandbox,
    torch imported and the guard installed while the jobs before it run, so that a job taken from the
    line begins at its first cell. Its limits per notebook count from there. A stopped run ends the
    warm runners with the others, their jobs not begun.
    """

    def __init__(self, settings: Settings, runners=RUNNERS):
        self.settings, self.runners = settings, runners
        self.zygote = None if no_zygote(settings) else _EARLY.pop() if _EARLY else new_zygote()
        if self.zygote is not None:
            self.zygote.start()  # its imports (torch's 2 s) run while the grader sets the run up
        self.jobs = self.local_cores = max(1, settings.jobs or usable_cores())
        self.ahead = self.jobs if settings.warm else 0
        self.line: collections.deque[tuple[Path, Future]] = collections.deque()
        self.warm: dict[Path, subprocess.Popen] = {}
        self.changed = threading.Condition()
        self.closing = False
        self.slots = [threading.Thread(target=self._slot, name=f"grading-slot-{n}", daemon=True)
                      for n in range(self.jobs)]
        for slot in self.slots:
            slot.start()
        self.description = (f"this machine, {self.jobs} at a time" + (", kernels started ahead" if self.ahead else "")
                            + (", runners and kernels forked from a zygote" if self.zygote else ""))


    def submit(self, job_file: Path) -> Future:
        future: Future = Future()
        with self.changed:
            if self.closing:
                raise RuntimeError("the pool is closed")
            self.line.append((job_file, future))
            self.changed.notify()
        return future

    def _slot(self) -> None:
        while True:
            with self.changed:
                while not self.line and not self.closing:
                    self.changed.wait()
                if not self.line:
                    return
                job_file, future = self.line.popleft()
                process = self.warm.pop(job_file, None)
                taken = future.set_running_or_notify_cancel()  # False: cancelled while in line
                if taken:
                    for waiting, _ in list(self.line)[:self.ahead]:
                        if len(self.warm) >= self.ahead:
                            break
                        if waiting not in self.warm:
                            try:
                                started = launch(waiting, self.runners, warm=True, zygote=self.zygote)
                            except OSError:  # it starts when its turn comes, and says then what fails
                                started = None
                            if started is not None:
                                self.warm[waiting] = started
            if not taken:
                finish(process, job_file, self.settings, self.runners, go=False)
                continue
            try:
                finish(process or launch(job_file, self.runners, zygote=self.zygote), job_file, self.settings,
                       self.runners)
            except BaseException as error:  # noqa: BLE001 - the future carries it
                future.set_exception(error)
            else:
                future.set_result(None)

    def stop(self) -> None:
        self.runners.stop()
        with self.changed:
            self.closing = True
            for _, future in self.line:
                future.cancel()
            self.line.clear()
            warm, self.warm = list(self.warm.items()), {}
            self.changed.notify_all()
        for job_file, process in warm:  # ended by runners.stop(): reaped here
            finish(process, job_file, self.settings, self.runners, go=False)
        for slot in self.slots:
            slot.join()

    def close(self) -> None:
        with self.changed:
            self.closing = True
            self.changed.notify_all()
        for slot in self.slots:
            slot.join()
        if self.zygote is not None:
            self.zygote.close()


def no_zygote(settings: Settings) -> str:
    """Why runners and kernels start fresh here; "" where a zygote forks them (:mod:`autograder.run.zygote`)."""
    if not settings.zygote:
        return "--no-zygote"
    if not sandbox.isolation_of(settings).namespaces:
        return "the sandbox has no namespaces here"
    return zygote_usable()


def new_zygote() -> Zygote:
    """A zygote with the kernel's environment as it is when its first runner starts (a runner's, started
    fresh then, would have that environment)."""
    return Zygote(lambda: kernel_env("/tmp/home", tool_env()), ROOT)


_EARLY: list[Zygote] = []  # started by start_zygote_early, taken by the run's LocalPool


def start_zygote_early(settings: Settings) -> None:
    """Start the zygote of this run's local pool now, for the pool to take when it is made.

    Its imports (torch's, over a second of one core) then run beside the grader's own set-up (which
    imports torch too, to name the devices a run checks) instead of after it, so the first runner
    forks sooner. Nothing for a Dask cluster, whose workers have their own, or where no zygote is used;
    a zygote no pool takes (the run stopped first) ends when the grader does.
    """
    if settings.on_cluster or no_zygote(settings) or _EARLY:
        return
    zygote = new_zygote()
    zygote.start()
    atexit.register(zygote.close)
    _EARLY.append(zygote)


_WORKER_ZYGOTE: list[Zygote] = []  # a Dask worker's, made at its first job that can use one, kept for its life
_WORKER_ZYGOTE_LOCK = threading.Lock()


def worker_zygote(settings: Settings) -> Zygote | None:
    """On a Dask worker: the zygote its jobs' runners are forked from, or None where they start fresh."""
    if no_zygote(settings):
        return None
    with _WORKER_ZYGOTE_LOCK:
        if not _WORKER_ZYGOTE:
            _WORKER_ZYGOTE.append(new_zygote())
            atexit.register(_WORKER_ZYGOTE[0].close)
        return _WORKER_ZYGOTE[0]


def one_line(error: BaseException) -> str:
    """An exception's message in one line, at most 200 characters."""
    text = " ".join(str(error).split())
    return text if len(text) <= 200 else text[:197] + "..."


def unanswered(address: str, error: BaseException) -> ClusterError:
    """The error for a scheduler that did not answer: refused, timed out, or not speaking Dask."""
    return ClusterError(f"no Dask scheduler answered at {address} within {CONNECT_TIMEOUT_S} s "
                        f"({type(error).__name__}: {one_line(error)}); nothing was graded")


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
ON_WORKER = "__import__('autograder.run.executors', fromlist=['run_bundle']).run_bundle(bundle, settings, stop)"


def run_bundle(bundle: bytes, settings: dict, stop: str | None = None) -> bytes:
    """On a worker: run one packed job in a sandbox of this machine; return its results, packed.

    ``settings`` are the grader's :class:`Settings` as a dict. The job's folder
    is unpacked into a new temporary folder, which the sandbox hides from the
    kernel (but for the job's working copy), together with this machine's copy
    of the course. ``stop`` names the Dask event the grader sets when its run
    is stopped: the job's runner is then ended as the local pool ends its own.
    """
    settings = Settings(**settings)
    isolation = sandbox.isolation_of(settings)
    if settings.sandbox and not isolation.namespaces:  # a worker runs students' code only as the local pool would
        raise SandboxUnavailable(f"worker {_worker_name()} cannot build the grading sandbox: {isolation.reason} "
                                 "(grade with --no-sandbox to accept a worker without it)")
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
    """A process's id, start time and pid namespace (a later process given the same id is not taken for it);
    None where there is no such process, or only its exit status is left (a zombie). Without ``/proc``
    (macOS), its id alone."""
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
    fields = stat[stat.rfind(")") + 2:].split()
    return None if fields[0] in "ZX" else f"{pid} {fields[19]} {namespace}"


def sweep_orphans(folder: Path) -> list[Path]:
    """Remove the job folders in ``folder`` whose worker process has ended; return them.

    A worker ended mid-job (SIGKILL, the out-of-memory killer, a Slurm preemption) cannot remove its job's
    temporary folder; the next job a worker of this machine starts removes it. A folder whose owner is
    unknown (being made, or of an older grader) or ran in another pid namespace (a container that shares
    this folder) is left.
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
    finally:  # not waited for: it sees this within its 1 s wait, and a job's end must not wait for that
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

    A job the cluster could not run (its worker lacks the course, its workers
    kept dying, or no worker that can take it joined the scheduler for
    ``workerless_s`` seconds while jobs waited) completes with a
    :class:`ClusterError` that says why: the grader stops and grades nothing
    more, rather than scoring a student for the cluster's failure.
    """

    def __init__(self, settings: Settings, address: str | None = None, local: int = 0, gpu: bool = False,
                 workerless_s: float = WORKERLESS_S):
        try:
            from distributed import Client, LocalCluster
        except ImportError as error:
            raise ClusterError(f"Dask is not installed ({error}): pip install distributed") from None
        self.settings, self.gpu, self.cluster = settings, gpu, None
        self.local_cores = local
        self.run_id = secrets.token_hex(4)
        self.stop_event = f"grade-stop-{self.run_id}"  # set by stop(): the workers end the jobs they run
        try:
            if local:
                self.cluster = apart(lambda: LocalCluster(n_workers=local, threads_per_worker=1, processes=True,
                                                          dashboard_address=None, silence_logs=40))
                address = self.cluster.scheduler_address
            else:
                check_scheduler(address)
            self.client = apart(lambda: Client(address, timeout=CONNECT_TIMEOUT_S, set_as_default=False))
        except ClusterError:
            raise
        except Exception as error:  # noqa: BLE001 - refused, timed out, or something that is not a Dask scheduler
            if self.cluster is not None:
                self.cluster.close()
            raise unanswered(address, error) from None
        workers = len(self._able_workers())
        self.description = (f"a Dask cluster at {address} ({workers} worker(s){' with GPU=1' if gpu else ''} "
                            f"when grading began{', jobs need GPU=1' if gpu else ''})")
        self.address, self.workerless_s = address, workerless_s
        self.lock = threading.Lock()
        self.pending: dict = {}  # remote future -> the Future the grader waits on
        self.closed = threading.Event()
        self.watchdog = threading.Thread(target=self._watch, name="dask-workers", daemon=True)
        self.watchdog.start()

    def _able_workers(self) -> list[str]:
        """The workers that can run a job now (with ``gpu``, those that offer the resource GPU)."""
        workers = self.client.scheduler_info(n_workers=-1).get("workers", {})
        return [address for address, worker in workers.items()
                if not self.gpu or worker.get("resources", {}).get("GPU", 0) >= 1]

    def submit(self, job_file: Path) -> Future:
        folder = job_file.parent
        done: Future = Future()
        key = f"grade-{self.run_id}-" + "-".join(folder.parts[-3:])
        arguments = {"bundle": pack(folder), "settings": dataclasses.asdict(self.settings), "stop": self.stop_event}
        with self.lock:
            remote = self.client.submit(eval, ON_WORKER, arguments, key=key, pure=False,
                                        resources={"GPU": 1} if self.gpu else None)
            self.pending[remote] = done

        def arrived(remote_future) -> None:
            with self.lock:
                if self.pending.pop(remote_future, None) is None:
                    return  # the watchdog already failed it
            reason = None
            try:
                if remote_future.cancelled():
                    raise ClusterError(f"job {key} was cancelled")
                unpack(remote_future.result(), folder)  # once per job: only the future that finished writes
            except BaseException as error:  # noqa: BLE001 - the cluster could not run it: the grader stops, it scores nothing
                reason = error if isinstance(error, ClusterError) else ClusterError(
                    f"the Dask cluster at {self.address} could not run job {key}: "
                    f"{type(error).__name__}: {one_line(error)}"
                    + (" (is the course installed on every worker?)" if isinstance(error, ImportError) else ""))
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
        """Fail every waiting job once no worker that can run them has been there for ``workerless_s``."""
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
            need = ("with the resource GPU=1 (python -m autograder worker ADDRESS --gpu K) "
                    if self.gpu else "")
            reason = ClusterError(f"no Dask worker {need}has been connected to the scheduler at {self.address} "
                                  f"for {self.workerless_s:g} s while {len(failed)} job(s) waited")
            self.client.cancel(list(failed), force=True)
            for done in failed.values():
                done.set_exception(reason)

    def stop(self) -> None:
        """Cancel the jobs not begun, and have the workers end those they run (as the local pool does)."""
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


def apart(make):
    """``make()`` in a thread of its own, its result or its exception here.

    Dask's client and ``asyncio.run`` refuse a thread whose event loop is
    running, as the main thread of a Jupyter kernel's is (an instructor who
    grades from a notebook) or one a test left behind; the client, once made,
    runs its own loop in its own thread and is used from any.
    """
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="dask-start") as pool:
        return pool.submit(make).result()


def check_scheduler(address: str) -> None:
    """Raise :class:`ClusterError` unless a Dask scheduler answers at ``tcp://HOST:PORT`` within 5 s."""
    import asyncio
    from urllib.parse import urlsplit

    parts = urlsplit(address if "://" in address else "tcp://" + address)
    try:
        port = parts.port
    except ValueError:
        port = None
    if parts.scheme != "tcp" or not parts.hostname or not port:
        raise ClusterError(f"a Dask scheduler's address is tcp://HOST:PORT; got {address!r}")

    async def identity() -> dict:
        from distributed.comm import connect

        comm = await connect(address, timeout=CONNECT_TIMEOUT_S)
        try:
            await comm.write({"op": "identity", "reply": True})
            return await comm.read()
        finally:
            comm.abort()

    try:
        socket.create_connection((parts.hostname, port), timeout=CONNECT_TIMEOUT_S).close()  # refused: at once
        answer = apart(lambda: asyncio.run(asyncio.wait_for(identity(), CONNECT_TIMEOUT_S)))
    except Exception as error:  # noqa: BLE001 - refused, timed out, or a peer that does not speak Dask
        raise unanswered(address, error) from None
    if not isinstance(answer, dict) or answer.get("type") != "Scheduler":
        raise ClusterError(f"what answered at {address} is not a Dask scheduler; nothing was graded")


def start_process(command: list[str], log: Path, env: dict | None = None, cwd: Path = ROOT) -> subprocess.Popen:
    """``command`` (a scheduler, a worker) as a process of its own session, writing to ``log``.

    It gets SIGTERM when this process ends, however that happens (:func:`autograder.run.sandbox.tethered`);
    ``env`` defaults to :func:`autograder.course.build.tool_env`. End it with :func:`stop_group`.
    """
    from autograder.run.sandbox import tethered

    with log.open("w") as handle:
        return subprocess.Popen(tethered(command, signal.SIGTERM), cwd=cwd, stdout=handle, stderr=subprocess.STDOUT,
                                env=env or tool_env(), start_new_session=True)


def wait_for_workers(client, names: set[str], timeout_s: float = 60) -> None:
    """Wait until workers of each of ``names`` have joined ``client``'s scheduler; RuntimeError after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not names <= {worker["name"] for worker in client.scheduler_info()["workers"].values()}:
        if time.monotonic() > deadline:
            raise RuntimeError(f"workers {sorted(names)} did not join the scheduler within {timeout_s:g} s")
        time.sleep(0.2)


def runner_sees() -> dict:
    """What a process that this Dask worker starts (a runner is one) sees: its host's name, the job id of the Slurm
    job it is in (or None), ``CUDA_VISIBLE_DEVICES`` and the GPUs torch finds there. Submit it to a worker; for
    checks of a cluster's set-up (gpu-check, slurm-check). On a machine without a GPU it reports 0 GPUs and no
    name.
    """
    import json

    code = ("import json, os, socket, torch; print(json.dumps({'host': socket.gethostname(), "
            "'SLURM_JOB_ID': os.environ.get('SLURM_JOB_ID'), "
            "'CUDA_VISIBLE_DEVICES': os.environ.get('CUDA_VISIBLE_DEVICES'), "
            "'device_count': torch.cuda.device_count(), "
            "'name': torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    return json.loads(done.stdout) if done.returncode == 0 else {"error": done.stderr[-500:]}


def jobs_per_worker(workdir: Path) -> dict[str, int]:
    """How many of the jobs in a grading work folder each worker ran, by the name in their :data:`RAN_ON`."""
    counts: dict[str, int] = {}
    for path in sorted(workdir.glob(f"jobs/*/*/*/{RAN_ON}")):
        name = path.read_text().split()[0]
        counts[name] = counts.get(name, 0) + 1
    return counts


def start_scheduler(log: Path, env: dict | None = None, timeout_s: float = 60) -> tuple[subprocess.Popen, str]:
    """A ``dask scheduler`` on a free port of 127.0.0.1, as a process of its own; returns it and its address.

    It writes to ``log``, runs in a session of its own and gets SIGTERM when this process ends, however
    that happens (:func:`start_process`). Returns once it accepts connections; raises
    RuntimeError, with the end of its log, if it ended or did not within ``timeout_s``. For checks
    and tests on one machine; end it with :func:`stop_group`.
    """
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    process = start_process([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host", "127.0.0.1",
                             "--port", str(port), "--no-dashboard"], log, env)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process, f"tcp://127.0.0.1:{port}"
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                stop_group(process)
                raise RuntimeError(f"the Dask scheduler did not start within {timeout_s:g} s:\n"
                                   f"{log.read_text(errors='replace')[-2000:]}") from None
            time.sleep(0.2)


def stop_group(process: subprocess.Popen, timeout_s: float = 15) -> None:
    """SIGTERM ``process`` (a server, a scheduler, a worker), then SIGKILL its process group if it has not ended."""
    process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()


def executor_for(settings: Settings) -> Executor:
    """The executor ``settings`` ask for (raises :class:`ClusterError` for a cluster it cannot reach)."""
    if settings.on_cluster:
        return DaskExecutor(settings, settings.scheduler, settings.dask_local, settings.gpu_jobs)
    return LocalPool(settings)
