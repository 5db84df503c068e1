"""Start a student's kernel in a sandbox: its own working copy, no network, limits.

The grader (``autograder.grade``) runs every submitted notebook in a fresh
kernel started through :func:`wrap`. What the kernel gets depends on what
the machine allows, and :class:`Isolation` says which limits hold, so the
report can say so:

* always: a process of its own with a memory limit on every process it
  starts (``RLIMIT_DATA``: an allocation past it fails with PyTorch's
  ``DefaultCPUAllocator: can't allocate memory``) and a cap on the number of
  processes; the grader enforces the wall-time limit by killing it;
* on Linux, where ``unshare`` works: new mount, network and PID namespaces.
  Every top-level folder but the system's (so the course folder, the grading
  folder with the sources, hidden tests, gradebook and other students' work,
  the submissions, home folders, ``/tmp`` and ``/dev/shm``) is replaced by an
  empty folder; the Python environment and the ``devcourse`` package come
  back read-only, the student's own working copy read-write. The network has
  a loopback device only (enough for ``torchrun`` on one machine), and when
  the kernel ends every process it started ends with it. A grader running as
  root (a container, a CI machine, a GPU box) runs the kernel as ``nobody``;
  any other grader gets the same namespaces inside a user namespace of its
  own, where the kernel keeps the grader's user id but no capabilities, so it
  can neither undo the mounts nor write what the grader's user could not.
  Where neither works (macOS, Windows, a Linux that forbids unprivileged user
  namespaces) only the first point holds, and the report says so.

GPUs stay visible in the sandbox (``/dev`` is untouched), so on a GPU box the
device matrix includes CUDA.

A kernel never outlives the grading that started it. The sandbox is three
processes: the *launcher* (this script, started by the runner), which enters
the namespaces itself (``unshare(2)``, no util-linux ``unshare``, which
ignores SIGTERM) and forks the namespace's *init*, which forks the *kernel*.
On Linux each asks the kernel for a parent-death signal (``PR_SET_PDEATHSIG``),
so the chain holds whatever ends the grader, SIGKILL included: the runner
dies with the grader, the launcher with the runner, the init with the
launcher, and when the init of a PID namespace ends, Linux kills every
process in it. SIGTERM or SIGHUP to the launcher, the init or the kernel ends
the whole sandbox too. Without namespaces the launcher forks the kernel into
a process group of its own and kills that group when it is told to end or
its parent dies.

``python autograder/sandbox.py SPEC.json PARENT_PID -- COMMAND...`` is the launcher
(it needs only the standard library): :func:`wrap` puts it in the kernel's command line.
``python autograder/sandbox.py --tether PARENT_PID SIGNAL [--as UID:GID] -- COMMAND...`` only ties
``COMMAND`` to ``PARENT_PID`` and runs it in its place (:func:`tethered`); servers
that tests start use it.
"""

from __future__ import annotations

import ctypes
import fcntl
import json
import os
import resource
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

NOBODY = 65534
FILE_LIMIT_MIB = 1024  # the largest file a kernel may write (RLIMIT_FSIZE); the course's own files are a few MiB
DISK_LIMIT_MIB = 2048  # all a submission writes, its working copy, /tmp and /dev/shm together (a tmpfs of this size)
MAX_PROCESSES = 1024  # processes and threads of one submission together (the course needs fewer than 100)
# Every sandbox's kernel runs as nobody under a root grader: RLIMIT_NPROC, which counts every process and thread
# of that user, is only a backstop for the whole machine; each sandbox's own count is MAX_PROCESSES.
ALL_SANDBOXES_TASKS = 16384
_RESERVED_PIDS = 300  # a PID namespace hands out numbers from here up to pid_max once it has wrapped around
# Top-level folders the kernel keeps seeing; every other one (home folders, /work, /srv, /opt, /var,
# /run, /tmp ...) is replaced by an empty folder, so no other copy of the course is readable either.
SYSTEM = {"usr", "lib", "lib32", "lib64", "libx32", "bin", "sbin", "etc", "dev", "proc", "sys"}


