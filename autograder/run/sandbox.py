"""Start a student's kernel in a sandbox: its own working copy, no network, limits.

The kernel provisioner (:mod:`autograder.run.provisioner`) starts every kernel of a runner through
:func:`wrap`; :func:`probe` finds what this machine allows, and :class:`Isolation` says which limits
hold, so the report can say so. How the sandbox is built from the inside:
:mod:`autograder.inside.launcher`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Iterable

from autograder.inside import launcher
from autograder.inside.launcher import per_namespace_pid_max
from autograder.settings import DISK_LIMIT_MIB, MAX_PROCESSES, WALL_PER_PROCESSOR_S, Settings

LAUNCHER = os.path.realpath(launcher.__file__)

NOBODY = 65534
# the largest file a kernel may write (RLIMIT_FSIZE); the course's own files are a few MiB
FILE_LIMIT_MIB = 1024


@dataclass(frozen=True)
class Isolation:
    """Which limits the sandbox enforces on this machine, and why not the others.

    Always: a process of its own with a memory limit on every process it starts (``RLIMIT_DATA``: an
    allocation past it fails with PyTorch's ``DefaultCPUAllocator: can't allocate memory``) and on
    every file it writes (``RLIMIT_FSIZE``); the runner enforces time, memory, processes and threads
    of the whole tree by ending it. With ``namespaces`` (Linux, where ``unshare`` works): new mount,
    network, PID, IPC, host-name and cgroup namespaces; every top-level folder but the system's is
    replaced by an empty one, the Python environment and the course's packages come back read-only,
    the student's working copy read-write (with a disk limit, on a tmpfs of that size that also
    holds ``/tmp``, home and ``/dev/shm``); the network has a loopback device only, System V IPC and
    POSIX message queues are its own and go with it, and every process the kernel started ends with
    it. A root grader runs the kernel as ``nobody``; another gets the same inside a user namespace
    of its own (``user_namespace``), without capabilities. GPUs stay visible (``/dev`` is
    untouched).
    """

    namespaces: bool
    reason: str = ""
    user_namespace: bool = False  # True: a grader that is not root, in a user namespace of its own

    def describe(
        self,
        memory_mib: int,
        time_limit_s: float,
        cell_timeout_s: float,
        disk_mib: int = DISK_LIMIT_MIB,
        max_processes: int = MAX_PROCESSES,
        cgroups: str = "",
        cpu_by_cgroup: bool = False,
    ) -> list[str]:
        """The report's lines on the limits; ``cgroups`` says whether Linux enforces them too
        (:meth:`autograder.run.cgroups.Cgroups.describe`), ``cpu_by_cgroup`` whether that cgroup
        counts the processor time."""
        by_linux = f", {cgroups}" if cgroups else ""
        counted = (
            "counted by Linux in the submission's cgroup, which no process leaves"
            if cpu_by_cgroup
            else (
                "counted from /proc: a process reaped by Linux itself, its parent ignoring SIGCHLD,"
                " is left out"
            )
        )
        memory = (
            f"{memory_mib} MiB per process (RLIMIT_DATA) and for all of a submission's processes"
            f" together (watched by the grader, Linux){by_linux}"
            if memory_mib
            else "off (--memory-limit-mib 0)"
        )
        lines = [
            (
                f"processor time: enforced, {cell_timeout_s:g} s per cell and {time_limit_s:g} s"
                f" per notebook, all of a submission's processes together ({counted}; kernel"
                f" killed); wall time {WALL_PER_PROCESSOR_S}x as much, for code that waits"
            ),
            f"memory: enforced, {memory}",
        ]
        file_limit = f"each file at most {FILE_LIMIT_MIB} MiB (RLIMIT_FSIZE)"
        if self.namespaces and disk_mib:
            lines.append(
                f"disk: enforced, {disk_mib} MiB for all it writes together (working copy, /tmp and"
                " /dev/shm on one tmpfs of that size, in memory, gone with the kernel),"
                f" {file_limit}"
            )
        else:
            why = "--disk-limit-mib 0" if self.namespaces else self.reason
            lines.append(
                f"disk: {file_limit}; all it writes together NOT bounded ({why}); the working copy"
                " is removed once graded (unless --keep-work)"
            )
        return lines + self._isolation_lines(max_processes, by_linux)

    def _isolation_lines(self, max_processes: int, by_linux: str) -> list[str]:
        """The report's lines on the network, files, processes and IPC."""
        if self.namespaces:
            who = (
                "in a user namespace, without capabilities"
                if self.user_namespace
                else "runs as nobody"
            )
            pid_max = ", and the PID namespace's pid_max" if per_namespace_pid_max() else ""
            count = (
                f"at most {max_processes} processes and threads together (counted by the"
                f" grader{pid_max}{by_linux}), "
                if max_processes
                else ""
            )
            return [
                "network: enforced, loopback only (network namespace)",
                (
                    "files: enforced, own working copy only; the Python environment and the"
                    f" course's packages read-only (mount namespace, {who})"
                ),
                f"processes: enforced, {count}all killed with the kernel (PID namespace)",
                (
                    "IPC: enforced, System V IPC and POSIX message queues of its own, gone with the"
                    " kernel (IPC namespace)"
                ),
            ]
        return [
            f"network: NOT enforced ({self.reason})",
            f"files: NOT enforced ({self.reason})",
            "processes: "
            + (
                f"at most {max_processes} processes and threads together (counted by the grader), "
                if max_processes
                else ""
            )
            + "kernel's process group killed at the end",
            f"IPC: NOT enforced ({self.reason})",
        ]


