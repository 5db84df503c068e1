"""The grader on a real Dask cluster: a scheduler and two workers, each its own process on this
machine.

One cluster for the module. The demo class's 00_environment is graded through
it while a worker is killed (SIGKILL) in the middle of a student's job: its
job runs again on the other worker, every submission is graded once, with the
scores ``make grade`` gives on this machine's cores (``expected_scores.csv``,
which ``tests/autograder/batch/test_grade.py`` checks against the local pool), into a gradebook
on a real PostgreSQL server, as docs/cluster.md tells a cluster's grader to
keep it. Then what a cluster cannot grade with: a worker whose Python lacks
the course (the only one that offers the GPU resource, with ``--gpu-jobs``),
jobs that no worker can take, a run stopped (Ctrl-C) while a worker runs a
student's job, which the worker ends, workers that keep dying in one job
(Dask's KilledWorker), and a scheduler that does not answer.
"""

from __future__ import annotations

import contextlib
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from support.gradebooks import gradebook_dump
from support.lab import stop_lab
from support.servers import free_port

from autograder.cli import grade
from devcourse.instructor import demo
from devcourse.instructor.paths import DEMO_CLASS, ROOT
from autograder.run.executors import ClusterError, DaskExecutor, dask
from autograder.run.executors.cluster import (
    check_scheduler,
    start_process,
    start_scheduler,
    wait_for_workers,
)
from autograder.settings import Settings

ASSIGNMENT = "00_environment"
# Every demo student who submitted it: the honest ones, the cheats (eve looks for the hidden tests
# and the gradebook on disk, forger answers nothing and forges the rest, mallory's score is withheld
# for review) and oscar, whose notebook an interrupted upload cut in half.
STUDENTS = ["ada", "eve", "forger", "grace", "linus", "mallory", "margaret", "oscar"]


WORKERS_TMP: list[Path] = []  # the workers' temporary folder (TMPDIR), made by the cluster fixture


def _start(
    command: list[str], log: Path, env: dict | None = None, cwd: Path = ROOT
) -> subprocess.Popen:
    """A process of the cluster, ended (SIGTERM) with this test process however it ends; a worker's
    job folders go to the module's own temporary folder."""
    return start_process(command, log, env or {**os.environ, "TMPDIR": str(WORKERS_TMP[-1])}, cwd)


def _worker(address: str, name: str, log: Path, env: dict | None = None) -> subprocess.Popen:
    return _start(
        [sys.executable, "-m", "autograder", "worker", address, "--name", name, "--no-nanny"],
        log,
        env,
    )


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A scheduler and workers w1 and w2 (no nannies: a killed worker stays dead); yields (address,
    processes)."""
    from distributed import Client

    logs = tmp_path_factory.mktemp("cluster")
    WORKERS_TMP.append(logs / "tmp")
    WORKERS_TMP[-1].mkdir()
    # Dask gives a job up (KilledWorker) once workers died in it more than allowed-failures times: 1
    # here, so that one death moves a job and a second one ends it.
    scheduler, address = start_scheduler(
        logs / "scheduler.log",
        env={**os.environ, "DASK_DISTRIBUTED__SCHEDULER__ALLOWED_FAILURES": "1"},
    )
    processes = {"scheduler": scheduler}
    try:
        for name in ("w1", "w2"):
            processes[name] = _worker(address, name, logs / f"{name}.log")
        with Client(address, timeout=30, set_as_default=False) as client:
            wait_for_workers(client, {"w1", "w2"})
        yield address, processes, logs
    finally:
        for process in processes.values():
            stop_lab(process)


@pytest.fixture(scope="module")
def gradebook(server):
    """The URL of an empty gradebook database on the module's PostgreSQL server."""
    return server["url"]


def _expected() -> dict[str, str]:
    with demo.EXPECTED_SCORES.open() as handle:
        return {
            r["student"]: r["score"]
            for r in csv.DictReader(handle)
            if r["assignment"] == ASSIGNMENT
        }


def _kill_a_worker_in_a_students_job(
    address: str, processes: dict, killed: dict, stop: threading.Event
) -> None:
    """Watch the scheduler; SIGKILL the first worker seen running a student's job (not the
    canary's)."""
    from distributed import Client

    with Client(address, timeout=30, set_as_default=False) as client:
        names = {addr: w["name"] for addr, w in client.scheduler_info()["workers"].items()}
        while not stop.is_set():
            for worker, keys in client.processing().items():
                students = [k for k in keys if any(f"-{s}-" in k for s in STUDENTS)]
                if students and names.get(worker) in processes:
                    # Inside the job: a 00 job runs about 3 s on an idle machine (the kernel's start
                    # 1.8 s of it), so a kill 3 s in could come after it had finished.
                    time.sleep(1)
                    processes[names[worker]].kill()
                    killed.update(worker=names[worker], key=students[0])
                    return
            time.sleep(0.2)


