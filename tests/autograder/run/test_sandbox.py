"""The sandbox a submission's kernel runs in: what it can see, write and do, for a root and a
non-root grader."""

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from devcourse.instructor.profile import DeviceCourse
from autograder.run import sandbox

ROOT = Path(__file__).resolve().parents[3]

# Runs inside the sandbox and reports what it finds, as JSON on its last line.
LOOK_AROUND = r"""
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
    "tests_visible": os.path.exists(sys.argv[3]),
    "devcourse_imports": __import__("devcourse").__name__ == "devcourse",
    "write_own_copy": can_write(os.getcwd()),
    "write_environment": can_write(sys.prefix),
    "write_etc": can_write("/etc"),
    "networks": sorted(name for _, name in socket.if_nameindex()),
    "hostname": socket.gethostname(),
    "processes": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
}))
"""


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
        # pytest puts tests/ on sys.path, as `python -m` puts the folder it starts in: neither may
        # come back.
        assert str(ROOT / "tests") in sys.path
        hide = [str(ROOT), str(folder)]
        spec = sandbox.Spec(
            workdir=str(work),
            namespaces=True,
            user_namespace=user_namespace,
            hide=hide,
            read_only=sandbox.python_paths(hide, DeviceCourse().package_folders()),
            read_write=[str(work)],
        )
        if spec.as_nobody:
            folder.chmod(0o755)
            os.chown(work, sandbox.NOBODY, sandbox.NOBODY)
        command = sandbox.wrap(
            [
                sys.executable,
                "-c",
                LOOK_AROUND,
                str(ROOT / "solutions"),
                str(others),
                str(ROOT / "tests" / "test_sandbox.py"),
            ],
            spec.write(folder / "spec.json"),
        )
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
    assert not seen["tests_visible"], (
        "a folder on the grader's sys.path under the course brings hidden tests back"
    )
    assert seen["devcourse_imports"]
    assert seen["write_own_copy"]
    assert not seen["write_environment"], "the Python environment is writable"
    if os.geteuid() != 0 or not user_namespace:
        # (A root grader forced into a user namespace keeps root's own id, which owns /etc.)
        assert not seen["write_etc"], "/etc is writable"
    assert seen["networks"] == ["lo"]
    assert seen["hostname"] == "localhost", "the machine's own name shows (no UTS namespace)"
    # its own PID namespace: init, itself, maybe ls
    assert len(seen["processes"]) <= 3, seen["processes"]


def test_isolation_describes_the_user_namespace():
    lines = sandbox.Isolation(True, user_namespace=True).describe(1024, 60, 10)
    assert any("files: enforced" in line and "user namespace" in line for line in lines)
    lines = sandbox.Isolation(False, "no namespaces here").describe(1024, 60, 10)
    assert any(line.startswith("files: NOT enforced (no namespaces here)") for line in lines)


WRITE_TOO_MUCH = r"""
import sys
with open("big.bin", "wb") as handle:
    handle.write(b"x" * (1 << 19))  # half the limit
    try:
        handle.write(b"x" * (1 << 20))  # past it
        handle.flush()
    except OSError as error:
        print("refused:", error.strerror)
print("still running")
"""


def test_a_file_past_the_limit_is_refused_and_the_kernel_goes_on(tmp_path):
    """RLIMIT_FSIZE: the write past it fails with "File too large" and the kernel goes on."""
    spec = sandbox.Spec(workdir=str(tmp_path), max_file_mib=1)
    command = sandbox.wrap(
        [sys.executable, "-c", WRITE_TOO_MUCH], spec.write(tmp_path / "spec.json")
    )
    done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["refused: File too large", "still running"], done.stdout
    assert (1 << 19) <= (tmp_path / "big.bin").stat().st_size <= 1 << 20


FILL_THE_DISK = r"""
import json, os, sys
written, refused = 0, {}
for folder in (os.getcwd(), "/tmp", "/dev/shm", os.environ.get("HOME", "/tmp")):
    for index in range(8):
        try:
            with open(os.path.join(folder, f"fill-{index}.bin"), "wb") as handle:
                handle.write(b"x" * (1 << 20))
            written += 1
        except OSError as error:
            refused[folder] = error.strerror
            break
for folder in sys.argv[1:]:
    try:
        open(os.path.join(folder, "planted.txt"), "w").close()
    except OSError as error:
        refused[folder] = error.strerror
print(json.dumps({"written_mib": written, "refused": refused}))
"""


