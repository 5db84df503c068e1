"""autograder.run.cgroups on this machine's real cgroups: Linux's own memory and process limits for
a sandbox.

Which version the grader uses depends on the machine. On one where the grader runs as root with
cgroup v1's memory and pids hierarchies (a CI runner, a container), these tests use them for real;
a machine that offers the grader no cgroups is checked for saying why.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from autograder.inside import launcher
from autograder.run import cgroups

FOUND = cgroups.find()


def test_the_decision_is_cgroups_where_linux_gives_them_or_a_reason():
    writable_v1 = (
        os.geteuid() == 0
        and os.access("/sys/fs/cgroup/memory", os.W_OK)
        and os.access("/sys/fs/cgroup/pids", os.W_OK)
    )
    if writable_v1:
        assert FOUND.version in (1, 2), FOUND.reason
    if FOUND.version == 0:
        assert FOUND.reason and FOUND.describe() == f"no cgroup: {FOUND.reason}"
    else:
        assert {"memory", "pids"} <= set(FOUND.parents) <= {"memory", "pids", "cpuacct"}
        assert f"cgroup v{FOUND.version}" in FOUND.describe()
    if FOUND.version == 1 and os.geteuid() == 0 and os.access("/sys/fs/cgroup/cpuacct", os.W_OK):
        assert FOUND.counts_cpu, (
            "a root grader with cgroup v1's cpuacct counts processor time there"
        )


def test_a_v2_hierarchy_without_the_controllers_is_refused_with_its_reason():
    mounts = [point for point, kind, _ in cgroups._mounts() if kind == "cgroup2"]
    if not mounts:
        pytest.skip("no cgroup v2 hierarchy on this machine")
    here = Path(mounts[0]) / cgroups._own().get("", "/").lstrip("/")
    offered = set((here / "cgroup.controllers").read_text().split())
    found = cgroups._v2(mounts[0], cgroups._own().get("", "/"))
    if not {"memory", "pids"} <= offered:
        assert found.version == 0 and "offers no memory and pids controllers" in found.reason


needs_cgroups = pytest.mark.skipif(
    FOUND.version == 0, reason=f"no cgroups for the grader here: {FOUND.reason}"
)


def _in_group(group: cgroups.Group, code: str, timeout: float = 30) -> subprocess.CompletedProcess:
    """Run ``code`` in a Python process that first joins ``group``, as the sandbox's launcher
    does."""
    prelude = (
        f"import sys; sys.path.insert(0, {str(Path(launcher.__file__).parent)!r}); import launcher;"
        f" launcher.join_cgroups({group.joins!r})\n"
    )
    return subprocess.run(
        [sys.executable, "-c", prelude + code], capture_output=True, text=True, timeout=timeout
    )


@needs_cgroups
def test_past_the_memory_limit_linux_ends_a_process_and_the_group_counts_it():
    group = cgroups.Group.create(FOUND, memory_mib=64, max_processes=100)
    try:
        done = _in_group(group, "block = bytearray(256 << 20)\nprint('allocated')")
        assert done.returncode == -9 and "allocated" not in done.stdout, (
            done.returncode,
            done.stderr[-300:],
        )
        assert group.oom_kills() == 1
        fine = _in_group(group, "block = bytearray(16 << 20)\nprint('allocated')")
        assert fine.returncode == 0 and "allocated" in fine.stdout
    finally:
        group.remove()
    assert not any(folder.exists() for folder in group.folders)


@needs_cgroups
def test_past_the_process_limit_new_threads_fail_and_the_group_counts_them():
    group = cgroups.Group.create(FOUND, memory_mib=0, max_processes=8)
    try:
        done = _in_group(
            group,
            """
import threading
stop, started, refused = threading.Event(), 0, 0
for _ in range(20):
    try:
        threading.Thread(target=stop.wait, daemon=True).start()
        started += 1
    except RuntimeError:
        refused += 1