@pytest.fixture(scope="module")
def graded(cluster, gradebook, tmp_path_factory):
    """The demo class's 00_environment graded on the cluster while a worker is killed mid-job, into
    the PostgreSQL gradebook, with each student's feedback: (work folder, exit code, killed)."""
    address, processes, logs = cluster
    tmp = tmp_path_factory.mktemp("graded")
    for student in STUDENTS:
        shutil.copytree(DEMO_CLASS / student / ASSIGNMENT, tmp / "submitted" / student / ASSIGNMENT)
    killed: dict = {}
    stop = threading.Event()
    watcher = threading.Thread(
        target=_kill_a_worker_in_a_students_job, args=(address, processes, killed, stop)
    )
    watcher.start()
    try:
        code = grade.main(
            [
                "--submitted",
                str(tmp / "submitted"),
                "--workdir",
                str(tmp / "work"),
                "--scheduler",
                address,
                "--db-url",
                gradebook,
                "--quiet",
            ]
        )
    finally:
        stop.set()
        watcher.join()
    if killed:
        processes[killed["worker"]] = _worker(
            address, killed["worker"], logs / f"{killed['worker']}-again.log"
        )
    return tmp, code, killed


@pytest.mark.timeout(600)
def test_a_class_graded_on_the_cluster_survives_a_killed_worker_with_the_local_pools_scores(
    cluster, gradebook, graded
):
    tmp, code, killed = graded
    work = tmp / "work"
    assert code == 0
    assert killed, "no worker was killed while it ran a student's job"
    with (work / "scores.csv").open() as handle:
        rows = [r for r in csv.DictReader(handle) if r["assignment"] == ASSIGNMENT]
    assert sorted(r["student"] for r in rows) == sorted(STUDENTS), (
        "a submission is missing or counted twice"
    )
    expected = _expected()
    assert {r["student"]: r["score"] for r in rows} == {s: expected[s] for s in STUDENTS}
    tables = gradebook_dump(gradebook)
    graded_ones = [s for s in STUDENTS if expected[s]]  # not oscar's, which was never graded
    assert len(tables["submitted_assignment"]) == len(graded_ones) < len(STUDENTS)
    # one grade per graded cell of each submission: the job that ran twice wrote its grades once
    grade_cells = len(tables["grade_cells"])
    assert grade_cells and len(tables["grade"]) == grade_cells * len(graded_ones)
    assert not (work / "gradebook.db").exists()
    student = next(s for s in STUDENTS if f"-{s}-" in killed["key"])
    ran_on = (
        (work / "jobs" / student / ASSIGNMENT / ASSIGNMENT / "ran_on.txt").read_text().split()[0]
    )
    assert ran_on != killed["worker"] and ran_on in cluster[1], (
        f"{student}'s job ran last on {ran_on}"
    )
    # Every job's temporary folder is gone from the workers' machine: the killed worker's too, which
    # it could not remove itself; the next job there removed it (autograder.run.dask.sweep_orphans).
    assert not list(WORKERS_TMP[-1].glob("grade-job-*"))
    # The grader's machine runs no job: a process of its own made the feedback pages (from
    # PostgreSQL) meanwhile.
    state = json.loads((work / "state.json").read_text())
    assert state["last_run"]["feedback_apart_s"] > 0
    assert sorted(
        p.parent.parent.name for p in (work / "feedback").glob(f"*/{ASSIGNMENT}/{ASSIGNMENT}.html")
    ) == sorted(graded_ones)


def test_a_sweep_removes_the_job_folders_of_ended_workers_only(tmp_path):
    """A worker's id and start time in its folder: gone or a zombie, its folder goes; alive, of
    another pid namespace, or unknown, it stays."""
    ended, zombie = subprocess.Popen(["sleep", "30"]), subprocess.Popen(["sleep", "30"])
    owners = {
        "ended": dask._identity(ended.pid),
        "zombie": dask._identity(zombie.pid),
        "alive": dask._identity(os.getpid()),
    }
    owners["elsewhere"] = owners["ended"].rsplit(" ", 1)[0] + " pid:[1]"
    ended.kill()
    ended.wait()
    zombie.kill()
    time.sleep(0.5)  # not waited for: a zombie until then
    assert dask._identity(zombie.pid) is None and dask._identity(ended.pid) is None
    for name, owner in [*owners.items(), ("unknown", None)]:
        (tmp_path / f"grade-job-{name}").mkdir()
        if owner is not None:
            (tmp_path / f"grade-job-{name}" / "owner").write_text(owner)
    (tmp_path / "other").mkdir()
    removed = dask.sweep_orphans(tmp_path)
    zombie.wait()
    assert sorted(p.name for p in removed) == ["grade-job-ended", "grade-job-zombie"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "grade-job-alive",
        "grade-job-elsewhere",
        "grade-job-unknown",
        "other",
    ]


