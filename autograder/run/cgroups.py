"""A cgroup for each sandbox, where Linux lets the grader make one: memory and processes limited by
Linux itself.

The runner's watch (:mod:`autograder.run.runner`) ends a sandbox once its sums are over, which can
be late by a quarter of a second; a cgroup has Linux enforce the limits at every allocation and
fork. The grader decides once (:func:`find`), each runner makes its sandboxes' groups
(:meth:`Group.create`), and the launcher joins one
(:func:`autograder.inside.launcher.join_cgroups`).
"""

from __future__ import annotations

import math
import os
import secrets
import signal
import time
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

GRADER_LEAF = "course-grader"
# a sandbox's cgroup is PREFIX + the pid of the runner that made it + a token
PREFIX = "course-sandbox-"


@dataclass(frozen=True)
class Cgroups:
    """What this machine lets the grader use: ``version`` 2 or 1 with the folders to make cgroups
    in, or 0."""

    version: int
    # controller -> the folder new cgroups go in
    parents: dict[str, str] = field(default_factory=dict)
    reason: str = ""  # why not, when version is 0

    def describe(self) -> str:
        """How the report says it: the limits are also Linux's, in a cgroup, or why not."""
        if self.version:
            return f"and by Linux in a cgroup v{self.version} of its own"
        return f"no cgroup: {self.reason}"

    @property
    def counts_cpu(self) -> bool:
        """Whether a sandbox's cgroup counts its processor time (v2's ``cpu.stat``, v1's
        ``cpuacct``)."""
        return self.version == 2 or "cpuacct" in self.parents


def _mounts() -> list[tuple[str, str, set[str]]]:
    """(mount point, file system type, super options) of every cgroup mount this process sees."""
    found = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return found
    for line in lines:
        before, _, after = line.partition(" - ")
        fields, tail = before.split(), after.split()
        if len(fields) > 4 and len(tail) > 2 and tail[0] in ("cgroup", "cgroup2"):
            found.append((fields[4], tail[0], set(tail[2].split(","))))
    return found


def _own() -> dict[str, str]:
    """This process's cgroup path for each v1 controller, and "" for the v2 hierarchy."""
    paths = {}
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return paths
    for line in lines:
        number, controllers, path = line.split(":", 2)
        if number == "0" and controllers == "":
            paths[""] = path
        for controller in controllers.split(","):
            if controller:
                paths[controller] = path
    return paths


def _up(point: str, path: str) -> list[Path]:
    """The folders of the cgroup at ``path`` under the mount ``point``, then of each cgroup above
    it, up to ``point``."""
    here, top = Path(point) / path.lstrip("/"), Path(point)
    folders = [here, *here.parents]
    return folders[: folders.index(top) + 1] if top in folders else [top]


def _words(*files: Path) -> list[str]:
    """The words of ``files``, one after another; none if one of them cannot be read."""
    words = []
    for file in files:
        try:
            words += file.read_text().split()
        except OSError:
            return []
    return words


def cpu_quota() -> float | None:
    """The fewest cores a CPU quota lets this process use, or None where none is set.

    A quota is how a container's ``--cpus``, a Kubernetes pod's CPU limit or systemd's ``CPUQuota=``
    limit a process, not by which cores it may run on: so many microseconds of processor time in
    every period. It is read from this process's cgroup and each cgroup above it (the smallest
    counts): ``cpu.max`` with cgroup v2 (``max 100000`` for none, ``200000 100000`` for two cores),
    ``cpu.cfs_quota_us`` over ``cpu.cfs_period_us`` with v1 (a quota of -1 for none). A folder that
    is not there (a container that sees only its own part of the hierarchy) is passed over.
    """
    own, limits = _own(), []
    for point, kind, options in _mounts():
        if kind == "cgroup2" and "" in own:
            path, files = own[""], ["cpu.max"]
        elif kind == "cgroup" and "cpu" in options and "cpu" in own:
            path, files = own["cpu"], ["cpu.cfs_quota_us", "cpu.cfs_period_us"]
        else:
            continue
        for folder in _up(point, path):
            words = _words(*(folder / file for file in files))  # quota and period
            if len(words) == 2 and words[0] != "max" and int(words[0]) > 0 and int(words[1]) > 0:
                limits.append(int(words[0]) / int(words[1]))
    return min(limits) if limits else None


