"""The cluster step of ``autograder gpu-check`` (:mod:`.gpucheck`): part of the demo class graded
through a real Dask scheduler, its jobs routed to a worker that owns the GPU."""

from __future__ import annotations

import sys
import time

from devcourse.instructor.gpureport import WORKDIR, Check, Context

CLUSTER_ASSIGNMENTS = ("01_device_placement", "07_multi_device_training")


def check_cluster(ctx: Context) -> Check:
    """Part of the demo class (``CLUSTER_ASSIGNMENTS``) graded through a real Dask scheduler with
    ``--gpu-jobs``, by a worker started with ``--gpu 0`` beside one without the GPU resource: every
    job must run on the GPU worker, whose runners see only its GPU, with the expected scores."""
    from distributed import Client

    from autograder import batch
    from devcourse.instructor.demo import unexpected_scores
    from devcourse.instructor.paths import DEMO_CLASS
    from autograder.record.report import format_table
    from autograder.run.executors.cluster import (
        RAN_ON,
        jobs_per_worker,
        runner_sees,
        start_process,
        start_scheduler,
        stop_group,
        wait_for_workers,
    )
    from autograder.settings import Settings

    folder = WORKDIR / "cluster"
    folder.mkdir(parents=True, exist_ok=True)
    scheduler, address = start_scheduler(folder / "scheduler.log")
    processes = [scheduler]
    try:
        worker = [sys.executable, "-m", "autograder", "worker", address]
        processes.append(
            start_process(
                worker + ["--gpu", "0", "--nthreads", "4", "--name", "gpu0"], folder / "gpu0.log"
            )
        )
        processes.append(
            start_process(
                worker + ["--nthreads", "2", "--name", "cpu-only"], folder / "cpu-only.log"
            )
        )
        with Client(address, timeout=30, set_as_default=False) as client:
            wait_for_workers(client, {"gpu0", "cpu-only"}, timeout_s=90)
            sees = client.submit(runner_sees, resources={"GPU": 1}, pure=False).result(timeout=180)
        settings = Settings(
            scheduler=address,
            gpu_jobs=True,
            assignments=CLUSTER_ASSIGNMENTS,
            progress=False,
            feedback=False,
        )
        started = time.monotonic()
        results = [
            r
            for r in batch.grade(DEMO_CLASS, folder / "work", settings)
            if r.assignment in CLUSTER_ASSIGNMENTS
        ]
        seconds = time.monotonic() - started
    finally:
        for process in reversed(processes):
            stop_group(process)
    wrong = unexpected_scores(results)
    ran_on = jobs_per_worker(folder / "work")
    # The values the checks saw, kept per job by the grader: a CUDA tensor or device among them
    # shows that the kernel in the job's sandbox ran checks on the GPU (on a machine without one
    # they show sim:0 and sim:1).
    observed = sorted((folder / "work").glob("jobs/*/*/*/observations.json"))
    on_gpu = sum('"cuda:' in path.read_text() for path in observed)
    body = [
        (
            "Scheduler and workers: separate processes on this machine; `gpu0` started with `python"
            " -m autograder worker ADDRESS --gpu 0 --nthreads 4`, `cpu-only` without `--gpu`."
        ),
        f"- a process started by `gpu0` sees: {sees}",
        f"- jobs per worker (`{RAN_ON}`): {ran_on}",
        f"- jobs whose checks saw a CUDA device (`observations.json`): {on_gpu} of {len(observed)}",
        (
            f"- {len(results)} rows of {', '.join(CLUSTER_ASSIGNMENTS)} graded in {seconds:.1f} s "
            "(submitted notebooks and each assignment's solution, the canary)"
        ),
        "",
        "```",
        format_table(results),
        "```",
    ]
    if wrong:
        body += ["", "Scores that differ from expected_scores.csv:", *(f"- {w}" for w in wrong)]
    routed = set(ran_on) == {"gpu0"} and sum(ran_on.values()) >= sum(
        r.score is not None for r in results
    )
    pinned = sees.get("CUDA_VISIBLE_DEVICES") == "0" and sees.get("device_count") == (
        1 if ctx.cuda else 0
    )
    good = routed and pinned and not wrong and results and (on_gpu > 0 or not ctx.cuda)
    summary = (
        f"{len(results)} rows, jobs per worker {ran_on}, runner sees"
        f" CUDA_VISIBLE_DEVICES={sees.get('CUDA_VISIBLE_DEVICES')} and {sees.get('device_count')}"
        f" GPU(s), checks on CUDA in {on_gpu} of {len(observed)} jobs; {len(wrong)} unexpected"
        " scores"
    )
    if not ctx.cuda:
        return Check(
            "cluster", "not run" if good else "failed", "rehearsed on the CPU: " + summary, body
        )
    return Check("cluster", "passed" if good else "failed", summary, body)
