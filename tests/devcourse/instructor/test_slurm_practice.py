"""slurm-check on a real Slurm of two compute nodes: tools/practice-slurm.sh's cluster on this
machine.

Debian's Slurm (``make slurm`` installs it; ``make test`` does so first) runs slurmctld here and one
slurmd in each of two network namespaces, with host names, /tmp and slurm-check's work folder of
their own, so each worker reaches the grader's scheduler over a network and cannot read the grader's
work folder (see the script's header for what the two nodes still share). The script needs root: the
tests run it as root, or with ``sudo -n``, or use a practice cluster already started with ``sudo
tools/practice-slurm.sh up``.
"""

import os
import shutil
import subprocess
import sys
import time

import pytest
from support.system import missing as system_package_missing

from devcourse.instructor.paths import ROOT

SCRIPT = ROOT / "tools" / "practice-slurm.sh"


def _nodes_up() -> str | None:
    """sinfo's node list when both practice nodes are idle already, else None."""
    done = subprocess.run(["sinfo", "-N"], capture_output=True, text=True)
    lines = done.stdout.splitlines() if done.returncode == 0 else []
    idle = {line.split()[0] for line in lines[1:] if line.split()[-1] == "idle"}
    return done.stdout if {"node1", "node2"} <= idle else None


@pytest.fixture(scope="module")
def practice_slurm():
    missing = [
        tool
        for tool in ("slurmctld", "slurmd", "sbatch", "munged")
        if shutil.which(tool) is None and not os.path.exists(f"/usr/sbin/{tool}")
    ]
    if missing:
        system_package_missing(
            f"{', '.join(missing)} not installed: `make slurm` installs Debian's Slurm and "
            "munge (make test does it first)"
        )
    running = _nodes_up()
    if running:  # started by hand (sudo tools/practice-slurm.sh up): used, and left running
        yield running
        return
    as_root = [] if os.geteuid() == 0 else ["sudo", "-n"]
    up = subprocess.run([*as_root, str(SCRIPT), "up"], capture_output=True, text=True, timeout=120)
    if up.returncode != 0:
        pytest.fail(
            "tools/practice-slurm.sh up failed (it needs root: as another user, sudo without a"
            f" password, or run `sudo tools/practice-slurm.sh up` first):\n{up.stdout}\n{up.stderr}"
        )
    try:
        yield up.stdout
    finally:
        subprocess.run([*as_root, str(SCRIPT), "down"], capture_output=True, timeout=120)


def _check(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "autograder",
            "slurm-check",
            "--scheduler-interface",
            "slurmbr0",
            "--start-timeout",
            "120",
            *args,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_slurm_check_grades_through_workers_on_two_nodes_that_cannot_read_the_work_folder(
    practice_slurm,
):
    assert "node1" in practice_slurm and "node2" in practice_slurm  # sinfo: both nodes idle
    done = _check()
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert (
        "workers on 2 host(s) (node1, node2)" in out
        and "every worker inside a Slurm job: True" in out
    )
    # its last line of its own: Dask may warn after it (a dashboard port another cluster holds, on
    # stderr)
    assert "0 unexpected scores" in out and done.stdout.rstrip().endswith("[slurm-check] passed")
    ran_on = {
        path.read_text().split()[1].rsplit(":", 1)[0]
        for path in (ROOT / "build" / "slurm-check" / "work").glob("jobs/*/*/*/ran_on.txt")
    }
    # the nodes' own addresses, not loopback
    assert ran_on == {"tcp://10.77.0.11", "tcp://10.77.0.12"}


def test_jobs_that_fail_at_their_start_stop_the_check_in_seconds_not_at_its_timeout(
    practice_slurm, tmp_path
):
    # A work folder under /tmp: each node has a /tmp of its own, so Slurm cannot open the jobs' log
    # files there and the jobs end at once, as they do on a cluster whose nodes do not share the
    # folder.
    began = time.monotonic()
    done = _check("--workdir", str(tmp_path / "check"))
    assert done.returncode == 1, done.stdout + done.stderr
    assert time.monotonic() - began < 60
    assert (
        "0 of 2 workers joined, and their Slurm jobs" in done.stderr
        and "no log of theirs" in done.stderr
    )
    assert "Nothing was graded." in done.stderr
