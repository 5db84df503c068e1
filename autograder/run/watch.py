"""A submission's processes seen from outside its sandbox: memory, count, processor time, the disk
it filled, its IPC.

Read from ``/proc`` on Linux; elsewhere (macOS) the sums read 0 and the sandbox's limits per process
hold alone.
"""

from __future__ import annotations

import functools
import os
import signal
import time
from pathlib import Path

from autograder.inside.launcher import mount_points

# Set by the grader to a token of its run, and passed down to every process of it, kernels
# included: what is left of a run can be found by it (/proc/PID/environ).
RUN_MARKER = "COURSE_GRADING_RUN"


def _stat(pid: int) -> list[str]:
    """The fields of /proc/PID/stat after the command name (state, parent, ...); [] if there is no
    such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def alive(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie (ended, waiting to be reaped)."""
    fields = _stat(pid)
    return bool(fields) and fields[0] != "Z"


def processes_of(value: str, variable: str = RUN_MARKER) -> dict[int, str]:
    """The live processes (zombies left out) whose environment sets ``variable`` to ``value``: pid
    -> command line.

    With the default, what is still running of the grading run whose marker is ``value``.
    """
    found = {}
    wanted = f"{variable}={value}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            environ = Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            command = (
                Path(f"/proc/{entry}/cmdline")
                .read_bytes()
                .replace(b"\0", b" ")
                .decode(errors="replace")
            )
        except OSError:
            continue
        if wanted in environ and alive(int(entry)):
            found[int(entry)] = command.strip()
    return found


def tree_usage(root: int, uncounted: int = 0) -> tuple[float, int]:
    """Process ``root`` and all its descendants together: memory in MiB, and processes and threads.

    Memory is ``RssAnon + RssShmem`` of each, from /proc (Linux; elsewhere 0): what the processes
    hold themselves, not the libraries' file pages, which every process of PyTorch maps and the
    system can drop. The memory of the first ``uncounted`` generations (``root`` is the first) is
    left out, their threads are not: the sandbox's own processes, which run nothing of the
    submission's (its launcher, and with namespaces its init). Forked from the zygote they map its
    pages, torch's included, as the kernel does (:mod:`autograder.run.zygote`), and counted they
    would count those two or three times.
    """
    children = _children if _children_listed() else _children_from_stat()
    total_kib, tasks, todo = 0, 0, [(root, 0)]
    while todo:
        pid, generation = todo.pop()
        todo += [(child, generation + 1) for child in children(pid)]
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith(("RssAnon:", "RssShmem:")) and generation >= uncounted:
                total_kib += int(line.split()[1])
            elif line.startswith("Threads:"):
                tasks += int(line.split()[1])
    return total_kib / 1024, tasks


def tree_cpu_s(root: int) -> float | None:
    """Processor time that process ``root`` and all its descendants have used, in seconds (user and
    system, with what the children each one reaped had used); None where /proc does not show
    ``root`` (it ended; not Linux).

    A process that ends counts once its parent reaps it: in a sandbox with namespaces its init reaps
    every orphan.
    """
    children = _children if _children_listed() else _children_from_stat()
    total, todo, seen_root = 0, [root], False
    while todo:
        pid = todo.pop()
        fields = _stat(pid)
        if not fields:
            continue
        seen_root = seen_root or pid == root
        # utime, stime, cutime, cstime, in clock ticks
        total += sum(int(value) for value in fields[11:15])
        todo += children(pid)
    return total / _TICKS if seen_root else None


_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@functools.lru_cache(maxsize=1)
def cpu_counted() -> bool:
    """Whether this machine shows a process's processor time in /proc (Linux), which the grader's
    limits count."""
    return tree_cpu_s(os.getpid()) is not None


@functools.lru_cache(maxsize=1)
def _children_listed() -> bool:
    """Whether Linux lists each thread's children in /proc (``/proc/PID/task/TID/children``, most
    kernels)."""
    return os.path.exists(f"/proc/{os.getpid()}/task/{os.getpid()}/children")


def _children(pid: int) -> list[int]:
    """The children of process ``pid`` (of every thread of it), read from its own /proc entries
    only."""
    found: list[int] = []
    try:
        threads = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return found
    for thread in threads:
        try:
            found += [
                int(child)
                for child in Path(f"/proc/{pid}/task/{thread}/children").read_text().split()
            ]
        except OSError:  # the thread or the process ended
            continue
    return found


def _children_from_stat():
    """Where Linux does not list children: every process's parent, read from every
    /proc/PID/stat."""
    children: dict[int, list[int]] = {}
    try:
        entries = [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]
    except OSError:
        entries = []
    for pid in entries:
        fields = _stat(pid)
        if fields:
            children.setdefault(int(fields[1]), []).append(pid)
    return lambda pid: children.get(pid, [])


def disk_used_mib(launcher: int, size_mib: int) -> float | None:
    """What a sandbox with a disk of ``size_mib`` holds on it (its ``/tmp`` tmpfs), in MiB; None
    where it cannot be read.

    Also None while ``/tmp`` seen from the launcher is not a disk of that size: before the sandbox
    has mounted its own, the path leads to the grader's ``/tmp``, whose use is not the submission's.
    """
    try:
        found = os.statvfs(f"/proc/{launcher}/root/tmp")
    except OSError:
        return None
    if abs(found.f_blocks * found.f_frsize / (1 << 20) - size_mib) > 1:
        return None
    return (found.f_blocks - found.f_bfree) * found.f_frsize / (1 << 20)


def seal_ipc(launcher: int, ipc_dir: str, timeout_s: float = 10.0) -> None:
    """Have the sandbox make the kernel's IPC folder read-only for it, and wait until its mount says
    so.

    Called once the kernel has made its sockets (it answered), before any code of the submission
    runs.
    """
    os.kill(launcher, signal.SIGUSR1)
    target = os.path.realpath(ipc_dir)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            mounts = mount_points(launcher)
        except OSError:
            break
        if any(point == target and "ro" in options for point, options in mounts):
            return
        time.sleep(0.02)
    raise RuntimeError(
        f"the sandbox did not seal the kernel's IPC folder {ipc_dir} within {timeout_s:g} s"
    )
