"""The Slurm check and docs/cluster.md's Slurm set-up, as far as a machine without Slurm can take
them.

dask-jobqueue renders the batch script of a Slurm job without submitting it, so the parameters the
docs and the check pass are checked by dask-jobqueue itself; the grading through real Slurm jobs is
run by hand (docs/cluster.md says where and what it gave).
"""

import os
import re
import sys

import pytest

from devcourse.instructor import slurmcheck
from devcourse.instructor import cli
from devcourse.instructor.paths import ROOT

DOCS = ROOT / "docs" / "cluster.md"


def test_the_job_script_runs_a_worker_of_this_checkouts_python_from_this_checkout(tmp_path):
    options = slurmcheck.cluster_options(
        "normal", "teaching", "00:10:00", "4GB", gpu=False, log_directory=tmp_path
    )
    script = slurmcheck.job_script(options, scheduler="tcp://10.0.0.1:8786")
    assert (
        "#SBATCH -p normal" in script
        and "#SBATCH -A teaching" in script
        and "#SBATCH -t 00:10:00" in script
    )
    assert f"cd {ROOT}" in script
    assert f"{sys.executable} -m distributed.cli.dask_worker tcp://10.0.0.1:8786" in script
    assert "--nthreads 1" in script and "gres" not in script and "GPU=1" not in script


def test_with_gpu_each_job_asks_slurm_for_a_gpu_and_its_worker_offers_the_resource(tmp_path):
    options = slurmcheck.cluster_options(
        None, None, "00:10:00", "4GB", gpu=True, log_directory=tmp_path
    )
    script = slurmcheck.job_script(options)
    assert "#SBATCH --gres=gpu:1" in script
    assert "--resources GPU=1" in script
    assert "#SBATCH -p" not in script  # no --queue: Slurm's default partition


def test_without_sbatch_it_says_so_and_submits_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch there
    assert cli.slurm_check(["--workdir", str(tmp_path / "work")]) == 2
    assert "sbatch is not on the PATH" in capsys.readouterr().err
    assert not (tmp_path / "work").exists()


