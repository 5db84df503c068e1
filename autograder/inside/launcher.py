"""The inside half of the sandbox: the launcher, the namespace's init and the kernel's start.

It runs as a script with ``python -I`` before the kernel exists, so it is one file of the standard
library alone (what it is given and enforces: :mod:`autograder.run.sandbox`). ``launcher.py
SPEC.json PARENT_PID -- COMMAND...`` is the launcher (:func:`launch`, from
:func:`autograder.run.sandbox.wrap`); ``launcher.py --tether PARENT_PID SIGNAL [--as UID:GID] --
COMMAND...`` only ties ``COMMAND`` to ``PARENT_PID`` and runs it in its place.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import json
import os
import re
import select
import shutil
import signal
import socket
import struct
import subprocess
import sys
from pathlib import Path

# Every sandbox's kernel runs as nobody under a root grader: RLIMIT_NPROC, which counts every
# process and thread of that user, is only a backstop for the whole machine; each sandbox's own
# count is MAX_PROCESSES.
ALL_SANDBOXES_TASKS = 16384
# a PID namespace hands out numbers from here up to pid_max once it has wrapped around
_RESERVED_PIDS = 300
# Top-level folders the kernel keeps seeing; every other one (home folders, /work, /srv, /opt, /var,
# /run, /tmp ...) is replaced by an empty folder, so no other copy of the course is readable either.
SYSTEM = {"usr", "lib", "lib32", "lib64", "libx32", "bin", "sbin", "etc", "dev", "proc", "sys"}


def per_namespace_pid_max() -> bool:
    """Whether this Linux keeps a ``pid_max`` per PID namespace (6.14 and later), so a sandbox can
    have its own."""
    release = re.match(r"(\d+)\.(\d+)", os.uname().release) if sys.platform == "linux" else None
    return bool(release) and (int(release[1]), int(release[2])) >= (6, 14)


def _tether(args: list[str]) -> None:
    """``PARENT SIGNAL [--as UID:GID] -- COMMAND...``: see :func:`tethered`."""
    parent, signum, rest = args[0], args[1], args[2:]
    if rest[:1] == ["--as"]:
        uid, gid = (int(part) for part in rest[1].split(":"))
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
        rest = rest[2:]
    if not (parent.isdigit() and signum.isdigit()) or rest[:1] != ["--"] or len(rest) < 2:
        sys.exit(
            "usage: python launcher.py --tether PARENT_PID SIGNAL [--as UID:GID] -- COMMAND..."
        )
    die_with_parent(int(parent), int(signum))
    os.execvp(rest[1], rest[1:])


def _run(*args: str, pass_fds: tuple[int, ...] = ()) -> None:
    subprocess.run(args, check=True, capture_output=True, text=True, pass_fds=pass_fds)


def _loopback_up() -> None:
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH22x", b"lo", 0)
        flags = struct.unpack("16sH22x", fcntl.ioctl(sock, siocgifflags, request))[1]
        fcntl.ioctl(sock, siocsifflags, struct.pack("16sH22x", b"lo", flags | iff_up))


def _under(path: str, parents: list[str]) -> bool:
    return any(path == p or path.startswith(p.rstrip("/") + "/") for p in parents)


def _mount_view(spec: dict) -> None:
    """Hide ``spec['hide']`` behind empty tmpfs folders, then bring back what the kernel may see.

    With ``spec['disk_mib']`` every place the kernel can write is on one tmpfs of that size, mounted
    at ``/tmp``: a copy of its working copy (bound at the working copy's path, so the folder it
    grades in keeps its name; the grader's copy is never written), its home, and ``/dev/shm``. The
    other empty folders that hide the machine's are made read-only.
    """
    top = [os.path.join("/", name) for name in os.listdir("/") if name not in SYSTEM]
    top = [p for p in top if os.path.isdir(p) and not os.path.islink(p)]
    every = sorted(
        {os.path.realpath(p) for p in [*top, *spec["hide"]] if os.path.isdir(p)}, key=len
    )
    hide = [p for i, p in enumerate(every) if not _under(p, every[:i])]
    disk = spec.get("disk_mib") or 0
    workdir = os.path.realpath(spec["workdir"])
    if disk and ("/tmp" not in hide or not _under(workdir, hide)):
        raise RuntimeError(
            "a bounded disk needs /tmp and a working copy in a folder the sandbox hides"
        )
    keeps = [
        (os.path.realpath(p), False)
        for p in spec["read_write"]
        if not (disk and os.path.realpath(p) == workdir)
    ]
    keeps += [(os.path.realpath(p), True) for p in spec["read_only"]]
    # Only what a hidden folder covers needs bringing back, and never a folder that holds a hidden
    # one.
    keeps = [
        (p, ro)
        for p, ro in keeps
        if os.path.isdir(p) and _under(p, hide) and not any(_under(h, [p]) for h in every)
    ]
    keeps = [(p, ro) for i, (p, ro) in enumerate(keeps) if p not in [k for k, _ in keeps[:i]]]
    keeps.sort(key=lambda keep: len(keep[0]))
    # Hold each folder to bring back open, hide, then bind the open folder at its old place: this
    # also works in a user namespace, where mounts copied from the parent namespace cannot be moved.
    handles = [os.open(path, os.O_PATH | os.O_DIRECTORY) for path, _ in keeps]
    work_handle = os.open(workdir, os.O_RDONLY | os.O_DIRECTORY) if disk else None
    for path in hide:
        mode = "1777" if path in ("/tmp", "/dev/shm") else "755"
        size = f",size={disk}m" if disk and path == "/tmp" else ""
        _run("mount", "-t", "tmpfs", "-o", f"mode={mode},nosuid,nodev{size}", "tmpfs", path)
    for handle, (path, read_only) in zip(handles, keeps):
        os.makedirs(path, exist_ok=True)
        _bind(f"/proc/self/fd/{handle}", path, read_only, pass_fds=(handle,))
        os.close(handle)
    if disk:
        scratch = Path("/tmp/.sandbox")
        shutil.copytree(f"/proc/self/fd/{work_handle}", scratch / "work", symlinks=True)
        os.close(work_handle)
        (scratch / "shm").mkdir(mode=0o1777)
        os.chmod(scratch / "shm", 0o1777)
        for folder, _, files in os.walk(scratch):
            for name in [folder, *(os.path.join(folder, f) for f in files)]:
                os.lchown(name, spec["uid"], spec["gid"])
        os.makedirs(workdir, exist_ok=True)
        _bind(str(scratch / "work"), workdir, False)
        _bind(str(scratch / "shm"), "/dev/shm", False)
        # The binds keep what they show; covered, the staging folder shows no second path to them.
        _run(
            "mount", "-t", "tmpfs", "-o", "ro,size=4k,mode=755,nosuid,nodev", "tmpfs", str(scratch)
        )
    else:
        _run("mount", "-t", "tmpfs", "-o", "mode=1777,nosuid,nodev", "tmpfs", "/dev/shm")
    if disk:  # nothing left to create in them: the folders that hide the machine's take no writes
        for path in hide:
            if path != "/tmp":
                # Read-only as a mount, not as a filesystem: a grader that is not root, in a user
                # namespace, may not remount its own tmpfs (util-linux passes back the owner's uid,
                # which the namespace does not map), and this mount is the one way to it.
                _remount_read_only(path)


def _bind(source: str, path: str, read_only: bool, pass_fds: tuple[int, ...] = ()) -> None:
    try:
        _run("mount", "--no-canonicalize", "--bind", source, path, pass_fds=pass_fds)
    except subprocess.CalledProcessError:
        # In a user namespace, a folder holding a mount of the parent namespace's (a Slurm node's
        # tmpfs under the course, say) binds only with that mount, which may not be uncovered: bound
        # recursively, each read-only.
        _run("mount", "--no-canonicalize", "--rbind", source, path, pass_fds=pass_fds)
        if read_only:
            for below in _mounts_below(path):
                _remount_read_only(below)
    if read_only:
        _remount_read_only(path)


def mount_points(pid: int | str = "self") -> list[tuple[str, set[str]]]:
    """(mount point, its mount options) of every mount in the mount namespace of process ``pid``
    (``/proc/PID/mountinfo``), each point as a path: the kernel's octal escapes (a space is
    ``\\040``) undone. Raises ``OSError`` where that file cannot be read."""
    with open(f"/proc/{pid}/mountinfo") as mounts:
        rows = [line.split() for line in mounts.read().splitlines()]
    return [
        (
            re.sub(r"\\([0-7]{3})", lambda octal: chr(int(octal.group(1), 8)), fields[4]),
            set(fields[5].split(",")),
        )
        for fields in rows
        if len(fields) > 5
    ]


def _mounts_below(path: str) -> list[str]:
    """The mount points strictly below ``path`` in this mount namespace."""
    return [point for point, _ in mount_points() if point != path and _under(point, [path])]


def _remount_read_only(path: str) -> None:
    try:
        _run("mount", "-o", "remount,bind,ro", path)
    except subprocess.CalledProcessError:
        # a user namespace must keep the flags the mount came with
        _run("mount", "-o", "remount,bind,ro,nosuid,nodev", path)


def _drop_privileges(uid: int, gid: int, user_namespace: bool) -> None:
    """Leave no capability: as ``nobody`` for a root grader, as the grader's own id in a user
    namespace."""
    libc = ctypes.CDLL(None, use_errno=True)
    pr_capbset_drop, pr_set_no_new_privs = 24, 38
    for cap in range(64):
        libc.prctl(pr_capbset_drop, cap, 0, 0, 0)
    if user_namespace:
        # Still id 0 in the namespace: clear every capability set (capset, version 3), and with
        # an empty bounding set no program it runs gets one back.
        header = (ctypes.c_uint32 * 2)(0x20080522, 0)
        data = (ctypes.c_uint32 * 6)()
        if libc.capset(header, data) != 0:
            raise OSError(ctypes.get_errno(), "capset failed")
    else:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)
    if libc.prctl(pr_set_no_new_privs, 1, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS) failed")


def _limit(spec: dict) -> None:
    # here: a kernel forked by the zygote gets no module a fresh one would not have (see there)
    import resource

    if spec["memory_mib"]:
        limit = spec["memory_mib"] << 20
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    if spec["namespaces"] and not spec["user_namespace"]:
        # RLIMIT_NPROC counts every process of the user, i.e. of every sandbox: only with the uid of
        # its own.
        resource.setrlimit(resource.RLIMIT_NPROC, (ALL_SANDBOXES_TASKS, ALL_SANDBOXES_TASKS))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if spec.get("max_file_mib"):
        limit = spec["max_file_mib"] << 20
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        # Python ignores SIGXFSZ, so in the kernel a write past it fails with "File too large"
        # (EFBIG).


# CLONE_NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWNET, NEWPID: what a container runtime unshares by
# default. System V IPC and POSIX message queues go with the IPC namespace's last process: none of a
# kernel's outlives it or reaches another.
_NAMESPACES, _CLONE_NEWUSER = (
    0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x40000000 | 0x20000000,
    0x10000000,
)
_PR_SET_PDEATHSIG = 1
# Where a process of the sandbox asks its init for a process made as the kernel was
# (autograder.run.forkclient): an abstract socket, of the sandbox's own network namespace.
SPARE_SOCKET = "\0autograder-spare"


def die_with_parent(parent: int, signum: int) -> None:
    """Linux: have ``signum`` sent to this process when its parent ends; if it already has, exit
    now."""
    if sys.platform != "linux":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    # It ended before the request took effect? (The init of a PID namespace sees 0: its parent is
    # outside.)
    if os.getppid() not in (parent, 0):
        os._exit(128 + int(signum))


def _enter_namespaces(user_namespace: bool) -> None:
    """Move this process into new mount, network, IPC, host-name and cgroup namespaces; its next
    child starts a PID namespace.

    That child must be the init (:func:`_init`): a first child that exits would end the PID
    namespace.
    """
    uid, gid = os.geteuid(), os.getegid()
    flags = _NAMESPACES | (_CLONE_NEWUSER if user_namespace else 0)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(flags) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"unshare: {os.strerror(error)}")
    if user_namespace:  # be root in the new user namespace, mapped to the grader's own ids
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"0 {uid} 1")
        Path("/proc/self/gid_map").write_text(f"0 {gid} 1")


def _wait_for(child: int) -> int:
    """Reap children until ``child`` ends (as a PID namespace's init, orphans too); its exit
    code."""
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 1
        if pid == child:
            return _exit_code(status)


def _exit_code(status: int) -> int:
    return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def _as_the_kernel(spec: dict, parent: int) -> None:
    """In a child of ``parent``: the kernel's limits, no capabilities, death with ``parent``, the
    working copy."""
    _limit(spec)
    if spec["namespaces"]:
        _drop_privileges(spec["uid"], spec["gid"], spec["user_namespace"])
    die_with_parent(parent, signal.SIGKILL)  # after the id change, which clears the request
    os.chdir(spec["workdir"])


def _start_kernel(
    spec: dict, command: list[str], own_group: bool, start=None, listener=None
) -> int:
    """Fork the kernel: limits, no capabilities, the working copy, then exec ``command``.

    ``start`` (a launcher forked by :mod:`autograder.run.zygote`): called with ``command`` in place
    of the exec, it runs the kernel in the forked process, which ends by SystemExit (up the stack)
    and never returns.
    """
    parent = os.getpid()
    child = os.fork()
    if child:
        if own_group:
            try:  # here too, so that the group exists whichever of the two runs first
                os.setpgid(child, child)
            except OSError:
                pass
        return child
    try:
        if own_group:
            os.setpgid(0, 0)
        if listener is not None:
            listener.close()
        _as_the_kernel(spec, parent)
        # ipykernel exits when its parent looks like init, as the sandbox's PID 1 does; the grader
        # kills it instead.
        os.environ.pop("JPY_PARENT_PID", None)
        if start is not None:
            start(command)
        os.execvp(command[0], command)
    except Exception as error:  # noqa: BLE001 - report, then leave the child; a kernel run by start ends by SystemExit
        print(f"sandbox: cannot start {command[0]}: {error}", file=sys.stderr, flush=True)
    os._exit(127)


def _init(spec: dict, command: list[str], start=None, spare=None) -> int:
    """PID 1 of the sandbox's namespaces: set up the view, start the kernel, reap until it ends.

    With ``spare`` (a launcher forked warm, see :func:`launch`), it also forks a process for each
    connection to :data:`SPARE_SOCKET`, made as the kernel is made, that runs ``spare(connection)``.
    """
    _run("mount", "--make-rprivate", "/")
    _run("mount", "-t", "proc", "-o", "nosuid,nodev,noexec", "proc", "/proc")
    if spec.get("max_processes") and per_namespace_pid_max():
        # This namespace's own pid_max (never the machine's: only where Linux keeps one per
        # namespace).
        Path("/proc/sys/kernel/pid_max").write_text(str(spec["max_processes"] + _RESERVED_PIDS))
    _mount_view(spec)
    _loopback_up()
    # not the machine's; gloo and others resolve it (/etc/hosts) to loopback
    socket.sethostname("localhost")
    home = Path("/tmp/home")
    home.mkdir(mode=0o700)
    os.chown(home, spec["uid"], spec["gid"])
    listener = None
    if spare is not None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        listener.bind(SPARE_SOCKET)
        listener.listen()
    kernel = _start_kernel(spec, command, own_group=False, start=start, listener=listener)

    def interrupt(signum, _frame):
        try:
            os.kill(kernel, signum)
        except ProcessLookupError:
            pass

    def seal(_signum, _frame):
        """The kernel has made its sockets: from now on it can write nothing in the grader's IPC
        folder."""
        try:
            if not os.path.ismount(spec["ipc_dir"]):
                _bind(spec["ipc_dir"], spec["ipc_dir"], False)
            _remount_read_only(spec["ipc_dir"])
        except (OSError, subprocess.CalledProcessError) as error:
            print(f"sandbox: cannot seal {spec['ipc_dir']}: {error}", file=sys.stderr, flush=True)

    signal.signal(signal.SIGINT, interrupt)  # Jupyter's interrupt reaches the kernel
    if spec.get("ipc_dir"):
        signal.signal(signal.SIGUSR1, seal)
    # the init ending ends every process of the namespace
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, lambda signum, _frame: os._exit(128 + signum))
    if listener is None:
        return _wait_for(kernel)
    return _wait_and_serve(kernel, listener, lambda conn: _spare(spec, conn, spare))


def _wait_and_serve(kernel: int, listener: socket.socket, serve) -> int:
    """:func:`_wait_for`, and meanwhile a child per connection to ``listener`` that runs
    ``serve(connection)``; the init reads nothing of what a connection sends."""
    wake_read, wake_write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.signal(signal.SIGCHLD, lambda _signum, _frame: None)
    signal.set_wakeup_fd(wake_write)  # a child's end wakes the poll below
    poller = select.poll()
    poller.register(listener, select.POLLIN)
    poller.register(wake_read, select.POLLIN)
    while True:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return 1
            if pid == 0:
                break
            if pid == kernel:
                return _exit_code(status)
        for fd, _ in poller.poll():
            if fd == wake_read:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_read, 4096)
                continue
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            try:
                if os.fork() == 0:
                    signal.set_wakeup_fd(-1)
                    for end in (wake_read, wake_write):
                        os.close(end)
                    listener.close()
                    serve(conn)
            except OSError:  # no process to spare (the sandbox's limit): the caller starts one
                pass
            conn.close()


def _spare(spec: dict, conn: socket.socket, run) -> None:
    """In a child of the init: made as the kernel is (:func:`_as_the_kernel`), then ``run(conn)``;
    it ends there (its own children end at the top of the stack, as the kernel's do)."""
    try:
        _as_the_kernel(spec, 1)
        run(conn)
    except Exception as error:  # noqa: BLE001 - report; the caller starts a process itself
        print(f"sandbox: cannot start a process server: {error}", file=sys.stderr, flush=True)
    os._exit(1)


def join_cgroups(paths: list[str]) -> None:
    """Put this process into the cgroups whose ``cgroup.procs`` files are ``paths``; what it starts
    later is in them too (:mod:`autograder.run.cgroups`)."""
    for path in paths:
        with open(path, "w") as handle:
            handle.write(str(os.getpid()))


def launch(spec_path: str, parent: int, command: list[str], start=None, spare=None) -> int:
    """The launcher: tied to ``parent``, it starts the sandbox and ends it when told to or left
    alone.

    ``start``: how the kernel runs ``command`` once forked (see :func:`_start_kernel`); None: exec.
    ``spare``: what a process the init forks for a caller in the sandbox runs (see :func:`_init`);
    only for a launcher forked warm, whose init holds what the kernel was forked with.

    The sandbox is three processes, each ended with its parent by a parent-death signal on Linux:
    the launcher enters the namespaces itself (``unshare(2)``) and forks the namespace's init, which
    forks the kernel; when the init of a PID namespace ends, Linux kills every process in it.
    Without namespaces the launcher forks the kernel into a process group of its own and kills that
    group when told to end or its parent dies.
    """
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # until the sandbox exists: just go
    die_with_parent(parent, signal.SIGTERM)
    spec = json.loads(Path(spec_path).read_text())
    try:  # first: every process of the sandbox is in its cgroup
        join_cgroups(spec.get("cgroup_procs", []))
    except OSError as error:
        print(f"sandbox: cannot join its cgroup: {error}", file=sys.stderr, flush=True)
        return 126
    if spec["namespaces"]:
        try:
            _enter_namespaces(spec["user_namespace"])
        except (OSError, subprocess.CalledProcessError) as error:
            detail = getattr(error, "stderr", "") or ""
            print(
                f"sandbox: cannot enter namespaces: {error} {detail}".strip(),
                file=sys.stderr,
                flush=True,
            )
            return 126
        launcher = os.getpid()
        child = os.fork()
        if child == 0:
            code = 1
            try:
                die_with_parent(launcher, signal.SIGKILL)
                code = _init(spec, command, start, spare)
            except Exception as error:  # noqa: BLE001 - report, then end the namespace (the kernel's SystemExit goes up)
                print(f"sandbox: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
            os._exit(code)
    else:
        child = _start_kernel(spec, command, own_group=True, start=start)

    def end(signum, _frame):
        try:  # the init's end ends its namespace; without one, the kernel's group goes
            (
                os.kill(child, signal.SIGKILL)
                if spec["namespaces"]
                else os.killpg(child, signal.SIGKILL)
            )
        except ProcessLookupError:
            pass
        os._exit(128 + signum)

    def interrupt(signum, _frame):
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGINT, interrupt)
    if spec["namespaces"]:
        signal.signal(signal.SIGUSR1, interrupt)  # "seal the IPC folder", for the init
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, end)
    code = _wait_for(child)
    if not spec["namespaces"]:  # what the kernel started in its group goes with it
        try:
            os.killpg(child, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return code


if __name__ == "__main__":
    if sys.argv[1:2] == ["--tether"] and len(sys.argv) > 3:
        _tether(sys.argv[2:])
    if len(sys.argv) < 5 or sys.argv[3] != "--" or not sys.argv[2].isdigit():
        sys.exit("usage: python launcher.py SPEC.json PARENT_PID -- COMMAND...")
    sys.exit(launch(sys.argv[1], int(sys.argv[2]), sys.argv[4:]))