@dataclass(frozen=True)
class Isolation:
    """Which limits the sandbox enforces on this machine, and why not the others."""

    namespaces: bool
    reason: str = ""
    user_namespace: bool = False  # True: a grader that is not root, in a user namespace of its own

    def describe(self, memory_mib: int, time_limit_s: float, cell_timeout_s: float,
                 disk_mib: int = DISK_LIMIT_MIB, max_processes: int = MAX_PROCESSES) -> list[str]:
        memory = (f"{memory_mib} MiB per process (RLIMIT_DATA) and for all of a submission's processes together "
                  "(watched by the grader, Linux)" if memory_mib else "off (--memory-limit-mib 0)")
        lines = [
            f"wall time: enforced, {cell_timeout_s:g} s per cell and {time_limit_s:g} s per notebook (kernel killed)",
            f"memory: enforced, {memory}",
        ]
        file_limit = f"each file at most {FILE_LIMIT_MIB} MiB (RLIMIT_FSIZE)"
        if self.namespaces and disk_mib:
            lines.append(f"disk: enforced, {disk_mib} MiB for all it writes together (working copy, /tmp and /dev/shm "
                         f"on one tmpfs of that size, in memory, gone with the kernel), {file_limit}")
        else:
            why = "--disk-limit-mib 0" if self.namespaces else self.reason
            lines.append(f"disk: {file_limit}; all it writes together NOT bounded ({why}); the working copy is "
                         "removed once graded (unless --keep-work)")
        if self.namespaces:
            who = ("in a user namespace, without capabilities" if self.user_namespace else "runs as nobody")
            count = (f"at most {max_processes} processes and threads together (counted by the grader"
                     f"{', and the PID namespace' + chr(39) + 's pid_max' if per_namespace_pid_max() else ''}), "
                     if max_processes else "")
            lines += [
                "network: enforced, loopback only (network namespace)",
                "files: enforced, own working copy only; Python environment and devcourse read-only "
                f"(mount namespace, {who})",
                f"processes: enforced, {count}all killed with the kernel (PID namespace)",
            ]
        else:
            lines += [
                f"network: NOT enforced ({self.reason})",
                f"files: NOT enforced ({self.reason})",
                "processes: " + (f"at most {max_processes} processes and threads together (counted by the grader), "
                                 if max_processes else "") + "kernel's process group killed at the end",
            ]
        return lines


def per_namespace_pid_max() -> bool:
    """Whether this Linux keeps a ``pid_max`` per PID namespace (6.14 and later), so a sandbox can have its own."""
    if sys.platform != "linux":
        return False
    try:
        major, minor = (int(part) for part in os.uname().release.split(".")[:2])
    except ValueError:
        return False
    return (major, minor) >= (6, 14)