NO_COURSE = '''\
"""Dask preload: this worker's Python lacks the course, as a machine it was never installed on."""
import importlib.abc
import sys


class NoCourse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("autograder", "devcourse"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


sys.meta_path.insert(0, NoCourse())
'''


def test_a_worker_without_the_course_stops_grading_with_the_reason(
    cluster, gradebook, graded, tmp_path, capsys
):
    """GPU jobs (``--gpu-jobs``) go only to workers offering GPU=1, and the one here cannot import
    the course.

    A new run: the canary's job fails there, and grading stops (exit 2) with the reason, nothing
    graded. Then ada's regrade in the graded class's folder: a worker with the course and GPU=1 runs
    the canary and is killed in ada's job, which goes to the worker without the course; grading
    stops at it, and the gradebook keeps ada's earlier grade.
    """
    from distributed import Client

    address, _, logs = cluster
    preload = tmp_path / "no_course.py"
    preload.write_text(NO_COURSE)

    def bare() -> subprocess.Popen:
        return _start(
            [
                sys.executable,
                "-m",
                "distributed.cli.dask_worker",
                address,
                "--nthreads",
                "1",
                "--no-nanny",
                "--no-dashboard",
                "--name",
                "bare",
                "--resources",
                "GPU=1",
                "--preload",
                str(preload),
            ],
            logs / "bare.log",
            cwd=tmp_path,
        )

    shutil.copytree(DEMO_CLASS / "ada" / ASSIGNMENT, tmp_path / "submitted" / "ada" / ASSIGNMENT)
    earlier = graded[0] / "work"
    before = gradebook_dump(gradebook)
    started: dict[str, subprocess.Popen] = {"bare": bare()}
    try:
        with Client(address, timeout=30, set_as_default=False) as client:
            wait_for_workers(client, {"bare"})
            begun = time.monotonic()
            new = grade.main(
                [
                    "--submitted",
                    str(tmp_path / "submitted"),
                    "--workdir",
                    str(tmp_path / "work"),
                    "--scheduler",
                    address,
                    "--gpu-jobs",
                    "--quiet",
                    "--no-feedback",
                ]
            )
            took = time.monotonic() - begun
            first = capsys.readouterr().err
            stop_lab(started.pop("bare"))
            started["g"] = _start(
                [
                    sys.executable,
                    "-m",
                    "autograder",
                    "worker",
                    address,
                    "--gpu",
                    "0",
                    "--name",
                    "g",
                    "--no-nanny",
                ],
                logs / "g.log",
            )
            wait_for_workers(client, {"g"})
        killed: dict = {}
        stop = threading.Event()

        def kill_g_then_start_bare() -> None:
            _kill_a_worker_in_a_students_job(address, started, killed, stop)
            if killed:
                started["bare"] = bare()
                # The thread that starts a tethered process is its parent for PR_SET_PDEATHSIG: bare
                # would get its SIGTERM as soon as this thread ended, so the thread lives until the
                # regrade is over.
                stop.wait()

        watcher = threading.Thread(target=kill_g_then_start_bare)
        watcher.start()
        try:
            regraded = grade.main(
                [
                    "--submitted",
                    str(graded[0] / "submitted"),
                    "--workdir",
                    str(earlier),
                    "--scheduler",
                    address,
                    "--gpu-jobs",
                    "--student",
                    "ada",
                    "--regrade",
                    "--quiet",
                    "--no-feedback",
                    "--db-url",
                    gradebook,
                ]
            )
        finally:
            stop.set()
            watcher.join()
        second = capsys.readouterr().err
    finally:
        for process in started.values():
            stop_lab(process)
    assert new == 2, first
    assert "could not run job" in first and "(canary)" in first, first
    assert (
        "ModuleNotFoundError: No module named 'autograder" in first
        and "course installed on every worker" in first
    )
    assert took < 60
    assert (
        not (tmp_path / "work" / "scores.csv").exists()
        and not (tmp_path / "work" / "executed").exists()
    )
    assert killed.get("worker") == "g", "the worker with the course was not killed in ada's job"
    assert regraded == 2, second
    assert second.startswith("grading stopped: the Dask cluster") and "-ada-" in second, second
    assert "ModuleNotFoundError" in second and f"Not graded: ada/{ASSIGNMENT}" in second, second
    assert gradebook_dump(gradebook) == before, "the stopped regrade changed the gradebook"