@lru_cache(maxsize=2)
def probe(user_namespace: bool | None = None) -> Isolation:
    """Find out once whether this machine lets the grader use namespaces, by starting an empty
    sandbox.

    ``user_namespace`` None: inside a user namespace unless the grader is root; True or False forces
    it.
    """
    if sys.platform != "linux":
        return Isolation(False, f"namespaces need Linux, this is {sys.platform}")
    if shutil.which("mount") is None:
        return Isolation(False, "util-linux's mount is not installed")
    if user_namespace is None:
        user_namespace = os.geteuid() != 0
    with tempfile.TemporaryDirectory(prefix="sandbox-probe-") as folder:
        spec = Spec(
            workdir="/", namespaces=True, user_namespace=user_namespace, read_only=python_paths()
        )
        spec_path = spec.write(Path(folder) / "spec.json")
        try:
            done = subprocess.run(
                wrap(["true"], spec_path), capture_output=True, text=True, timeout=60
            )
        except (OSError, subprocess.TimeoutExpired) as error:
            return Isolation(False, f"unshare failed: {error}")
    if done.returncode != 0:
        error = last_line(done.stderr) or f"exit {done.returncode}"
        if user_namespace:
            return Isolation(
                False,
                f"this Linux does not let a user other than root use namespaces ({error}); "
                "grade as root, e.g. in a container",
            )
        return Isolation(False, f"unshare failed: {error}")
    return Isolation(True, user_namespace=user_namespace)


def isolation_of(settings: Settings) -> Isolation:
    """What the sandbox of a run with ``settings`` can hold on this machine."""
    if not settings.sandbox:
        return Isolation(False, "switched off with --no-sandbox")
    return probe(settings.user_namespace)


def last_line(text: str) -> str:
    """The last line of ``text`` that is not blank, stripped; "" if there is none."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


@dataclass
class Spec:
    """What the inside half needs: written as JSON next to the kernel's connection file."""

    workdir: str
    memory_mib: int = 0
    max_processes: int = MAX_PROCESSES
    max_file_mib: int = FILE_LIMIT_MIB
    # with namespaces: what the kernel writes goes to a tmpfs of this size (0: to the folders)
    disk_mib: int = 0
    # the kernel's sockets: read-write until the kernel has made them, then sealed (SIGUSR1)
    ipc_dir: str = ""
    namespaces: bool = False
    user_namespace: bool = False
    hide: list[str] = field(default_factory=list)
    read_only: list[str] = field(default_factory=list)
    read_write: list[str] = field(default_factory=list)
    uid: int = NOBODY
    gid: int = NOBODY
    cgroup_procs: list[str] = field(default_factory=list)  # the launcher joins these cgroups first
    # the file the sandbox's standard output and error go to (provisioner.KernelOutput)
    kernel_output: str = ""

    def __post_init__(self):
        if self.user_namespace:  # only the grader's own user id exists in its user namespace, as 0
            self.uid = self.gid = 0

    @property
    def as_nobody(self) -> bool:
        """The kernel runs as ``nobody`` (a root grader): its files must belong to nobody."""
        return self.namespaces and not self.user_namespace

    def write(self, path: Path) -> Path:
        path.write_text(json.dumps(self.__dict__))
        return path


def python_paths(hide: Iterable[str] = (), packages: Iterable[Path] = ()) -> list[str]:
    """The folders this Python imports from (environment, site-packages, editable installs).

    A folder on ``sys.path`` inside one of ``hide`` is left out unless it is this Python's
    environment or one of the course's ``packages`` (its grading profile's): ``python -m`` puts the
    folder it was started in on ``sys.path``, pytest the course's ``tests/``, an instructor's
    ``PYTHONPATH`` what it names, and binding one of them back into the sandbox would show the
    kernel what hiding hid (hidden tests, solutions, other students' work).
    """
    needed = [os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, *packages)]
    on_path = {os.path.realpath(p) for p in sys.path if p and os.path.isdir(p)}
    hidden = [os.path.realpath(p) for p in hide]
    return sorted(
        p
        for p in on_path.union(needed)
        if not launcher._under(p, hidden) or launcher._under(p, needed)
    )


def wrap(command: list[str], spec_path: Path) -> list[str]:
    """The command line that runs ``command`` inside the sandbox described by ``spec_path``.

    The sandbox ends when the process that starts this command line ends (on Linux).
    """
    return [sys.executable, "-I", LAUNCHER, str(spec_path), str(os.getpid()), "--", *command]


def tethered(
    command: list[str], signum: int, uid: int | None = None, gid: int | None = None
) -> list[str]:
    """The command line that runs ``command`` in its own place, sent ``signum`` when this process
    ends.

    On Linux the signal comes from the kernel (``PR_SET_PDEATHSIG``), so it comes however this
    process ends, SIGKILL included; elsewhere ``command`` simply runs. ``uid``/``gid`` (a root
    caller): ``command`` runs as that user, who need not be able to read this Python (a change of
    user clears the request, so it is made after the change). Use it rather than a
    ``preexec_fn``, which runs Python between fork and exec and can deadlock in a process with
    threads (a test process, a Jupyter server). Linux counts the *thread* that starts the process as
    its parent: started from a thread other than the main one, ``command`` gets ``signum`` when that
    thread ends, so such a thread must outlive it.
    """
    user = ["--as", f"{uid}:{gid if gid is not None else uid}"] if uid is not None else []
    return [
        sys.executable,
        "-I",
        LAUNCHER,
        "--tether",
        str(os.getpid()),
        str(int(signum)),
        *user,
        "--",
        *command,
    ]