@lru_cache(maxsize=2)
def probe(user_namespace: bool | None = None) -> Isolation:
    """Find out once whether this machine lets the grader use namespaces, by starting an empty sandbox.

    ``user_namespace`` None: inside a user namespace unless the grader is root; True or False forces it.
    """
    if sys.platform != "linux":
        return Isolation(False, f"namespaces need Linux, this is {sys.platform}")
    if shutil.which("mount") is None:
        return Isolation(False, "util-linux's mount is not installed")
    if user_namespace is None:
        user_namespace = os.geteuid() != 0
    with tempfile.TemporaryDirectory(prefix="sandbox-probe-") as folder:
        spec = Spec(workdir="/", namespaces=True, user_namespace=user_namespace, read_only=python_paths())
        spec_path = spec.write(Path(folder) / "spec.json")
        try:
            done = subprocess.run(wrap(["true"], spec_path), capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as error:
            return Isolation(False, f"unshare failed: {error}")
    if done.returncode != 0:
        error = last_line(done.stderr) or f"exit {done.returncode}"
        if user_namespace:
            return Isolation(False, f"this Linux does not let a user other than root use namespaces ({error}); "
                                    "grade as root, e.g. in a container")
        return Isolation(False, f"unshare failed: {error}")
    return Isolation(True, user_namespace=user_namespace)


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
    disk_mib: int = 0  # with namespaces: what the kernel writes goes to a tmpfs of this size (0: to the folders)
    ipc_dir: str = ""  # the kernel's sockets: read-write until the kernel has made them, then sealed (SIGUSR1)
    namespaces: bool = False
    user_namespace: bool = False
    hide: list[str] = field(default_factory=list)
    read_only: list[str] = field(default_factory=list)
    read_write: list[str] = field(default_factory=list)
    uid: int = NOBODY
    gid: int = NOBODY

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


def python_paths() -> list[str]:
    """The folders this Python imports from (environment, site-packages, editable installs)."""
    paths = {sys.prefix, sys.base_prefix}
    paths.update(p for p in sys.path if p and os.path.isdir(p))
    import devcourse

    paths.add(str(Path(devcourse.__file__).resolve().parent))
    return sorted(os.path.realpath(p) for p in paths)


def wrap(command: list[str], spec_path: Path) -> list[str]:
    """The command line that runs ``command`` inside the sandbox described by ``spec_path``.

    The sandbox ends when the process that starts this command line ends (on Linux).
    """
    return [sys.executable, "-I", os.path.realpath(__file__), str(spec_path), str(os.getpid()), "--", *command]


def tethered(command: list[str], signum: int, uid: int | None = None, gid: int | None = None) -> list[str]:
    """The command line that runs ``command`` in its own place, sent ``signum`` when this process ends.

    On Linux the signal comes from the kernel (``PR_SET_PDEATHSIG``), so it comes however this
    process ends, SIGKILL included; elsewhere ``command`` simply runs. ``uid``/``gid`` (a root
    caller): ``command`` runs as that user, who need not be able to read this Python (a change of
    user clears the request, so it is made after the change). Use it rather than a
    ``preexec_fn``, which runs Python between fork and exec and can deadlock in a process with
    threads (a test process, a Jupyter server).
    """
    user = ["--as", f"{uid}:{gid if gid is not None else uid}"] if uid is not None else []
    return [sys.executable, "-I", os.path.realpath(__file__), "--tether", str(os.getpid()), str(int(signum)), *user,
            "--", *command]


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
        sys.exit("usage: python sandbox.py --tether PARENT_PID SIGNAL [--as UID:GID] -- COMMAND...")
    die_with_parent(int(parent), int(signum))
    os.execvp(rest[1], rest[1:])


# ---- the inside half ----------------------------------------------------------


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
    every = sorted({os.path.realpath(p) for p in [*top, *spec["hide"]] if os.path.isdir(p)}, key=len)
    hide = [p for i, p in enumerate(every) if not _under(p, every[:i])]
    disk = spec.get("disk_mib") or 0
    workdir = os.path.realpath(spec["workdir"])
    if disk and ("/tmp" not in hide or not _under(workdir, hide)):
        raise RuntimeError("a bounded disk needs /tmp and a working copy in a folder the sandbox hides")
    keeps = [(os.path.realpath(p), False) for p in spec["read_write"] if not (disk and os.path.realpath(p) == workdir)]
    keeps += [(os.path.realpath(p), True) for p in spec["read_only"]]
    # Only what a hidden folder covers needs bringing back, and never a folder that holds a hidden one.
    keeps = [(p, ro) for p, ro in keeps if os.path.isdir(p) and _under(p, hide)
             and not any(_under(h, [p]) for h in every)]
    keeps = [(p, ro) for i, (p, ro) in enumerate(keeps) if p not in [k for k, _ in keeps[:i]]]
    keeps.sort(key=lambda keep: len(keep[0]))
    # Hold each folder to bring back open, hide, then bind the open folder at its old place: this also
    # works in a user namespace, where mounts copied from the parent namespace cannot be moved.
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
        _run("mount", "-t", "tmpfs", "-o", "ro,size=4k,mode=755,nosuid,nodev", "tmpfs", str(scratch))
    else:
        _run("mount", "-t", "tmpfs", "-o", "mode=1777,nosuid,nodev", "tmpfs", "/dev/shm")
    if disk:  # nothing left to create in them: the folders that hide the machine's take no writes
        for path in hide:
            if path != "/tmp":
                _run("mount", "-o", "remount,ro,nosuid,nodev", path)


def _bind(source: str, path: str, read_only: bool, pass_fds: tuple[int, ...] = ()) -> None:
    _run("mount", "--no-canonicalize", "--bind", source, path, pass_fds=pass_fds)
    if read_only:
        _remount_read_only(path)


def _remount_read_only(path: str) -> None:
    try:
        _run("mount", "-o", "remount,bind,ro", path)
    except subprocess.CalledProcessError:  # a user namespace must keep the flags the mount came with
        _run("mount", "-o", "remount,bind,ro,nosuid,nodev", path)


def _drop_privileges(uid: int, gid: int, user_namespace: bool) -> None:
    """Leave no capability: as ``nobody`` for a root grader, as the grader's own id in a user namespace."""
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
    if spec["memory_mib"]:
        limit = spec["memory_mib"] << 20
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    if spec["namespaces"] and not spec["user_namespace"]:
        # RLIMIT_NPROC counts every process of the user, i.e. of every sandbox: only with the uid of its own.
        resource.setrlimit(resource.RLIMIT_NPROC, (ALL_SANDBOXES_TASKS, ALL_SANDBOXES_TASKS))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if spec.get("max_file_mib"):
        limit = spec["max_file_mib"] << 20
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
        # Python ignores SIGXFSZ, so in the kernel a write past it fails with "File too large" (EFBIG).


_CLONE_NEWNS, _CLONE_NEWUSER, _CLONE_NEWPID, _CLONE_NEWNET = 0x00020000, 0x10000000, 0x20000000, 0x40000000
_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int, signum: int) -> None:
    """Linux: have ``signum`` sent to this process when its parent ends; if it already has, exit now."""
    if sys.platform != "linux":
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signum), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    # It ended before the request took effect? (The init of a PID namespace sees 0: its parent is outside.)
    if os.getppid() not in (parent, 0):
        os._exit(128 + int(signum))


