"""python -m autograder slurm-check: grade part of the demo class on Slurm, through dask-jobqueue.

Run on a Slurm login node before grading a class there, :func:`check` asks for ``--jobs`` workers as
``docs/cluster.md`` sets them up, grades ``--assignment`` (01) of the demo class through them and
exits 0 when every job ran there with the scores of ``expected_scores.csv``, 1 when not, 2 when it
could not start. Without ``sbatch`` or ``dask_jobqueue`` it says so and submits nothing; it needs a
GPU only with ``--gpu``.
"""

from __future__ import annotations

import importlib.util
import logging
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from devcourse.instructor.paths import ROOT

WORKDIR = ROOT / "build" / "slurm-check"
JOB_NAME = "course-grader"


def cluster_options(
    queue: str | None,
    account: str | None,
    walltime: str,
    memory: str,
    gpu: bool,
    log_directory: Path,
    scheduler_interface: str | None = None,
) -> dict:
    """The ``SLURMCluster`` parameters: one single-threaded worker per Slurm job, this checkout's
    Python.

    The names are dask-jobqueue's since 0.8 (``job_extra_directives``, ``worker_extra_args``,
    ``job_script_prologue``). With ``gpu`` each job asks Slurm for one GPU (``--gres=gpu:1``) and
    its worker offers ``GPU=1``; :func:`check` then grades with ``--gpu-jobs`` and shows each
    worker's ``CUDA_VISIBLE_DEVICES``. ``scheduler_interface`` (``ib0``, say) is the login node's
    network interface the scheduler listens on, for a login node whose default address the compute
    nodes do not reach.
    """
    options = dict(
        job_name=JOB_NAME,
        walltime=walltime,
        cores=1,
        processes=1,
        memory=memory,
        python=sys.executable,
        job_script_prologue=[f"cd {ROOT}"],
        log_directory=str(log_directory),
    )
    if scheduler_interface:
        options["scheduler_options"] = {"interface": scheduler_interface}
    if queue:
        options["queue"] = queue
    if account:
        options["account"] = account
    if gpu:
        options["job_extra_directives"] = ["--gres=gpu:1"]
        options["worker_extra_args"] = ["--resources", "GPU=1"]
    return options


def job_script(options: dict, scheduler: str = "tcp://SCHEDULER:8786") -> str:
    """The batch script ``SLURMCluster(**options)`` submits for each job, for a scheduler at
    ``scheduler``."""
    from dask_jobqueue.slurm import SLURMJob

    # the cluster's, not a job's
    job = {key: value for key, value in options.items() if key != "scheduler_options"}
    return SLURMJob(scheduler=scheduler, name="worker", **job).job_script()


def unavailable() -> str | None:
    """Why this machine cannot submit to Slurm through dask-jobqueue, or None when it can."""
    if importlib.util.find_spec("dask_jobqueue") is None:
        return (
            "the dask_jobqueue package is not installed: pip install dask-jobqueue "
            "(into the course's environment, on the login node)"
        )
    if shutil.which("sbatch") is None:
        return "sbatch is not on the PATH: run this on a Slurm login node"
    return None


def sbatch_refuses(script: str) -> str | None:
    """Slurm's reason for refusing ``script`` (``sbatch --test-only``: nothing is submitted), or
    None."""
    with tempfile.NamedTemporaryFile("w", suffix=".sh") as handle:
        handle.write(script)
        handle.flush()
        done = subprocess.run(
            ["sbatch", "--test-only", handle.name], capture_output=True, text=True, timeout=60
        )
    if done.returncode == 0:
        return None
    return (
        " ".join(line.removeprefix("sbatch: error: ") for line in done.stderr.strip().splitlines())
        or f"exit {done.returncode}"
    )


SQUEUE = ["squeue", "--me", "--name", JOB_NAME]  # this user's jobs of the check


def _squeue() -> str:
    done = subprocess.run([*SQUEUE, "--format", "%i %T %R"], capture_output=True, text=True)
    return (done.stdout or done.stderr).strip()


def _queued() -> set[str] | None:
    """The ids of this user's jobs of the check that Slurm still holds (pending or running), or None
    if squeue fails."""
    done = subprocess.run([*SQUEUE, "--noheader", "--format", "%i"], capture_output=True, text=True)
    return set(done.stdout.split()) if done.returncode == 0 else None


def await_workers(
    joined,
    queued,
    wanted: int,
    timeout_s: float,
    log_directory: Path,
    poll_s: float = 5,
    grace_s: float = 60,
) -> str | None:
    """Wait until ``joined()`` workers reach ``wanted``; None then, else why not.

    It gives up at ``timeout_s``, or as soon as the jobs it saw in Slurm's queue (``queued()``: the
    job ids Slurm holds, or None when squeue fails) have all left it without their workers joining,
    or when none appeared there within ``grace_s``: a job that fails at its start (an output folder
    the node cannot write, a Python the node does not have) then says so in seconds, with its log if
    one was written, instead of after the whole timeout.
    """
    began = time.monotonic()
    seen: set[str] = set()
    while True:
        count = joined()
        if count >= wanted:
            return None
        now = queued()
        seen |= now or set()
        waited = time.monotonic() - began
        if now is not None and ((seen and not now) or (not seen and waited >= grace_s)):
            return (
                f"{count} of {wanted} workers joined, and "
                + (
                    f"their Slurm jobs ({', '.join(sorted(seen))}) ended after {waited:.0f} s"
                    if seen
                    else f"no job of theirs was in Slurm's queue after {waited:.0f} s"
                )
                + "; "
                + job_logs(log_directory, seen)
            )
        if waited >= timeout_s:
            return (
                f"{count} of {wanted} workers joined within {timeout_s:g} s; squeue"
                f" says:\n{_squeue()}\n" + job_logs(log_directory, seen)
            )
        time.sleep(poll_s)