def test_a_worker_that_cannot_build_the_sandbox_stops_grading_with_the_reason(
    cluster, tmp_path, capsys
):
    """The only GPU=1 worker has no ``mount`` on its PATH (an image without util-linux): no job runs
    unsandboxed."""
    from distributed import Client

    address, _, logs = cluster
    (tmp_path / "empty").mkdir()
    worker = _start(
        [
            sys.executable,
            "-m",
            "autograder",
            "worker",
            address,
            "--gpu",
            "0",
            "--name",
            "nomount",
            "--no-nanny",
        ],
        logs / "nomount.log",
        env={**os.environ, "PATH": str(tmp_path / "empty")},
    )
    shutil.copytree(DEMO_CLASS / "ada" / ASSIGNMENT, tmp_path / "submitted" / "ada" / ASSIGNMENT)
    try:
        with Client(address, timeout=30, set_as_default=False) as client:
            wait_for_workers(client, {"nomount"})
        code = grade.main(
            [
                "--submitted",
                str(tmp_path / "submitted"),
                "--workdir",
                str(tmp_path / "work"),
                "--scheduler",
                address,
                "--gpu-jobs",
                "--quiet",
                "--no-feedback",
            ]
        )
    finally:
        stop_lab(worker)
    err = capsys.readouterr().err
    assert code == 2, err
    assert (
        "worker nomount" in err
        and "cannot build the grading sandbox: util-linux's mount is not installed" in err
    ), err
    assert not (tmp_path / "work" / "scores.csv").exists()


def test_jobs_no_worker_can_take_fail_with_the_reason_once_none_came(cluster, tmp_path):
    """No worker offers GPU=1 (w1 and w2 do not): a GPU job fails after the executor's wait, not
    never."""
    address = cluster[0]
    (tmp_path / "job").mkdir()
    (tmp_path / "job" / "job.json").write_text("{}")
    executor = DaskExecutor(Settings(progress=False), address, gpu=True, workerless_s=2)
    try:
        started = time.monotonic()
        future = executor.submit(tmp_path / "job" / "job.json")
        with pytest.raises(
            ClusterError, match="no Dask worker with the resource GPU=1 .* for 2 s while 1 job"
        ):
            future.result(timeout=30)
        assert time.monotonic() - started < 10
    finally:
        executor.close()


def test_the_cluster_is_reached_from_a_thread_whose_event_loop_runs(cluster):
    """As from a Jupyter cell, whose thread runs an asyncio loop: the check and the client still
    work."""
    import asyncio

    async def from_a_notebook_cell() -> int:
        check_scheduler(cluster[0])
        executor = DaskExecutor(Settings(progress=False), cluster[0])
        try:
            return len(executor._able_workers())
        finally:
            executor.close()

    # in a thread of its own: this test's thread may hold a loop an earlier test left running
    found = []
    cell = threading.Thread(target=lambda: found.append(asyncio.run(from_a_notebook_cell())))
    cell.start()
    cell.join(timeout=60)
    assert found and found[0] >= 1


WAITING_ANSWER = """\
import os, subprocess, time
# a process of the student's own, found by its command line
_child = subprocess.Popen(["sleep", "317"])
while not os.path.exists("go.txt"):
    time.sleep(0.2)
"""