def usable_cores() -> int:
    """The cores this process may use: the default number of notebooks graded at once.

    Fewer than ``os.cpu_count()`` where the process is held to some of them: by its CPU affinity (a
    Slurm job's cores, ``taskset``; Linux) or by a CPU quota on its cgroup (a container's
    ``--cpus``, a Kubernetes pod's limit, :func:`cpu_quota`), rounded up. At least 1.
    """
    cores = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )
    quota = cpu_quota()
    if quota is not None:
        cores = min(cores, math.ceil(quota))
    return max(1, cores)


def _trial(parent: Path, files: list[str]) -> bool:
    """Whether a cgroup can be made in ``parent`` with ``files``, each written; it is removed
    again."""
    trial = parent / f"course-trial-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        trial.mkdir()
    except OSError:
        return False
    try:
        return all((trial / name).is_file() for name in files)
    finally:
        try:
            trial.rmdir()
        except OSError:
            pass


def _v2(mount: str, own: str) -> Cgroups:
    here = Path(mount) / own.lstrip("/")
    try:
        offered = set((here / "cgroup.controllers").read_text().split())
    except OSError as error:
        return Cgroups(0, reason=f"cannot read the grader's cgroup v2 ({error.strerror})")
    if not {"memory", "pids"} <= offered:
        return Cgroups(
            0, reason=f"the grader's cgroup v2 offers no memory and pids controllers ({here})"
        )
    if not os.access(here, os.W_OK):
        return Cgroups(
            0,
            reason=(
                f"the grader may not write in its cgroup v2 ({here}); delegate it, e.g. "
                "systemd-run --scope -p Delegate=yes"
            ),
        )
    enabled = set((here / "cgroup.subtree_control").read_text().split())
    if not {"memory", "pids"} <= enabled:
        leaf = here / GRADER_LEAF
        # a cgroup with processes cannot give its children controllers: the grader moves into a leaf
        try:
            leaf.mkdir(exist_ok=True)
            (leaf / "cgroup.procs").write_text(str(os.getpid()))
            (here / "cgroup.subtree_control").write_text("+memory +pids")
        except OSError as error:
            try:
                (here / "cgroup.procs").write_text(str(os.getpid()))
            except OSError:
                pass
            return Cgroups(
                0,
                reason=(
                    f"cannot enable memory and pids for cgroups in {here} ({error.strerror}: "
                    "another process is in the grader's cgroup)"
                ),
            )
    if not _trial(here, ["memory.max", "pids.max", "cgroup.procs"]):
        return Cgroups(0, reason=f"cannot make a cgroup with memory.max and pids.max in {here}")
    return Cgroups(2, {"memory": str(here), "pids": str(here)})


def _v1(mounts: dict[str, str], own: dict[str, str]) -> Cgroups:
    parents = {}
    for controller, files in (("memory", ["memory.limit_in_bytes"]), ("pids", ["pids.max"])):
        if controller not in mounts or controller not in own:
            return Cgroups(0, reason=f"no cgroup v1 {controller} hierarchy")
        here = Path(mounts[controller]) / own[controller].lstrip("/")
        if not _trial(here, [*files, "cgroup.procs"]):
            return Cgroups(0, reason=f"the grader may not make cgroups in {here} (run it as root)")
        parents[controller] = str(here)
    # processor time: counted where the grader may make groups
    if "cpuacct" in mounts and "cpuacct" in own:
        here = Path(mounts["cpuacct"]) / own["cpuacct"].lstrip("/")
        if _trial(here, ["cpuacct.usage", "cgroup.procs"]):
            parents["cpuacct"] = str(here)
    return Cgroups(1, parents)


@lru_cache(maxsize=1)
def find() -> Cgroups:
    """Decide, once per process, which cgroups the grader uses.

    cgroup v2 where the grader's own cgroup offers ``memory`` and ``pids`` and the grader may write
    there (a systemd unit with ``Delegate=yes``, a container's cgroup namespace): a cgroup with
    processes cannot hand controllers to its children, so the grader first moves itself into a leaf
    ``course-grader``, and each sandbox's cgroup goes beside it (``memory.max``, ``memory.swap.max``
    0, ``pids.max``). Else cgroup v1 where it can write in its ``memory`` and ``pids`` cgroups
    (``memory.limit_in_bytes``, ``memory.memsw.*`` where swap is counted, ``pids.max``, and
    ``cpuacct`` where it may make groups there too). Else none (version 0), with the reason for the
    report. Either way a submission gets the same score: the runner reads the counters
    (:meth:`Group.oom_kills`, :meth:`Group.refused_forks`) and ends the sandbox with the note the
    watch would give.
    """
    if not Path("/proc/self/cgroup").exists():
        return Cgroups(0, reason="no cgroups on this system")
    mounts, own = _mounts(), _own()
    v2 = next((point for point, kind, _ in mounts if kind == "cgroup2"), None)
    tried = ""
    if v2 is not None and "" in own:
        found = _v2(v2, own[""])
        if found.version:
            return found
        tried = found.reason + "; "
    v1 = {
        controller: point
        for point, kind, options in mounts
        if kind == "cgroup"
        for controller in options & {"memory", "pids", "cpuacct"}
    }
    found = _v1(v1, own)
    return found if found.version else Cgroups(0, reason=tried + found.reason)