def _enter_namespaces(user_namespace: bool) -> None:
    """Move this process into new mount and network namespaces; its next child starts a PID namespace.

    That child must be the init (:func:`_init`): a first child that exits would end the PID namespace.
    """
    uid, gid = os.geteuid(), os.getegid()
    flags = _CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWPID | (_CLONE_NEWUSER if user_namespace else 0)
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(flags) != 0:
        error = ctypes.get_errno()
        raise OSError(error, f"unshare: {os.strerror(error)}")
    if user_namespace:  # be root in the new user namespace, mapped to the grader's own ids
        Path("/proc/self/setgroups").write_text("deny")
        Path("/proc/self/uid_map").write_text(f"0 {uid} 1")
        Path("/proc/self/gid_map").write_text(f"0 {gid} 1")


def _wait_for(child: int) -> int:
    """Reap children until ``child`` ends (as a PID namespace's init, orphans too); its exit code."""
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 1
        if pid == child:
            return os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 128 + os.WTERMSIG(status)


def _start_kernel(spec: dict, command: list[str], own_group: bool) -> int:
    """Fork the kernel: limits, no capabilities, the working copy, then exec ``command``."""
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
        _limit(spec)
        if spec["namespaces"]:
            _drop_privileges(spec["uid"], spec["gid"], spec["user_namespace"])
        die_with_parent(parent, signal.SIGKILL)  # after the id change, which clears the request
        os.chdir(spec["workdir"])
        # ipykernel exits when its parent looks like init, as the sandbox's PID 1 does; the grader kills it instead.
        os.environ.pop("JPY_PARENT_PID", None)
        os.execvp(command[0], command)
    except BaseException as error:  # noqa: BLE001 - report anything, then leave the child
        print(f"sandbox: cannot start {command[0]}: {error}", file=sys.stderr, flush=True)
    os._exit(127)