def _sleepers() -> list[int]:
    """The processes ``sleep 317`` on this machine (the cluster's workers run here)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and (entry / "cmdline").read_bytes() == b"sleep\x00317\x00":
                found.append(int(entry.name))
        except OSError:  # gone meanwhile
            pass
    return found


def _slow_submission(submitted: Path) -> None:
    """slow's 00: ada's answers, the first of them starting ``sleep 317`` and then waiting
    forever."""
    import nbformat

    nb = nbformat.read(DEMO_CLASS / "ada" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", as_version=4)
    cell = next(
        c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "list_devices"
    )
    cell.source = WAITING_ANSWER + cell.source
    (submitted / "slow" / ASSIGNMENT).mkdir(parents=True)
    nbformat.write(nb, submitted / "slow" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")


def test_a_stopped_run_ends_the_job_a_worker_is_running(cluster, tmp_path):
    """Ctrl-C to the grader while a worker runs a student's job: the job's kernel and what it
    started end too."""
    address, _, _ = cluster
    _slow_submission(tmp_path / "submitted")
    command = [
        sys.executable,
        "-m",
        "autograder",
        "grade",
        "--submitted",
        str(tmp_path / "submitted"),
        "--workdir",
        str(tmp_path / "work"),
        "--scheduler",
        address,
        "--no-feedback",
        "--quiet",
        "--cell-timeout",
        "120",
    ]
    # A job of another run whose worker was killed lives on to its own limits
    # (test_workers_that_keep_dying..., of a test run moments ago): only this run's sleeper counts.
    before = set(_sleepers())
    run = subprocess.Popen(
        command,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # its own process group, as a terminal's foreground job
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not set(_sleepers()) - before:
            assert run.poll() is None, f"the run ended early:\n{run.communicate(timeout=30)}"
            assert time.monotonic() < deadline, "slow's kernel never started on a worker"
            time.sleep(0.2)
        os.killpg(run.pid, signal.SIGINT)  # Ctrl-C: the grader's group; the workers are not in it
        _, err = run.communicate(timeout=30)
        assert run.returncode == 128 + signal.SIGINT, err
        assert f"Not graded: slow/{ASSIGNMENT}" in err, err
        deadline = time.monotonic() + 15
        while set(_sleepers()) - before and time.monotonic() < deadline:
            time.sleep(0.2)
        assert set(_sleepers()) - before == set(), (
            "the student's process on the worker outlived the stopped run"
        )
    finally:
        if run.poll() is None:
            run.kill()
            run.communicate(timeout=30)
        for pid in set(_sleepers()) - before:  # whatever a failed check left behind
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)


def test_workers_that_keep_dying_in_a_job_stop_grading_with_the_reason(cluster, tmp_path):
    """Two GPU=1 workers, each killed in the same student's job: Dask gives it up (KilledWorker) and
    the run stops."""
    from distributed import Client

    address, _, logs = cluster
    _slow_submission(tmp_path / "submitted")
    workers = {
        name: _start(
            [
                sys.executable,
                "-m",
                "autograder",
                "worker",
                address,
                "--gpu",
                "0",
                "--name",
                name,
                "--no-nanny",
            ],
            logs / f"{name}.log",
        )
        for name in ("d1", "d2")
    }
    command = [
        sys.executable,
        "-m",
        "autograder",
        "grade",
        "--submitted",
        str(tmp_path / "submitted"),
        "--workdir",
        str(tmp_path / "work"),
        "--scheduler",
        address,
        "--gpu-jobs",
        "--no-feedback",
        "--quiet",
        "--cell-timeout",
        "120",
    ]
    run = None
    try:
        with Client(address, timeout=30, set_as_default=False) as client:
            wait_for_workers(client, set(workers))
            run = subprocess.Popen(
                command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
            )
            killed, deadline = [], time.monotonic() + 180
            while len(killed) < 2 and run.poll() is None:  # each worker, once slow's job runs on it
                assert time.monotonic() < deadline, f"killed {killed} only"
                names = {
                    a: w["name"] for a, w in client.scheduler_info(n_workers=-1)["workers"].items()
                }
                for worker, keys in client.processing().items():
                    name = names.get(worker)
                    if (
                        name in workers
                        and name not in killed
                        and any("-slow-" in k for k in keys)
                        and _sleepers()
                    ):
                        workers[name].kill()
                        killed.append(name)
                time.sleep(0.2)
        _, err = run.communicate(timeout=120)
    finally:
        if run is not None and run.poll() is None:
            run.kill()
            run.communicate(timeout=30)
        for worker in workers.values():
            stop_lab(worker)
        for pid in _sleepers():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    assert sorted(killed) == ["d1", "d2"], err
    assert run.returncode == 2, err
    assert err.startswith("grading stopped: the Dask cluster") and "KilledWorker" in err, err
    assert f"Not graded: slow/{ASSIGNMENT}" in err, err
    assert not (tmp_path / "work" / "executed" / "slow").exists()


def test_a_scheduler_that_does_not_answer_is_a_clear_error_within_seconds_and_nothing_is_written(
    tmp_path, capsys
):
    work = tmp_path / "work"
    started = time.monotonic()
    code = grade.main(
        ["--scheduler", f"tcp://127.0.0.1:{free_port()}", "--workdir", str(work), "--quiet"]
    )
    assert code == 2 and time.monotonic() - started < 10
    assert "no Dask scheduler answered at tcp://127.0.0.1:" in capsys.readouterr().err
    assert not work.exists(), "a work folder was written"