@pytest.mark.parametrize("user_namespace", [False, True], ids=["root-grader", "user-namespace"])
def test_all_a_kernel_writes_together_stays_within_the_disk_limit_and_leaves_nothing(
    tmp_path, user_namespace
):
    """Working copy, /tmp, /dev/shm and home share one tmpfs of disk_mib; the grader's copy and the
    rest stay."""
    if not user_namespace and os.geteuid() != 0:
        pytest.skip("the root flavour of the sandbox needs a grader running as root")
    if not sandbox.probe(user_namespace).namespaces:
        pytest.skip(f"no namespaces on this machine: {sandbox.probe(user_namespace).reason}")
    work, hidden_top = tmp_path / "work", "/srv" if os.path.isdir("/srv") else "/opt"
    work.mkdir()
    (work / "answer.ipynb").write_text("{}")
    spec = sandbox.Spec(
        workdir=str(work),
        namespaces=True,
        user_namespace=user_namespace,
        disk_mib=6,
        hide=[str(ROOT)],
        read_only=sandbox.python_paths(),
        read_write=[str(work)],
    )
    if spec.as_nobody:
        tmp_path.chmod(0o755)
        for path in (work, work / "answer.ipynb"):
            os.chown(path, sandbox.NOBODY, sandbox.NOBODY)
    command = sandbox.wrap(
        [sys.executable, "-c", FILL_THE_DISK, hidden_top], spec.write(tmp_path / "spec.json")
    )
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert 4 <= seen["written_mib"] <= 6, seen
    assert set(seen["refused"].values()) >= {"No space left on device"}, seen
    assert seen["refused"].get(hidden_top) in ("Read-only file system", "Permission denied"), seen
    assert sorted(path.name for path in work.iterdir()) == ["answer.ipynb"], (
        "a write reached the grader's copy"
    )


SPAWN_THREADS = r"""
import threading, time
stop, started = threading.Event(), 0
try:
    for _ in range(600):
        threading.Thread(target=stop.wait, daemon=True).start()
        started += 1
except RuntimeError:
    pass
print(started)
stop.set()
"""


def test_a_sandbox_has_its_own_pid_max_where_linux_has_one_per_namespace(tmp_path):
    """Linux 6.14+: the sandbox's PID namespace holds about max_processes tasks, whatever the
    machine's pid_max."""
    isolation = sandbox.probe()
    if not (isolation.namespaces and sandbox.per_namespace_pid_max()):
        pytest.skip("no namespaces, or a Linux with one pid_max for the whole machine")
    spec = sandbox.Spec(
        workdir=str(tmp_path),
        namespaces=True,
        user_namespace=isolation.user_namespace,
        max_processes=40,
        hide=[str(ROOT)],
        read_only=sandbox.python_paths(),
        read_write=[str(tmp_path)],
    )
    tmp_path.chmod(0o755)
    command = sandbox.wrap(
        [sys.executable, "-c", SPAWN_THREADS], spec.write(tmp_path / "spec.json")
    )
    done = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert 40 <= int(done.stdout.split()[-1]) < 40 + 300, done.stdout
    assert int(Path("/proc/sys/kernel/pid_max").read_text()) > 40 + 300, (
        "the machine's pid_max was changed"
    )


def test_disk_use_is_read_only_from_a_disk_of_the_sandbox_size():
    """The grader's own /tmp (no sandbox's tmpfs of that size) is never read as a submission's
    disk."""
    from autograder.run.watch import disk_used_mib

    size = os.statvfs("/tmp")
    own = round(size.f_blocks * size.f_frsize / (1 << 20))
    assert disk_used_mib(os.getpid(), own + 64) is None
    assert disk_used_mib(os.getpid(), own) == pytest.approx(
        (size.f_blocks - size.f_bfree) * size.f_frsize / (1 << 20), abs=64
    )


MOUNTED = r"""
import json, sys
from autograder.inside import launcher

print(
    json.dumps(
        {
            "points": [[point, sorted(options)] for point, options in launcher.mount_points()],
            "below": launcher._mounts_below(sys.argv[1]),
        }
    )
)
"""


def test_mount_points_are_read_as_paths_even_with_a_space_in_their_name(tmp_path):
    """mountinfo writes a space as \\040: the sandbox's binds below a folder and the sealed IPC
    folder are found by their paths (a course under "My Course" included), with their options."""
    folder = tmp_path / "My Course"
    (folder / "node tmp").mkdir(parents=True)
    script = (
        f'mount -t tmpfs -o ro,size=1m none "{folder}/node tmp" && '
        f'exec "{sys.executable}" -c \'{MOUNTED}\' "{folder}"'
    )
    own = ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-rm"]
    done = subprocess.run(
        [*own, "sh", "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=str(ROOT)),
    )
    if done.returncode != 0 and "unshare" in done.stderr:
        pytest.skip(f"no mount namespace of the test's own: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert [str(folder / "node tmp"), ["ro"]] in [
        [p, [o for o in options if o == "ro"]] for p, options in seen["points"]
    ]
    assert seen["below"] == [str(folder / "node tmp")]