def job_logs(log_directory: Path, ids: set[str]) -> str:
    """The end of each of the jobs' logs in ``log_directory``, or why there are none."""
    found = sorted(
        path
        for path in Path(log_directory).glob(f"{JOB_NAME}-*.*")
        if path.stem.rsplit("-", 1)[-1] in ids
    )
    if not found:
        return (
            f"no log of theirs in {log_directory}: Slurm could not write one there (a folder the"
            " compute nodes do not share with this one?), or they have not started; slurmd's log"
            " on the node says why"
        )
    tails = []
    for path in found:
        lines = path.read_text(errors="replace").strip().splitlines()[-5:]
        tails.append(
            f"{path}:" + "".join(f"\n    {line}" for line in lines) if lines else f"{path}: empty"
        )
    return "their logs end:\n  " + "\n  ".join(tails)


def check(args) -> int:
    """Ask Slurm for the workers, grade the assignment through them, say whether all went as it
    should; the exit code (``args``: what ``python -m autograder slurm-check`` was given)."""
    options = cluster_options(
        args.queue,
        args.account,
        args.walltime,
        args.memory,
        args.gpu,
        args.workdir / "logs",
        args.scheduler_interface,
    )
    if args.print_job_script:
        if importlib.util.find_spec("dask_jobqueue") is None:
            print(unavailable(), file=sys.stderr)
            return 2
        print(job_script(options))
        return 0
    why = unavailable()
    if why:
        print(f"slurm-check: {why}. Nothing was submitted.", file=sys.stderr)
        return 2

    from dask_jobqueue import SLURMCluster
    from distributed import Client

    from autograder import batch
    from devcourse.instructor.demo import unexpected_scores
    from devcourse.instructor.paths import DEMO_CLASS
    from autograder.run.executors.cluster import jobs_per_worker, runner_sees
    from autograder.settings import Settings

    if args.workdir.exists():
        shutil.rmtree(args.workdir / "work", ignore_errors=True)
    args.workdir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    refused = sbatch_refuses(job_script(options))
    if refused:
        print(
            f"slurm-check: sbatch refuses the workers' job script: {refused}. Nothing was"
            " submitted.",
            file=sys.stderr,
        )
        return 2
    cluster = SLURMCluster(**options)
    try:
        with Client(cluster) as client:
            print(
                f"[slurm-check] scheduler {cluster.scheduler_address}; asking Slurm for {args.jobs}"
                " jobs",
                flush=True,
            )
            cluster.scale(jobs=args.jobs)
            why = await_workers(
                lambda: len(client.scheduler_info()["workers"]),
                _queued,
                args.jobs,
                args.start_timeout,
                args.workdir / "logs",
            )
            if why:
                print(f"[slurm-check] {why}\nNothing was graded.", file=sys.stderr)
                return 1
            workers = sorted(w["name"] for w in client.scheduler_info()["workers"].values())
            sees = {
                w["name"]: (
                    client.submit(
                        runner_sees, workers=[address], pure=False, allow_other_workers=False
                    ).result(60)
                )
                for address, w in client.scheduler_info()["workers"].items()
            }
            print(
                f"[slurm-check] {len(workers)} workers up after {time.monotonic() - started:.0f} s:"
                f" {sees}",
                flush=True,
            )
            settings = Settings(
                scheduler=cluster.scheduler_address,
                gpu_jobs=args.gpu,
                assignments=(args.assignment,),
                progress=False,
                feedback=False,
            )
            graded = time.monotonic()
            results = [
                r
                for r in batch.grade(DEMO_CLASS, args.workdir / "work", settings)
                if r.assignment == args.assignment
            ]
            seconds = time.monotonic() - graded
    finally:
        # The scheduler runs in this process. A worker's listener for the grader's stop event
        # (executors.dask._ended_when_set) may be in a 1 s wait when closing the cluster ends its
        # Slurm job, which the scheduler logs as an error with a traceback: not one of grading.
        logging.getLogger("distributed.event").setLevel(logging.CRITICAL)
        try:
            cluster.close()  # cancels the Slurm jobs
        except Exception as error:  # noqa: BLE001 - e.g. a job Slurm never started: say so, keep the result
            print(
                f"[slurm-check] closing the cluster: {type(error).__name__} {error}; see squeue"
                f" --name {JOB_NAME} for jobs left",
                file=sys.stderr,
            )
    ran_on = jobs_per_worker(args.workdir / "work")
    wrong = unexpected_scores(results)
    in_slurm = all(seen.get("SLURM_JOB_ID") for seen in sees.values())
    pinned = all(seen.get("CUDA_VISIBLE_DEVICES") for seen in sees.values()) if args.gpu else True
    good = (
        bool(results)
        and set(ran_on) <= set(workers)
        and bool(ran_on)
        and in_slurm
        and pinned
        and not wrong
    )
    hosts = sorted({seen.get("host") or "?" for seen in sees.values()})
    print(
        f"[slurm-check] {len(results)} rows of {args.assignment} graded in {seconds:.0f} s; jobs"
        f" per worker {ran_on}; workers on {len(hosts)} host(s) ({', '.join(hosts)}); every worker"
        f" inside a Slurm job: {in_slurm}"
        + (f"; every worker given a GPU by Slurm: {pinned}" if args.gpu else "")
        + f"; {len(wrong)} unexpected scores",
        flush=True,
    )
    for line in wrong:
        print(f"  {line}")
    print(f"[slurm-check] {'passed' if good else 'failed'}")
    return 0 if good else 1
