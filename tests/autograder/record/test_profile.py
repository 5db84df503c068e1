"""Where the cores' time went in a run: a work folder of status files whose times are known."""

import json

import pytest

from autograder.prepare.status import Status
from autograder.record.profile import profile
from autograder.record.state import WorkState, write_state

T0 = 1_800_000_000.0  # the run's start, seconds since the epoch


def _job(workdir, student, at: tuple, start_s: float, cpu_s: float, warm: bool = False):
    """A job's status: its runner began, its first cell began and it ended ``at`` seconds
    after T0."""
    folder = workdir / "jobs" / student / "00_environment" / "00_environment"
    folder.mkdir(parents=True)
    began, cells, ended = (T0 + t for t in at)
    Status(
        seconds=ended - cells,
        start_s=start_s,
        warm=warm,
        began_at=began,
        cells_at=cells,
        ended_at=ended,
        cpu_s=cpu_s,
        start_cpu_s=0.2,
        runner_cpu_s=0.5,
    ).write(folder / "status.json")


def test_the_profile_splits_the_cores_time_into_the_jobs_shares_and_idle_by_when(tmp_path):
    _job(tmp_path, "ada", (1, 2, 6), start_s=1.0, cpu_s=3.5)  # holds a core 1..6
    _job(tmp_path, "grace", (0.2, 1, 9), start_s=0.8, cpu_s=7.0, warm=True)  # 1..9: started ahead
    _job(tmp_path, "(canary)", (6.5, 7, 8), start_s=0.5, cpu_s=0.4)  # 6.5..8
    old = tmp_path / "jobs" / "linus" / "status.json"  # an earlier run's: not this run's
    old.parent.mkdir(parents=True)
    Status(began_at=T0 - 50, cells_at=T0 - 49, ended_at=T0 - 40, cpu_s=9).write(old)
    state = WorkState(course="x", intake=None)
    state.last_run = {"jobs": 3, "grader_s": 0.7, "references": []}
    write_state(tmp_path, state)

    found = profile(tmp_path, T0, T0 + 10, cores=2, run_cpu_s=16.0)

    assert (found.jobs, found.capacity_s) == (3, 20.0)
    assert found.notebooks_s == pytest.approx(10.5) and found.canary_s == pytest.approx(0.4)
    assert found.starts_s == pytest.approx(1.5), "the kernel started ahead is off the job's time"
    assert found.waiting_s == pytest.approx(14.5 - 10.9 - 1.5)
    # 0..1 no job: 2 cores; 6..6.5 one job, the canary still to begin; 8..9 one, 9..10 none
    assert found.idle_first_s == pytest.approx(2.0)
    assert found.idle_between_s == pytest.approx(0.5)
    assert found.idle_tail_s == pytest.approx(1.0 + 2.0)
    assert found.grader_s == pytest.approx(0.7)
    assert found.runners_s == pytest.approx(1.5)
    text = "\n".join(found.lines())
    assert "2 cores x 10.0 s = 20.0 core-seconds, 3 jobs" in text
    # 20 - 2 - 0.5 - 3 core-seconds held by a job
    assert "held by a job (computing, starting its kernel, or waiting): 14.5 s (72%)" in text, text
    # by whom: kernels 10.9 s, their starts 0.6, runners 1.5, the rest 16 - 13; 20 - 16 none
    assert "kernel starts, the guard's installation included: 0.6 s" in text
    assert "the rest: the grader (nbgrader's release, autograde, feedback): 3.0 s" in text
    assert "no process computing: 4.0 s (20%)" in text
    assert "in all, beyond the notebooks' and the canary's own: 9.1 s (46%)" in text  # 20 - 10.9


def test_without_the_runs_processor_time_the_profile_leaves_out_what_it_cannot_split(tmp_path):
    _job(tmp_path, "ada", (1, 2, 6), start_s=1.0, cpu_s=3.5)
    text = "\n".join(profile(tmp_path, T0, T0 + 10, cores=2).lines())
    assert "runners (nbclient, the limits' watch): 0.5 s" in text
    assert "the rest" not in text and "no process computing" not in text


def test_a_status_of_an_older_grader_without_times_leaves_its_cores_idle(tmp_path):
    folder = tmp_path / "jobs" / "ada" / "00_environment" / "00_environment"
    folder.mkdir(parents=True)
    (folder / "status.json").write_text(json.dumps({"stopped": "", "seconds": 3.0}))
    found = profile(tmp_path, T0, T0 + 4, cores=2)
    assert found.jobs == 0 and found.idle_first_s == pytest.approx(8.0)