def test_print_job_script_prints_the_script_it_would_submit(tmp_path, capsys):
    assert (
        cli.slurm_check(
            ["--print-job-script", "--gpu", "--queue", "gpu", "--workdir", str(tmp_path)]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert (
        out.startswith("#!/usr/bin/env bash") and "#SBATCH -p gpu" in out and "--gres=gpu:1" in out
    )


class _Rendered(Exception):
    pass


def test_the_docs_slurm_snippets_are_parameters_dask_jobqueue_accepts(monkeypatch):
    """Each SLURMCluster(...) call in docs/cluster.md's Slurm section renders a job script with what
    it asks for."""
    import time

    import dask_jobqueue
    from dask_jobqueue.slurm import SLURMJob

    text = DOCS.read_text()
    section = text[text.index("## Slurm, with dask-jobqueue") : text.index("## Kubernetes")]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 2, "the Slurm section's two snippets (CPU and GPU workers)"
    scripts = {}

    class Recorder:
        scheduler_address = "tcp://login:8786"

        def __init__(self, **kwargs):
            kwargs.pop("scheduler_options", None)  # the cluster's own, not the job's
            self.script = SLURMJob(
                scheduler=self.scheduler_address, name="worker", **kwargs
            ).job_script()
            scripts[kwargs["queue"]] = self.script

        def scale(self, jobs):
            self.jobs = jobs

    def stop(seconds):
        raise _Rendered

    monkeypatch.setattr(dask_jobqueue, "SLURMCluster", Recorder)
    monkeypatch.setattr(time, "sleep", stop)
    namespace: dict = {}
    with pytest.raises(_Rendered):  # the first snippet keeps its cluster alive with a sleep loop
        exec(compile(blocks[0], "cluster.md (CPU workers)", "exec"), namespace)
    exec(
        compile(
            "from dask_jobqueue import SLURMCluster\n" + blocks[1],
            "cluster.md (GPU workers)",
            "exec",
        ),
        namespace,
    )
    assert "#SBATCH -p normal" in scripts["normal"] and "--nworkers 16" in scripts["normal"]
    assert "#SBATCH --gres=gpu:1" in scripts["gpu"] and "--resources GPU=1" in scripts["gpu"]
    for script in scripts.values():
        assert (
            "cd /path/to/course" in script
            and "/path/to/course/.venv/bin/python -m distributed.cli.dask_worker" in script
        )


def test_a_job_script_slurm_refuses_stops_the_check_before_anything_is_submitted(
    tmp_path, monkeypatch, capsys
):
    """sbatch --test-only's refusal (as Slurm 22.05 words it for a partition it lacks) is the
    message; no job is sent."""
    calls = tmp_path / "calls"
    sbatch = tmp_path / "sbatch"
    sbatch.write_text(
        f'#!/bin/sh\necho "$@" >> {calls}\n'
        "echo 'sbatch: error: invalid partition specified: nosuch' >&2\n"
        "echo 'sbatch: error: Batch job submission failed: Invalid partition name specified' >&2\n"
        "exit 1\n"
    )
    sbatch.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert cli.slurm_check(["--queue", "nosuch", "--workdir", str(tmp_path / "work")]) == 2
    err = capsys.readouterr().err
    assert "sbatch refuses the workers' job script: invalid partition specified: nosuch" in err
    assert all(line.startswith("--test-only ") for line in calls.read_text().splitlines())


def _queue(*answers):
    """A squeue stand-in: each call returns the next answer (the last one again once they run
    out)."""
    answers = list(answers)
    return lambda: answers.pop(0) if len(answers) > 1 else answers[0]


def test_jobs_that_end_before_their_workers_join_stop_the_wait_at_once_with_their_logs(tmp_path):
    (tmp_path / "course-grader-41.err").write_text(
        "start\n/opt/venv/bin/python: No such file or directory\n"
    )
    (tmp_path / "course-grader-7.err").write_text("another run's job\n")
    why = slurmcheck.await_workers(
        lambda: 0,
        _queue({"41", "42"}, {"42"}, set()),
        2,
        timeout_s=600,
        log_directory=tmp_path,
        poll_s=0,
    )
    assert why.startswith("0 of 2 workers joined, and their Slurm jobs (41, 42) ended after")
    assert "No such file or directory" in why and "another run" not in why


def test_jobs_without_logs_point_at_a_log_folder_the_nodes_may_not_share(tmp_path):
    why = slurmcheck.await_workers(
        lambda: 1, _queue({"5", "6"}, set()), 2, timeout_s=600, log_directory=tmp_path, poll_s=0
    )
    assert why.startswith("1 of 2 workers joined") and "no log of theirs" in why and "share" in why


def test_the_wait_ends_when_the_workers_join_and_waits_while_jobs_are_queued(tmp_path):
    joined = iter([0, 0, 1, 2])
    assert (
        slurmcheck.await_workers(
            lambda: next(joined),
            _queue({"5", "6"}),
            2,
            timeout_s=600,
            log_directory=tmp_path,
            poll_s=0,
        )
        is None
    )


def test_jobs_still_pending_at_the_timeout_are_reported_with_squeue(tmp_path, monkeypatch):
    monkeypatch.setattr(slurmcheck, "_squeue", lambda: "5 PENDING (Resources)")
    why = slurmcheck.await_workers(
        lambda: 0, _queue({"5"}), 1, timeout_s=0, log_directory=tmp_path, poll_s=0
    )
    assert why.startswith("0 of 1 workers joined within 0 s") and "5 PENDING (Resources)" in why


def test_no_job_in_the_queue_within_the_grace_time_stops_the_wait(tmp_path):
    why = slurmcheck.await_workers(
        lambda: 0, _queue(set()), 1, timeout_s=600, log_directory=tmp_path, poll_s=0, grace_s=0
    )
    assert "no job of theirs was in Slurm's queue" in why


def test_a_scheduler_interface_goes_to_the_scheduler_not_into_the_job_script(tmp_path):
    options = slurmcheck.cluster_options(
        None, None, "00:10:00", "4GB", gpu=False, log_directory=tmp_path, scheduler_interface="ib0"
    )
    assert options["scheduler_options"] == {"interface": "ib0"}
    assert "ib0" not in slurmcheck.job_script(options)
