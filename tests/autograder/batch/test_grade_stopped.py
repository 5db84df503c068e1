"""A grading run that is stopped halfway leaves no process behind, says what it graded, and resumes.

Three students hand in 00_environment: ada and zed the solution, slow an answer that starts
a subprocess and then waits for a file ``go.txt`` in its working copy. With one notebook at
a time, ada is graded first; the run is stopped while slow's kernel waits and zed's, started
ahead of its turn (a warm runner), waits for it. Every process of
a run carries the run's marker in its environment (``COURSE_GRADING_RUN``), so what is left
of it can be found in /proc.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import nbformat
import pytest

from devcourse.instructor.demo import SUBMITTED
from autograder.record.state import STATE, read_state
from autograder.run import cgroups
from autograder.run.watch import RUN_MARKER, processes_of

ROOT = Path(__file__).resolve().parents[3]
ASSIGNMENT = "00_environment"

WAITING_ANSWER = """\
import os, subprocess, time
_child = subprocess.Popen(["sleep", "300"])  # a process of the student's own
while not os.path.exists("go.txt"):
    time.sleep(0.2)
"""


# every process of this file's runs seen alive: their runners' cgroups are this file's
SEEN: set[int] = set()


def _graded(workdir: Path) -> dict:
    state = read_state(workdir)
    return state.graded if state is not None else {}


def live_marked(mark: str) -> list[str]:
    """Command lines of the live processes that carry the run's marker."""
    found = processes_of(mark)
    SEEN.update(found)
    return list(found.values())