@dataclass
class Group:
    """One sandbox's cgroup (a folder per controller with v1, one folder with v2)."""

    version: int
    folders: list[Path]

    @classmethod
    def create(cls, cgroups: Cgroups, memory_mib: int, max_processes: int) -> "Group | None":
        """A new cgroup under what :func:`find` decided, with the limits written (0: no limit); None
        without."""
        if not cgroups.version:
            return None
        name = f"{PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
        parents = sorted(set(cgroups.parents.values()))
        group = cls(cgroups.version, [Path(parent) / name for parent in parents])
        for folder in group.folders:
            folder.mkdir()
        memory = str(memory_mib << 20) if memory_mib else "max"
        if group.version == 2:
            group._write("memory.max", memory)
            group._write("memory.swap.max", "0", optional=True)
            group._write("pids.max", str(max_processes) if max_processes else "max")
        else:
            if memory_mib:
                group._write("memory.limit_in_bytes", memory)
                group._write("memory.memsw.limit_in_bytes", memory, optional=True)
            if max_processes:
                group._write("pids.max", str(max_processes))
        return group

    def _write(self, name: str, value: str, optional: bool = False) -> None:
        """Write ``value`` to the file ``name`` of whichever folder has it (with v1, a controller's
        own)."""
        written = False
        for folder in self.folders:
            if (folder / name).exists():
                (folder / name).write_text(value)
                written = True
        if not written and not optional:
            raise OSError(f"no {name} in {', '.join(map(str, self.folders))}")

    @property
    def joins(self) -> list[str]:
        """The files a process writes its pid to, to join this cgroup (before it starts any
        other)."""
        return [str(folder / "cgroup.procs") for folder in self.folders]

    def _counter(self, file: str, key: str) -> int:
        for folder in self.folders:
            try:
                lines = (folder / file).read_text().splitlines()
            except OSError:
                continue
            for line in lines:
                name, _, value = line.partition(" ")
                if name == key and value.strip().isdigit():
                    return int(value)
        return 0

    def cpu_s(self) -> float | None:
        """The processor time every process that was ever in this cgroup has used, in seconds,
        reaped or not: Linux counts it as it runs, and no process of the sandbox can leave its
        cgroup. None where this cgroup does not count it (v1 without ``cpuacct``)."""
        if self.version == 2:
            used = self._counter("cpu.stat", "usage_usec")
            return (
                used / 1e6
                if any((folder / "cpu.stat").exists() for folder in self.folders)
                else None
            )
        for folder in self.folders:
            try:
                return int((folder / "cpuacct.usage").read_text()) / 1e9
            except (OSError, ValueError):
                continue
        return None

    def oom_kills(self) -> int:
        """How many processes Linux's out-of-memory killer ended in this cgroup."""
        return self._counter(
            "memory.events" if self.version == 2 else "memory.oom_control", "oom_kill"
        )

    def refused_forks(self) -> int:
        """How many forks or new threads failed at the process limit."""
        return self._counter("pids.events", "max")

    def remove(self, timeout_s: float = 5.0) -> None:
        """Kill what is left in the cgroup, then remove it."""
        deadline = time.monotonic() + timeout_s
        for folder in self.folders:
            while folder.exists():
                try:
                    pids = [int(p) for p in (folder / "cgroup.procs").read_text().split()]
                except OSError:
                    pids = []
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
                try:
                    folder.rmdir()
                except OSError:
                    if time.monotonic() > deadline:
                        break
                    time.sleep(0.05)


def sweep(cgroups: Cgroups) -> list[str]:
    """Remove the sandboxes' cgroups whose runner is gone (a runner killed outright cannot remove
    its own); return their folders. Called when a grading run starts and when it ends."""
    removed = []
    for parent in sorted(set(cgroups.parents.values())):
        for folder in Path(parent).glob(PREFIX + "*"):
            runner = folder.name[len(PREFIX) :].split("-", 1)[0]
            if runner.isdigit() and not Path(f"/proc/{runner}").exists():
                Group(cgroups.version, [folder]).remove(timeout_s=1.0)
                if not folder.exists():
                    removed.append(str(folder))
    return removed
