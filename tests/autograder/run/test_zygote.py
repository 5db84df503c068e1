"""Kernels forked from the zygote against kernels started fresh (autograder/run/zygote.py).

One class is graded forked (the default), and one of its students again with ``--no-zygote``: a cell
the students added reports what their kernel sees of itself, and the two ways must agree on all of
it but what the module's docstring says differs; the random generators of two forked kernels must
not. Then the zygote is killed in the middle of a run: the job it took with it runs again, started
fresh, and every submission gets its score.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from devcourse.instructor.demo import SUBMITTED
from devcourse.instructor.profile import DeviceCourse
from autograder.run import watch, zygote
from autograder.run.watch import RUN_MARKER, processes_of, tree_usage

ROOT = Path(__file__).resolve().parents[3]
ASSIGNMENT = "00_environment"
pytestmark = pytest.mark.skipif(zygote.usable() != "", reason=f"no zygote here: {zygote.usable()}")

REPORT = r"""
import json, os, random, re, signal, sys
import multiprocessing, numpy, torch
_work = os.getcwd()
_ipc = os.path.dirname(sys.argv[sys.argv.index("-f") + 1])
def _fd(fd):
    try:
        return re.sub(r":\[\d+\]$", "", os.readlink(f"/proc/self/fd/{fd}"))
    except OSError:
        return "gone"
def _environ_at_start():
    try:
        return sorted(open("/proc/self/environ", "rb").read().decode().split("\0"))
    except OSError as error:  # a kernel that changed its user cannot read it
        return type(error).__name__
_state = {
    "sys.path": sys.path, "sys.argv": sys.argv, "sys.orig_argv": sys.orig_argv,
    "executable": sys.executable,
    "cmdline": [arg for arg in open("/proc/self/cmdline", "rb").read().decode().split("\0") if arg],
    "environ": dict(os.environ), "cwd": _work,
    "environ at start": _environ_at_start(),
    # The same filters; those ipykernel's shell adds as it starts come after torch's in a forked
    # kernel, before them in a fresh one (they match other warnings than torch's and numpy's, so
    # the order changes nothing).
    "warnings": sorted([action, getattr(category, "__name__", ""), str(message), str(module_), line]
                       for action, message, category, module_, line
                       in __import__("warnings").filters),
    "modules": sorted(sys.modules), "ids": [os.getuid(), os.geteuid(), os.getgid(), os.getgroups()],
    "pids": [os.getpid(), os.getppid()],
    "signals": {s.name: re.sub(r" at 0x[0-9a-f]+", "", repr(signal.getsignal(s)))
                for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGPIPE,
                          signal.SIGXFSZ, signal.SIGCHLD, signal.SIGUSR1, signal.SIGQUIT)},
    "dont_write_bytecode": sys.dont_write_bytecode, "flags": repr(sys.flags),
    "grader modules": sorted(m for m in sys.modules if m.split(".")[0] == "autograder"),
    "stdin": [os.path.basename(_fd(0)), os.read(0, 1).decode()],
    # (IPython's history thread opens a journal now and then: not counted)
    "fds": sorted(kind for fd in os.listdir("/proc/self/fd")
                  if (kind := _fd(int(fd))) != "gone" and not kind.endswith("-journal")),
    "main": type(sys.modules["__main__"]).__name__ + " " + sys.modules["__main__"].__name__,
    "torch threads": torch.get_num_threads(), "cuda initialised": torch.cuda.is_initialized(),
}
_random = {"random": random.random(), "numpy": float(numpy.random.rand()),
           "torch": torch.initial_seed(),
           "authkey": multiprocessing.current_process().authkey.hex()}