def _init(spec: dict, command: list[str]) -> int:
    """PID 1 of the sandbox's namespaces: set up the view, start the kernel, reap until it ends."""
    _run("mount", "--make-rprivate", "/")
    _run("mount", "-t", "proc", "-o", "nosuid,nodev,noexec", "proc", "/proc")
    if spec.get("max_processes") and per_namespace_pid_max():
        # This namespace's own pid_max (never the machine's: only where Linux keeps one per namespace).
        Path("/proc/sys/kernel/pid_max").write_text(str(spec["max_processes"] + _RESERVED_PIDS))
    _mount_view(spec)
    _loopback_up()
    home = Path("/tmp/home")
    home.mkdir(mode=0o700)
    os.chown(home, spec["uid"], spec["gid"])
    kernel = _start_kernel(spec, command, own_group=False)

    def interrupt(signum, _frame):
        try:
            os.kill(kernel, signum)
        except ProcessLookupError:
            pass

    def seal(_signum, _frame):
        """The kernel has made its sockets: from now on it can write nothing in the grader's IPC folder."""
        try:
            if not os.path.ismount(spec["ipc_dir"]):
                _bind(spec["ipc_dir"], spec["ipc_dir"], False)
            _remount_read_only(spec["ipc_dir"])
        except (OSError, subprocess.CalledProcessError) as error:
            print(f"sandbox: cannot seal {spec['ipc_dir']}: {error}", file=sys.stderr, flush=True)

    signal.signal(signal.SIGINT, interrupt)  # Jupyter's interrupt reaches the kernel
    if spec.get("ipc_dir"):
        signal.signal(signal.SIGUSR1, seal)
    for signum in (signal.SIGTERM, signal.SIGHUP):  # the init ending ends every process of the namespace
        signal.signal(signum, lambda signum, _frame: os._exit(128 + signum))
    return _wait_for(kernel)


def launch(spec_path: str, parent: int, command: list[str]) -> int:
    """The launcher: tied to ``parent``, it starts the sandbox and ends it when told to or left alone."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # until the sandbox exists: just go
    die_with_parent(parent, signal.SIGTERM)
    spec = json.loads(Path(spec_path).read_text())
    if spec["namespaces"]:
        try:
            _enter_namespaces(spec["user_namespace"])
        except (OSError, subprocess.CalledProcessError) as error:
            detail = getattr(error, "stderr", "") or ""
            print(f"sandbox: cannot enter namespaces: {error} {detail}".strip(), file=sys.stderr, flush=True)
            return 126
        launcher = os.getpid()
        child = os.fork()
        if child == 0:
            code = 1
            try:
                die_with_parent(launcher, signal.SIGKILL)
                code = _init(spec, command)
            except BaseException as error:  # noqa: BLE001 - report, then end the namespace
                print(f"sandbox: {type(error).__name__}: {error}", file=sys.stderr, flush=True)
            os._exit(code)
    else:
        child = _start_kernel(spec, command, own_group=True)

    def end(signum, _frame):
        try:  # the init's end ends its namespace; without one, the kernel's group goes
            os.kill(child, signal.SIGKILL) if spec["namespaces"] else os.killpg(child, signal.SIGKILL)
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
        sys.exit("usage: python sandbox.py SPEC.json PARENT_PID -- COMMAND...")
    sys.exit(launch(sys.argv[1], int(sys.argv[2]), sys.argv[4:]))
