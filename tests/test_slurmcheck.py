"""The Slurm check and docs/cluster.md's Slurm set-up, as far as a machine without Slurm can take them.

dask-jobqueue renders the batch script of a Slurm job without submitting it, so the parameters the docs
and the check pass are checked by dask-jobqueue itself; the grading through real Slurm jobs is run by
hand (docs/cluster.md says where and what it gave).
"""

import os
import re
import sys
from pathlib import Path

import pytest

from autograder import slurmcheck
from autograder.pipeline import ROOT

DOCS = ROOT / "docs" / "cluster.md"


def test_the_job_script_runs_a_worker_of_this_checkouts_python_from_this_checkout(tmp_path):
    options = slurmcheck.cluster_options("normal", "teaching", "00:10:00", "4GB", gpu=False, log_directory=tmp_path)
    script = slurmcheck.job_script(options, scheduler="tcp://10.0.0.1:8786")
    assert "#SBATCH -p normal" in script and "#SBATCH -A teaching" in script and "#SBATCH -t 00:10:00" in script
    assert f"cd {ROOT}" in script
    assert f"{sys.executable} -m distributed.cli.dask_worker tcp://10.0.0.1:8786" in script
    assert "--nthreads 1" in script and "gres" not in script and "GPU=1" not in script


def test_with_gpu_each_job_asks_slurm_for_a_gpu_and_its_worker_offers_the_resource(tmp_path):
    options = slurmcheck.cluster_options(None, None, "00:10:00", "4GB", gpu=True, log_directory=tmp_path)
    script = slurmcheck.job_script(options)
    assert "#SBATCH --gres=gpu:1" in script
    assert "--resources GPU=1" in script
    assert "#SBATCH -p" not in script  # no --queue: Slurm's default partition


def test_without_sbatch_it_says_so_and_submits_nothing(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch there
    assert slurmcheck.main(["--workdir", str(tmp_path / "work")]) == 2
    assert "sbatch is not on the PATH" in capsys.readouterr().err
    assert not (tmp_path / "work").exists()


def test_print_job_script_prints_the_script_it_would_submit(tmp_path, capsys):
    assert slurmcheck.main(["--print-job-script", "--gpu", "--queue", "gpu", "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("#!/usr/bin/env bash") and "#SBATCH -p gpu" in out and "--gres=gpu:1" in out


class _Rendered(Exception):
    pass


def test_the_docs_slurm_snippets_are_parameters_dask_jobqueue_accepts(monkeypatch):
    """Each SLURMCluster(...) call in docs/cluster.md's Slurm section renders a job script with what it asks for."""
    import time

    import dask_jobqueue
    from dask_jobqueue.slurm import SLURMJob

    text = DOCS.read_text()
    section = text[text.index("## Slurm, with dask-jobqueue"):text.index("## Kubernetes")]
    blocks = re.findall(r"```python\n(.*?)```", section, re.S)
    assert len(blocks) == 2, "the Slurm section's two snippets (CPU and GPU workers)"
    scripts = {}

    class Recorder:
        scheduler_address = "tcp://login:8786"

        def __init__(self, **kwargs):
            kwargs.pop("scheduler_options", None)  # the cluster's own, not the job's
            self.script = SLURMJob(scheduler=self.scheduler_address, name="worker", **kwargs).job_script()
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
    exec(compile("from dask_jobqueue import SLURMCluster\n" + blocks[1], "cluster.md (GPU workers)", "exec"), namespace)
    assert "#SBATCH -p normal" in scripts["normal"] and "--nworkers 16" in scripts["normal"]
    assert "#SBATCH --gres=gpu:1" in scripts["gpu"] and "--resources GPU=1" in scripts["gpu"]
    for script in scripts.values():
        assert "cd /path/to/course" in script and "/path/to/course/.venv/bin/python -m distributed.cli.dask_worker" in script


def test_a_job_script_slurm_refuses_stops_the_check_before_anything_is_submitted(tmp_path, monkeypatch, capsys):
    """sbatch --test-only's refusal (as Slurm 22.05 words it for a partition it lacks) is the message; no job is sent."""
    calls = tmp_path / "calls"
    sbatch = tmp_path / "sbatch"
    sbatch.write_text(f"#!/bin/sh\necho \"$@\" >> {calls}\n"
                      "echo 'sbatch: error: invalid partition specified: nosuch' >&2\n"
                      "echo 'sbatch: error: Batch job submission failed: Invalid partition name specified' >&2\nexit 1\n")
    sbatch.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    assert slurmcheck.main(["--queue", "nosuch", "--workdir", str(tmp_path / "work")]) == 2
    err = capsys.readouterr().err
    assert "sbatch refuses the workers' job script: invalid partition specified: nosuch" in err
    assert all(line.startswith("--test-only ") for line in calls.read_text().splitlines())