stop.set()
print(started, refused)
""",
        )
        started, refused = map(int, done.stdout.split())
        assert started < 8 and refused > 0 and started + refused == 20, done.stdout
        assert group.refused_forks() >= refused
    finally:
        group.remove()


@needs_cgroups
def test_removing_a_group_ends_what_is_left_in_it():
    group = cgroups.Group.create(FOUND, memory_mib=256, max_processes=100)
    prelude = (
        f"import sys; sys.path.insert(0, {str(Path(launcher.__file__).parent)!r}); import launcher;"
        f" launcher.join_cgroups({group.joins!r}); import time; print('in', flush=True);"
        " time.sleep(60)"
    )
    process = subprocess.Popen([sys.executable, "-c", prelude], stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "in"
    group.remove()
    assert process.wait(timeout=10) == -9
    assert not any(folder.exists() for folder in group.folders)


_JOBS = "from autograder.run.cgroups import usable_cores; print(usable_cores())"


def _own_cpu_v1() -> Path | None:
    """This process's cgroup v1 ``cpu`` folder, where the grader may make cgroups in it (root); else
    None."""
    point = next(
        (
            point
            for point, kind, options in cgroups._mounts()
            if kind == "cgroup" and "cpu" in options
        ),
        None,
    )
    own = cgroups._own().get("cpu")
    if point is None or own is None:
        return None
    here = Path(point) / own.lstrip("/")
    return here if os.access(here, os.W_OK) and (here / "cpu.cfs_quota_us").exists() else None


def test_the_default_jobs_are_the_cores_the_grader_may_run_on():
    """A grader held to one core by its affinity (taskset, as Slurm's cores hold a job) grades one
    notebook at a time by default; one held to half a core by a CPU quota on its cgroup (as a
    container's ``--cpus`` or a pod's limit does, here a real cgroup v1 ``cpu`` quota) grades one;
    one held to neither, one per core."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("one core: no fewer to hold the grader to")
    run = {
        "capture_output": True,
        "text": True,
        "timeout": 60,
        "cwd": Path(launcher.__file__).parents[2],
    }
    assert subprocess.run([sys.executable, "-c", _JOBS], **run).stdout.strip() == str(len(cores))
    pinned = subprocess.run(["taskset", "-c", str(cores[-1]), sys.executable, "-c", _JOBS], **run)
    assert pinned.stdout.strip() == "1", pinned.stderr[-300:]
    parent = _own_cpu_v1()
    if parent is None:
        pytest.skip("no writable cgroup v1 cpu hierarchy here for the quota")
    group = parent / f"{cgroups.PREFIX}cpu-test-{os.getpid()}"
    group.mkdir()
    try:
        (group / "cpu.cfs_period_us").write_text("100000")
        (group / "cpu.cfs_quota_us").write_text("50000")  # half a core
        held = subprocess.run(
            [
                "sh",
                "-c",
                f'echo $$ > {group}/cgroup.procs && exec "$0" -c "$1"',
                sys.executable,
                _JOBS,
            ],
            **run,
        )
        assert held.stdout.strip() == "1", held.stderr[-300:]
    finally:
        group.rmdir()


def test_a_cgroup_v2_quota_is_read_from_cpu_max_up_the_hierarchy(tmp_path, monkeypatch):
    """cgroup v2's ``cpu.max`` (no v2 cpu controller on the machines this was written on, so its
    files here): the smallest quota of the process's cgroup and those above it counts; ``max`` is
    none; a folder of the path a container cannot see is passed over."""
    (tmp_path / "pod" / "worker").mkdir(parents=True)
    monkeypatch.setattr(cgroups, "_mounts", lambda: [(str(tmp_path), "cgroup2", {"rw"})])
    monkeypatch.setattr(cgroups, "_own", lambda: {"": "/pod/worker"})
    assert cgroups.cpu_quota() is None
    (tmp_path / "pod" / "worker" / "cpu.max").write_text("max 100000\n")
    assert cgroups.cpu_quota() is None
    (tmp_path / "pod" / "cpu.max").write_text("250000 100000\n")
    assert cgroups.cpu_quota() == 2.5
    (tmp_path / "pod" / "worker" / "cpu.max").write_text("150000 100000\n")
    assert cgroups.cpu_quota() == 1.5
    # the host's path
    monkeypatch.setattr(cgroups, "_own", lambda: {"": "/kubepods/burstable/pod/worker"})
    (tmp_path / "cpu.max").write_text("75000 100000\n")
    assert cgroups.cpu_quota() == 0.75


REAPED_BY_LINUX = """
import os, signal, time
# Linux reaps the child: its time reaches no parent's cutime
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
if os.fork() == 0:
    began = time.process_time()
    while time.process_time() - began < 1.0:
        pass
    os._exit(0)
time.sleep(3)
print(sum(os.times()[:4]))
"""


@pytest.mark.skipif(
    not FOUND.counts_cpu, reason="the grader's cgroups count no processor time here"
)
def test_the_group_counts_the_processor_time_of_a_child_nobody_reaped():
    group = cgroups.Group.create(FOUND, memory_mib=0, max_processes=100)
    try:
        done = _in_group(group, REAPED_BY_LINUX)
        assert done.returncode == 0, done.stderr
        assert float(done.stdout) < 0.5, (
            "the parent's own count holds the child's time: nothing to show"
        )
        assert group.cpu_s() >= 1.0, group.cpu_s()
    finally:
        group.remove()