@pytest.fixture(scope="module")
def submitted(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("stopped") / "submitted"
    source = SUBMITTED / "ada" / ASSIGNMENT
    shutil.copytree(source, folder / "ada" / ASSIGNMENT)
    shutil.copytree(source, folder / "zed" / ASSIGNMENT)
    nb = nbformat.read(source / f"{ASSIGNMENT}.ipynb", as_version=4)
    cell = next(
        c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "list_devices"
    )
    cell.source = WAITING_ANSWER + cell.source
    (folder / "slow" / ASSIGNMENT).mkdir(parents=True)
    nbformat.write(nb, folder / "slow" / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
    return folder


@pytest.fixture(scope="module")
def temporary() -> Path:
    """The runs' temporary folder (``TMPDIR``), where each makes its folder of sockets: this file's
    runs only.

    Outside pytest's own folders, which only this user may enter: the sandboxed kernels reach their
    sockets there."""
    folder = Path(tempfile.mkdtemp(prefix="stopped-runs-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def start(submitted: Path, workdir: Path, mark: str, temporary: Path) -> subprocess.Popen:
    command = [
        sys.executable,
        "-m",
        "autograder",
        "grade",
        "--submitted",
        str(submitted),
        "--workdir",
        str(workdir),
        "--jobs",
        "1",
        "--no-feedback",
        "--quiet",
        "--cell-timeout",
        "120",
    ]
    # A session of its own, as a terminal's foreground job: Ctrl-C is SIGINT to the whole process
    # group.
    return subprocess.Popen(
        command,
        cwd=ROOT,
        env={**os.environ, RUN_MARKER: mark, "TMPDIR": str(temporary)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def wait_until_slow_waits(run: subprocess.Popen, mark: str) -> None:
    deadline = time.monotonic() + 120
    while not any(line == "sleep 300" for line in live_marked(mark)):
        assert run.poll() is None, f"the run ended early:\n{run.communicate(timeout=30)}"
        assert time.monotonic() < deadline, f"slow's kernel never started: {live_marked(mark)}"
        time.sleep(0.2)


def gone_within(mark: str, seconds: float) -> list[str]:
    deadline = time.monotonic() + seconds
    while (left := live_marked(mark)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.mark.parametrize(
    "signum", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name
)
def test_a_stopped_run_leaves_no_process_and_then_resumes(submitted, temporary, tmp_path, signum):
    workdir, mark = tmp_path / "work", f"stopped-{signum.name}-{os.getpid()}"
    run = start(submitted, workdir, mark, temporary)
    try:
        wait_until_slow_waits(run, mark)
        assert any("/zed/" in line and line.endswith("--warm") for line in live_marked(mark)), (
            live_marked(mark)
        )
        ada_log = workdir / "jobs" / "ada" / ASSIGNMENT / ASSIGNMENT / "runner.log"
        assert ada_log.is_file(), "ada is graded first"
        # once the grader has noted ada as graded (slow's kernel, started ahead, may
        if signum == signal.SIGKILL:
            # reach its sleep while nbgrader still grades her)
            deadline = time.monotonic() + 60
            while f"ada/{ASSIGNMENT}" not in _graded(workdir):
                assert time.monotonic() < deadline, "ada was never noted as graded"
                time.sleep(0.1)
        if signum == signal.SIGINT:  # Ctrl-C: the grader and the runners it started
            os.killpg(run.pid, signum)
        else:
            run.send_signal(signum)
        if signum != signal.SIGKILL:
            out, err = run.communicate(timeout=5)  # stops within 5 s
            assert run.returncode == 128 + signum, (run.returncode, err)
            assert err.splitlines()[0].startswith(f"grading was stopped by {signum.name}"), err
            assert (
                f"Graded (in the gradebook): ada/{ASSIGNMENT}" in err
                and f"Not graded: slow/{ASSIGNMENT}" in err
            ), err
            assert f"zed/{ASSIGNMENT}" in err.split("Not graded:")[1], err
            assert not (workdir / "jobs" / "slow").exists(), (
                "the unfinished job's folder is removed"
            )
            assert not (workdir / "jobs" / "zed").exists(), "the job not begun keeps no folder"
        left = gone_within(mark, 5)
        assert left == [], f"still running after {signum.name} to the grader: {left}"
        # killed outright: ada's line in state.json's journal says she is graded
        if signum == signal.SIGKILL:
            assert f"ada/{ASSIGNMENT}" not in json.loads((workdir / STATE).read_text())["graded"]
            assert f"ada/{ASSIGNMENT}" in read_state(workdir).graded
    finally:
        if run.poll() is None:
            run.kill()
        run.communicate(timeout=30)  # what the run left holding its output must not hang the test
    if signum != signal.SIGINT:
        return
    # Again, with go.txt beside slow's notebook: only slow and zed are graded, once; ada keeps her
    # score.
    ada_runs = ada_log.stat().st_mtime_ns
    (submitted / "slow" / ASSIGNMENT / "go.txt").write_text("go")
    try:
        again = start(submitted, workdir, mark, temporary)
        out, err = again.communicate(timeout=300)
    finally:
        (submitted / "slow" / ASSIGNMENT / "go.txt").unlink()
    assert again.returncode == 0, err
    assert ada_log.stat().st_mtime_ns == ada_runs, "ada was graded a second time"
    rows = {
        row["student"]: row
        for row in csv.DictReader((workdir / "scores.csv").open())
        if row["assignment"] == ASSIGNMENT
    }
    # 2 to grade by hand
    assert float(rows["ada"]["score"]) == float(rows["ada"]["max_score"]) - 2, rows["ada"]
    assert "earlier run" in rows["ada"]["note"], rows["ada"]
    assert rows["slow"]["score"] not in ("", None), rows["slow"]
    assert float(rows["zed"]["score"]) == float(rows["zed"]["max_score"]) - 2, rows["zed"]
    assert live_marked(mark) == []
    # Runners killed outright (the SIGKILL and SIGTERM cases) left their sandboxes' cgroups: a run
    # sweeps them.
    assert stale_cgroups() == [], "a cgroup of a runner that is gone is still there"
    # So is the folder of sockets of the grader killed outright (the SIGKILL case); the others
    # removed their own.
    assert list(temporary.glob("grade-*")) == [], "a folder of a run that is gone is still there"


def stale_cgroups() -> list[str]:
    """The cgroups of this file's sandboxes whose runner is gone.

    Only this file's runners: a test running beside it (``make test`` runs two files at once) may
    kill workers whose runners' cgroups wait for that test's own run to sweep them.
    """
    found = cgroups.find()
    runners = {str(pid) for pid in SEEN}
    return [
        str(folder)
        for parent in set(found.parents.values())
        for folder in Path(parent).glob(cgroups.PREFIX + "*")
        if (runner := folder.name[len(cgroups.PREFIX) :].split("-")[0]) in runners
        and not Path(f"/proc/{runner}").exists()
    ]


def _ctrl_c_in_autograde(tmp_path, monkeypatch, **settings):
    """ada and zed hand in the solution; a Ctrl-C comes as nbgrader's autograde of the first begins.
    The grader is called as a library (gpu-check and slurm-check do, without grade.main's handlers).
    Returns the stop."""
    from nbgrader.converters import Autograde

    from autograder.batch import GradingStopped, grade
    from autograder.settings import Settings

    original = Autograde.start

    def start_after_a_ctrl_c(app):
        os.kill(os.getpid(), signal.SIGINT)
        return original(app)

    monkeypatch.setattr(Autograde, "start", start_after_a_ctrl_c)
    for student in ("ada", "zed"):
        shutil.copytree(
            SUBMITTED / "ada" / ASSIGNMENT, tmp_path / "submitted" / student / ASSIGNMENT
        )
    with pytest.raises(GradingStopped) as stopped:
        grade(
            tmp_path / "submitted",
            tmp_path / "work",
            Settings(jobs=1, progress=False, warm=False, assignments=(ASSIGNMENT,), **settings),
        )
    return stopped.value


def test_a_ctrl_c_during_nbgraders_autograde_waits_for_it_then_stops_the_run(tmp_path, monkeypatch):
    """nbgrader's apps catch every exception, KeyboardInterrupt too (a bare ``except`` in
    ``nbgrader.utils.capture_log``): a Ctrl-C landing inside its autograde was recorded as ada's
    error ("not graded: KeyboardInterrupt"), and the run went on to zed. Seen on a GPU machine,
    where a time limit's SIGINT reached the grader during autograde. Now the signal waits for
    nbgrader's return: ada is graded, and the run stops before zed."""
    # Python's own, or what an earlier test of this process left
    before = signal.getsignal(signal.SIGINT)
    stopped = _ctrl_c_in_autograde(tmp_path, monkeypatch, feedback=False)
    assert stopped.signum == signal.SIGINT
    assert stopped.graded == [("ada", ASSIGNMENT)], "ada's autograde ran to its end"
    assert stopped.not_graded == [("zed", ASSIGNMENT)]
    assert signal.getsignal(signal.SIGINT) is before, "the handlers are given back"


def test_a_ctrl_c_waits_for_the_pages_being_made_apart_of_what_nbgrader_graded(
    tmp_path, monkeypatch
):
    """The pages made by a process of their own (a cluster's grader): ada's autograde ends and her
    page is handed on when the Ctrl-C comes. The run waits for the page, as it waits for nbgrader:
    ada is graded, with her page, and the run stops before zed."""
    import json

    stopped = _ctrl_c_in_autograde(tmp_path, monkeypatch, feedback_apart=True)
    assert stopped.graded == [("ada", ASSIGNMENT)], "ada's page was made before the run stopped"
    assert stopped.not_graded == [("zed", ASSIGNMENT)]
    assert (tmp_path / "work" / "feedback" / "ada" / ASSIGNMENT / f"{ASSIGNMENT}.html").is_file()
    assert list(json.loads((tmp_path / "work" / "state.json").read_text())["graded"]) == [
        f"ada/{ASSIGNMENT}"
    ]