_said = json.dumps(_state).replace(_work, "WORK").replace(os.path.dirname(_work), "JOB")
print("STATE " + _said.replace(_ipc, "IPC"))
print("RANDOM " + json.dumps(_random))
"""


@pytest.fixture(scope="module")
def submitted(tmp_path_factory) -> Path:
    """Two students who hand in the solution of 00 and a cell of their own that reports on their
    kernel."""
    folder = tmp_path_factory.mktemp("zygote") / "submitted"
    source = SUBMITTED / "ada" / ASSIGNMENT
    nb = nbformat.read(source / f"{ASSIGNMENT}.ipynb", as_version=4)
    nb.cells.append(nbformat.v4.new_code_cell(REPORT))
    for student in ("ann", "bob"):
        (folder / student / ASSIGNMENT).mkdir(parents=True)
        nbformat.write(nb, folder / student / ASSIGNMENT / f"{ASSIGNMENT}.ipynb")
    return folder


def grade(
    submitted: Path, workdir: Path, *flags: str, mark: str = "zygote-test"
) -> subprocess.Popen:
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
        *flags,
    ]
    # OMP_NUM_THREADS as an HPC module might set it: a grading kernel runs one thread whatever the
    # grader has
    return subprocess.Popen(
        command,
        cwd=ROOT,
        env={**os.environ, RUN_MARKER: mark, "OMP_NUM_THREADS": "2"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_as_in_the_background,
    )


def _as_in_the_background() -> None:
    """Signals as a grader started with ``nohup ... &`` from a script has them: hang-up and quit
    ignored.

    A process started fresh inherits an ignored signal, so a forked kernel must too.
    """
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.signal(signal.SIGQUIT, signal.SIG_IGN)


def reports(workdir: Path, student: str) -> tuple[dict, dict]:
    nb = nbformat.read(
        workdir / "executed" / student / ASSIGNMENT / f"{ASSIGNMENT}.ipynb", as_version=4
    )
    text = "".join(o.get("text", "") for o in nb.cells[-1].outputs if o.output_type == "stream")
    found = dict(re.findall(r"^(STATE|RANDOM) (.*)$", text, re.M))
    assert set(found) == {"STATE", "RANDOM"}, nb.cells[-1].outputs
    return json.loads(found["STATE"]), json.loads(found["RANDOM"])


def scores(workdir: Path) -> dict:
    lines = (workdir / "scores.csv").read_text().splitlines()
    header = lines[0].split(",")
    return {tuple(row.split(",")[:2]): row.split(",")[header.index("score")] for row in lines[1:]}


@pytest.fixture(scope="module")
def both_ways(submitted, tmp_path_factory):
    base = tmp_path_factory.mktemp("ways")
    done = {}
    for way, flags in (("forked", ()), ("fresh", ("--no-zygote", "--student", "ann"))):
        run = grade(submitted, base / way, *flags)
        out, err = run.communicate(timeout=600)
        assert run.returncode == 0, out + err
        done[way] = base / way
    return done


def test_a_forked_kernel_sees_what_a_fresh_one_sees(both_ways):
    fresh, _ = reports(both_ways["fresh"], "ann")
    for student in ("ann", "bob"):  # the first kernel the zygote forked, and a later one
        forked, _ = reports(both_ways["forked"], student)
        differ = {
            key: (forked.get(key), fresh.get(key))
            for key in set(forked) | set(fresh)
            if forked.get(key) != fresh.get(key)
        }
        assert differ == {}, differ
        assert forked["grader modules"] == [] and forked["cuda initialised"] is False
        # kernel.KERNEL_THREADS, as in the fresh kernel (compared above)
        assert forked["torch threads"] == 1
        assert forked["cmdline"][:3] == [sys.executable, "-m", "ipykernel_launcher"]


def test_forked_kernels_do_not_share_their_random_state(both_ways):
    _, ann = reports(both_ways["forked"], "ann")
    _, bob = reports(both_ways["forked"], "bob")
    assert all(ann[key] != bob[key] for key in ann), (ann, bob)


def test_both_ways_give_the_same_scores(both_ways):
    forked, fresh = scores(both_ways["forked"]), scores(both_ways["fresh"])
    assert (
        forked[("ann", ASSIGNMENT)] == forked[("bob", ASSIGNMENT)] == fresh[("ann", ASSIGNMENT)]
    ), (forked, fresh)
    assert fresh[("ann", ASSIGNMENT)] not in ("", "0", "0.0"), fresh
    log = (
        both_ways["forked"] / "jobs" / "ann" / ASSIGNMENT / ASSIGNMENT / "runner.log"
    ).read_text()
    assert "started fresh" not in log


def test_a_zygote_killed_mid_run_loses_no_submission(submitted, tmp_path):
    """The job its runner was running runs again, started fresh; the run ends with every score."""
    mark = f"zygote-killed-{os.getpid()}"
    run = grade(submitted, tmp_path / "work", mark=mark)
    deadline = time.monotonic() + 120
    while True:
        live = processes_of(mark)
        running = [pid for pid, line in live.items() if "ipykernel_launcher" in line]
        zygote = ["-m", "autograder.run.forkserver", "zygote"]
        zygotes = [pid for pid, line in live.items() if line.split()[1:4] == zygote]
        if running and zygotes:
            break
        assert run.poll() is None and time.monotonic() < deadline, (live, run.communicate())
        time.sleep(0.1)
    os.kill(zygotes[0], signal.SIGKILL)
    out, err = run.communicate(timeout=600)
    assert run.returncode == 0, out + err
    graded = scores(tmp_path / "work")
    assert graded[("ann", ASSIGNMENT)] == graded[("bob", ASSIGNMENT)] not in ("", "0", "0.0"), (
        graded
    )
    logs = [path.read_text() for path in (tmp_path / "work" / "jobs").rglob("runner.log")]
    assert any(log.startswith("this job runs again, in a runner started fresh") for log in logs), (
        logs
    )
    assert processes_of(mark) == {}


def test_the_count_of_a_submissions_memory_leaves_out_the_sandboxs_own_processes(tmp_path):
    """tree_usage(root, uncounted=1): a root holding 300 MiB and its child holding 100 MiB count as
    100."""
    script = tmp_path / "hold.py"
    script.write_text(
        "import subprocess, sys, time\nheld = bytearray(int(sys.argv[1]) << 20)\nchild ="
        " subprocess.Popen([sys.executable, __file__, sys.argv[2], '0']) if sys.argv[2] != '0' else"
        " None\nprint('ready', flush=True)\ntime.sleep(60)\n"
    )
    root = subprocess.Popen(
        [sys.executable, str(script), "300", "100"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert root.stdout.readline() == "ready\n"
        deadline = time.monotonic() + 30
        # the root says ready before its child has filled its 100 MiB: wait for both
        while (
            tree_usage(root.pid)[0] < 390 or tree_usage(root.pid, uncounted=1)[0] < 95
        ) and time.monotonic() < deadline:
            time.sleep(0.1)
        everything, tasks = tree_usage(root.pid)
        children_only, same_tasks = tree_usage(root.pid, uncounted=1)
        assert everything >= 390 and 95 <= children_only <= 150 and tasks == same_tasks >= 2
    finally:
        os.killpg(root.pid, signal.SIGKILL)
        root.wait()


def test_the_count_finds_the_children_a_thread_started_and_the_grandchildren(tmp_path, monkeypatch):
    """tree_usage walks a process's children from its threads' /proc lists; it finds the same
    processes as the scan of every process's parent that it falls back to: a child started by a
    second thread, and its child, each holding 50 MiB."""
    script = tmp_path / "tree.py"
    script.write_text(
        "import subprocess, sys, threading, time\n"
        "held = bytearray(50 << 20)\n"
        "if sys.argv[1] == 'root':\n"
        "    def start():\n"
        "        subprocess.Popen([sys.executable, __file__, 'child'])\n"
        "        print('ready', flush=True)\n"
        "        time.sleep(60)  # the thread lives on: its child stays its own\n"
        "    threading.Thread(target=start).start()\n"
        "elif sys.argv[1] == 'child':\n"
        "    subprocess.Popen([sys.executable, __file__, 'leaf'])\n"
        "time.sleep(60)\n"
    )
    root = subprocess.Popen(
        [sys.executable, str(script), "root"],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert root.stdout.readline() == "ready\n"
        deadline = time.monotonic() + 30
        while tree_usage(root.pid)[0] < 150 and time.monotonic() < deadline:
            time.sleep(0.1)
        listed = tree_usage(root.pid)
        monkeypatch.setattr(watch, "_children_listed", lambda: False)
        scanned = tree_usage(root.pid)
        assert listed[0] >= 150 and scanned[0] >= 150 and abs(listed[0] - scanned[0]) < 20
        assert listed[1] == scanned[1] >= 3
    finally:
        os.killpg(root.pid, signal.SIGKILL)
        root.wait()


def test_a_zygote_that_cannot_import_says_why(tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "numpy.py").write_text("raise ImportError('numpy is broken here')\n")
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": f"{broken}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    handle = zygote.Zygote(env, ROOT, DeviceCourse.kernel.packages)
    try:
        with pytest.raises(zygote.ZygoteUnavailable, match="numpy is broken here"):
            handle.spawn(tmp_path / "job.json", 1, False, dict(os.environ))
        with pytest.raises(zygote.ZygoteUnavailable, match="numpy is broken here"):  # and stays so
            handle.spawn(tmp_path / "job.json", 1, False, dict(os.environ))
    finally:
        handle.close()
    shutil.rmtree(broken)


def test_a_local_pool_starts_its_zygote_at_once_and_one_closed_early_ends_it():
    """The zygote's imports (torch's 2 s) run while the grader sets the run up; a run that stops
    before its first job (a student chosen who is not there) does not wait for them."""
    from autograder.run.executors import LocalPool
    from autograder.settings import Settings

    pool = LocalPool(Settings(jobs=1))
    assert pool.zygote is not None and pool.zygote.started
    deadline = time.monotonic() + 10
    while pool.zygote.process is None and time.monotonic() < deadline:
        time.sleep(0.01)
    process = pool.zygote.process
    assert process is not None and process.poll() is None, "the zygote did not start"
    began = time.monotonic()
    pool.close()
    assert process.wait(timeout=5) is not None and time.monotonic() - began < 2


def test_the_zygote_names_the_devices_the_grader_would_and_the_grader_names_them_where_it_cannot(
    tmp_path,
):
    """The grader asks its zygote, whose imports are the kernels' (torch's), what the profile names
    of this machine, instead of importing torch to name them itself; where the zygote cannot answer
    it names them itself, the same."""
    from autograder.course.profile import checked_on
    from autograder.settings import Settings

    profile = f"{DeviceCourse.__module__}.{DeviceCourse.__name__}"
    here = checked_on(Settings(profile=profile))
    assert "cpu" in here[0]
    handle = zygote.Zygote(dict(os.environ), ROOT, DeviceCourse.kernel.packages)
    try:
        assert handle.checked(profile) == here
        assert handle.checked("no_such_package.Profile") is None  # its child failed
    finally:
        handle.close()
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "numpy.py").write_text("raise ImportError('numpy is broken here')\n")
    env = {"PATH": os.environ["PATH"], "PYTHONPATH": str(broken)}
    handle = zygote.Zygote(env, ROOT, DeviceCourse.kernel.packages)
    try:
        assert handle.checked(profile) is None  # it could not start
    finally:
        handle.close()
