"""The sandbox a submission's kernel runs in: what it can see, write and do, for a root and a non-root grader."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from autograder import sandbox

ROOT = Path(__file__).resolve().parents[1]

# Runs inside the sandbox and reports what it finds, as JSON on its last line.
LOOK_AROUND = r'''
import json, os, socket, sys
from pathlib import Path

def can_write(folder):
    try:
        with open(os.path.join(folder, "probe.txt"), "w") as handle:
            handle.write("x")
        os.remove(os.path.join(folder, "probe.txt"))
        return True
    except OSError:
        return False

status = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
print(json.dumps({
    "uid": os.getuid(),
    "capabilities": int(status["CapEff"].strip(), 16) | int(status["CapPrm"].strip(), 16),
    "course_visible": os.path.exists(sys.argv[1]),
    "others_visible": os.path.exists(sys.argv[2]),
    "write_own_copy": can_write(os.getcwd()),
    "write_environment": can_write(sys.prefix),
    "write_etc": can_write("/etc"),
    "networks": sorted(name for _, name in socket.if_nameindex()),
    "processes": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
}))
'''


def _look_around(user_namespace: bool) -> dict:
    isolation = sandbox.probe(user_namespace)
    if not isolation.namespaces:
        pytest.skip(f"no namespaces on this machine: {isolation.reason}")
    with tempfile.TemporaryDirectory(prefix="sandbox-test-") as folder:
        folder = Path(folder)
        work, others = folder / "work", folder / "others"
        work.mkdir()
        others.mkdir()
        (others / "secret.txt").write_text("another student's work")
        spec = sandbox.Spec(workdir=str(work), namespaces=True, user_namespace=user_namespace,
                            hide=[str(ROOT), str(folder)], read_only=sandbox.python_paths(), read_write=[str(work)])
        if spec.as_nobody:
            folder.chmod(0o755)
            os.chown(work, sandbox.NOBODY, sandbox.NOBODY)
        command = sandbox.wrap([sys.executable, "-c", LOOK_AROUND, str(ROOT / "solutions"), str(others)],
                               spec.write(folder / "spec.json"))
        done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("user_namespace", [False, True], ids=["root-grader", "user-namespace"])
def test_kernel_sees_and_writes_only_its_own_copy(user_namespace):
    if not user_namespace and os.geteuid() != 0:
        pytest.skip("the root flavour of the sandbox needs a grader running as root")
    seen = _look_around(user_namespace)
    assert seen["uid"] == (0 if user_namespace else sandbox.NOBODY)
    assert seen["capabilities"] == 0, "the kernel must keep no capability"
    assert not seen["course_visible"], "the course's solutions are visible"
    assert not seen["others_visible"], "another folder of the grader's is visible"
    assert seen["write_own_copy"]
    assert not seen["write_environment"], "the Python environment is writable"
    if os.geteuid() != 0 or not user_namespace:
        # (A root grader forced into a user namespace keeps root's own id, which owns /etc.)
        assert not seen["write_etc"], "/etc is writable"
    assert seen["networks"] == ["lo"]
    assert len(seen["processes"]) <= 3, seen["processes"]  # its own PID namespace: init, itself, maybe ls


def test_isolation_describes_the_user_namespace():
    lines = sandbox.Isolation(True, user_namespace=True).describe(1024, 60, 10)
    assert any("files: enforced" in line and "user namespace" in line for line in lines)
    lines = sandbox.Isolation(False, "no namespaces here").describe(1024, 60, 10)
    assert any(line.startswith("files: NOT enforced (no namespaces here)") for line in lines)


WRITE_TOO_MUCH = r'''
import sys
with open("big.bin", "wb") as handle:
    handle.write(b"x" * (1 << 19))  # half the limit
    try:
        handle.write(b"x" * (1 << 20))  # past it
        handle.flush()
    except OSError as error:
        print("refused:", error.strerror)
print("still running")
'''


def test_a_file_past_the_limit_is_refused_and_the_kernel_goes_on(tmp_path):
    """RLIMIT_FSIZE: the write past it fails with "File too large" and the kernel goes on."""
    spec = sandbox.Spec(workdir=str(tmp_path), max_file_mib=1)
    command = sandbox.wrap([sys.executable, "-c", WRITE_TOO_MUCH], spec.write(tmp_path / "spec.json"))
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["refused: File too large", "still running"], done.stdout
    assert (1 << 19) <= (tmp_path / "big.bin").stat().st_size <= 1 << 20
