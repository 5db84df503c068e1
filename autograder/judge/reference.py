"""Before a class is graded, the instructor's solution runs in the same sandbox: the canary and the
reference.

The canary stops grading before any student is graded unless every test of the solution passes (a
broken environment would otherwise grade every notebook zero); the same run's probes
(:mod:`autograder.prepare.probes`) are the reference every submission is judged against.
:mod:`autograder.batch` calls :func:`start` and waits for :meth:`Pending.result`; references are
kept in the work folder's ``reference/ASSIGNMENT/NOTEBOOK.json``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from functools import lru_cache
from importlib import metadata
from pathlib import Path

import nbformat

from autograder.course.cells import is_test, nbgrader_meta
from autograder.course.profile import profile_named
from autograder.judge.compare import self_check
from autograder.judge.verdict import judge, observations_of
from autograder.prepare.job import Job
from autograder.prepare.probes import notebook_sites
from autograder.prepare.submission import fingerprint, write_whole
from autograder.run import sandbox
from autograder.run.jobfile import RunContext, ready
from autograder.run.session import KERNEL_LOG

STUDENT = "(canary)"
CACHE_ENV = "COURSE_REFERENCE_CACHE"
REFERENCES = "reference"  # the work folder's folder of references, one folder per assignment
KEY_FORMAT = 1  # raised when what a reference holds changes


class CanaryFailed(RuntimeError):
    """The instructor's solution did not pass in the grading sandbox; the message's first line says
    why."""


@lru_cache(maxsize=4)
def _installed(profile: str) -> str:
    """A hash of the grader's code, the code of the course's packages (those of its grading
    ``profile``) and every installed package's version (read once)."""
    digest = hashlib.sha256()
    for folder in (Path(__file__).resolve().parents[1], *profile_named(profile).package_folders()):
        digest.update(fingerprint(folder, recursive=True, suffix=".py").encode())
    # Each name and version once: Python finds the course's own metadata (devcourse.egg-info) a
    # second time when the grader runs from the repository's root, whose folder is then first on the
    # path; a key that counted it twice would change with the folder the grader is started from, and
    # the canary run again for nothing.
    for name in sorted({f"{d.metadata['Name']}=={d.version}" for d in metadata.distributions()}):
        digest.update(name.encode() + b"\0")
    return digest.hexdigest()


def this_machine(profile: str = "", devices: str | None = None) -> str:
    """The part of every key that is the same for a whole run: code, Python, packages, machine,
    devices (``devices`` where the run named them, else the profile's)."""
    parts = [
        _installed(profile),
        sys.version,
        sys.executable,
        platform.platform(),
        platform.machine(),
        str(os.cpu_count()),
        str(sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else ""),
        os.environ.get("CUDA_VISIBLE_DEVICES", "-"),
        profile_named(profile).devices() if devices is None else devices,
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def reference_key(
    assignment: str, notebook: str, source_dir: Path, run: RunContext, machine: str
) -> str | None:
    """The key a reference is kept under, or None where none is kept (a Dask cluster's workers).

    ``machine`` is :func:`this_machine`'s. The key hashes all that could change what the solution
    does in the sandbox: the assignment's source folder, the grader's and the course package's code,
    Python and every installed package's version, the machine, the devices checked, the limits and
    the isolation. A later run with the same key reuses the reference (the canary runs once, not
    each day); anything that changes in it, or ``--rerun-canary``, runs the solution again.
    """
    settings = run.settings
    if settings.on_cluster:
        return None
    limits = [
        dataclasses.asdict(settings.limits),
        settings.sandbox,
        settings.keep_work,
        run.isolation.namespaces,
        run.isolation.user_namespace,
        run.cgroups.version,
    ]
    parts = [
        str(KEY_FORMAT),
        assignment,
        notebook,
        fingerprint(source_dir, recursive=True),
        machine,
        json.dumps(limits),
    ]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def cache_folder(settings) -> Path | None:
    """The folder shared by several work folders (``--reference-cache``, else
    ``$COURSE_REFERENCE_CACHE``), or None."""
    chosen = settings.reference_cache or os.environ.get(CACHE_ENV)
    return Path(chosen).expanduser().resolve() if chosen else None


def unwritable(cache: Path) -> str | None:
    """Why no reference can be added to ``cache`` (made if missing), or None when one can."""
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=cache):
            return None
    except OSError as error:
        return f"{type(error).__name__}: {error.strerror or error}"


def start(
    notebooks: list[tuple[str, str, nbformat.NotebookNode]], workdir: Path, run: RunContext
) -> "Pending":
    """Run each ``(assignment, notebook, source)`` solution as a submission, with the instructor's
    probes.

    Hands the solutions whose references must be made to the executor and returns at once;
    :meth:`Pending.result` gives assignment -> notebook -> grade_id -> the reference's records, and
    raises CanaryFailed unless every test passes. The notebooks given are those of each assignment
    with submissions to grade (``--canary graded``) or of every chosen one (``--canary all``).

    A notebook whose reference is kept under the same key, in the work folder or the shared cache,
    is not run again; one that another grader is making in the shared cache is waited for in
    :meth:`Pending.result`. The jobs go to the executor before any student's, so they start first,
    and the grader can prepare and hand over students' jobs while they run.
    """
    cache = cache_folder(run.settings)
    problem = cache and unwritable(cache)
    if problem:  # another user's folder, say: its references are still read, none is added
        print(
            f"References are not kept in {cache} this run, only read from it: it cannot be written "
            f"({problem}); the work folder keeps its own.",
            file=sys.stderr,
            flush=True,
        )
    fresh = run.settings.rerun_canary
    pending = Pending(workdir, None if problem else cache, run)
    todo = []
    machine = this_machine(run.settings.profile or "", run.settings.devices)
    try:
        for name, notebook, source in notebooks:
            key = reference_key(name, notebook, workdir / "source" / name, run, machine)
            kept = None if fresh else _kept(workdir, cache, name, notebook, key)
            if kept is not None:
                pending.found.setdefault(name, {})[notebook] = kept["records"]
                pending.costs[name] = pending.costs.get(name, 0.0) + _cost(kept)
                pending.reused.append(f"{name}/{notebook}")
                continue
            if pending.cache is not None and key is not None and not fresh:
                lock = _KeyLock(cache, key)
                if not lock.acquire(wait=False):  # another grader is making it
                    lock.release()
                    pending.waiting.append((name, notebook, source, key))
                    continue
                pending.held.callback(lock.release)
            todo.append((name, notebook, source, key))
        pending.jobs = _submit(todo, workdir, run)
    except BaseException:
        pending.close()
        raise
    return pending


class Pending:
    """The canary under way: :meth:`result` waits for its jobs, checks them and keeps the
    references."""

    def __init__(self, workdir: Path, cache: Path | None, run: RunContext):
        self.workdir, self.cache, self.run = workdir, cache, run
        self.found: dict[str, dict[str, dict]] = {}
        # assignment -> the processor time its solutions took, as the references kept say
        self.costs: dict[str, float] = {}
        self.reused: list[str] = []
        self.waiting: list = []
        self.jobs: list = []
        # the locks on the references this grader makes in the shared cache
        self.held = contextlib.ExitStack()
        self.done = False

    def result(self) -> dict[str, dict[str, dict]]:
        """assignment -> notebook -> grade_id -> records; raises CanaryFailed unless every test
        passed."""
        if self.done:
            return self.found
        try:
            _finish(self.jobs, self.workdir, self.cache, self.found)
        finally:
            self.close()
        again = []
        for name, notebook, source, key in self.waiting:
            lock = _KeyLock(self.cache, key)
            try:
                lock.acquire(wait=True)
                kept = _kept(self.workdir, self.cache, name, notebook, key)
            finally:
                lock.release()
            # the other grader did not make it (stopped, or its canary failed): made here
            if kept is None:
                again.append((name, notebook, source, key))
            else:
                self.found.setdefault(name, {})[notebook] = kept["records"]
                self.reused.append(f"{name}/{notebook}")
        _finish(_submit(again, self.workdir, self.run), self.workdir, self.cache, self.found)
        if self.reused and self.run.settings.progress:
            print(
                f"References kept from an earlier run, not made again: {', '.join(self.reused)}",
                flush=True,
            )
        self.done = True
        return self.found

    def close(self) -> None:
        """Let go of the shared cache's locks (a stopped run: another grader may make those
        references)."""
        self.held.close()


def _submit(items: list, workdir: Path, run: RunContext) -> list:
    jobs = []
    for name, notebook, source, key in items:
        job = Job(STUDENT, name, notebook, workdir / "jobs" / STUDENT / name / notebook)
        # left by a run stopped before its reference was kept
        shutil.rmtree(job.folder, ignore_errors=True)
        path = ready(job, source, source, workdir / "source" / name, run, reference=True)
        jobs.append((job, run.executor.submit(path), source, key))
    return jobs


def _finish(jobs: list, workdir: Path, cache: Path | None, found: dict) -> None:
    for _, future, _, _ in jobs:
        future.result()
    for job, _, source, key in jobs:
        problem = _problem(job, source)
        if problem:
            raise CanaryFailed(
                f"grading stopped: the instructor's solution of {job.assignment}/{job.notebook} "
                f"does not pass in the grading sandbox: {problem}"
            )
        records = observations_of(job)
        kept = json.dumps(
            {
                "key": key,
                "assignment": job.assignment,
                "notebook": job.notebook,
                "records": records,
                "cpu_s": job.status.cpu_s,
            }
        )
        write_whole(_own(workdir, job.assignment, job.notebook), kept)
        if cache is not None and key is not None:
            write_whole(cache / f"{key}.json", kept)
        found.setdefault(job.assignment, {})[job.notebook] = records


def _cost(kept: dict) -> float:
    """The processor time a kept reference's solution took, or 0 where it does not say (an older
    grader's)."""
    cost = kept.get("cpu_s")
    return float(cost) if isinstance(cost, (int, float)) else 0.0


def _own(workdir: Path, assignment: str, notebook: str) -> Path:
    """Where the work folder keeps the reference it grades ``assignment/notebook`` with."""
    return workdir / REFERENCES / assignment / f"{notebook}.json"


def _read(path: Path) -> dict | None:
    try:
        kept = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return kept if isinstance(kept, dict) and isinstance(kept.get("records"), dict) else None


def _kept(
    workdir: Path, cache: Path | None, assignment: str, notebook: str, key: str | None
) -> dict | None:
    """The reference kept under ``key`` (its records, and the processor time the solution took where
    it says): in the work folder, else in the cache (copied in)."""
    if key is None:
        return None
    own = _own(workdir, assignment, notebook)
    kept = _read(own)
    if kept is not None and kept.get("key") == key:
        return kept
    shared = _read(cache / f"{key}.json") if cache is not None else None
    if shared is None or shared.get("key") != key:
        return None
    # the work folder keeps the reference it graded with (for review)
    write_whole(own, json.dumps(shared))
    return shared


class _KeyLock:
    """A lock on ``CACHE/KEY.lock``, held while a grader makes that reference; Linux ends it with
    the grader."""

    def __init__(self, cache: Path, key: str):
        cache.mkdir(parents=True, exist_ok=True)
        self.handle = open(cache / f"{key}.lock", "a")

    def acquire(self, wait: bool) -> bool:
        while True:
            try:
                fcntl.flock(self.handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if not wait:
                    return False
                time.sleep(0.2)

    def release(self) -> None:
        self.handle.close()  # and the lock with it


def reference_of(workdir: Path, assignment: str, notebook: str) -> dict | None:
    """The records of the reference the last run in ``workdir`` graded ``assignment/notebook`` with,
    or None."""
    kept = _read(_own(workdir, assignment, notebook))
    return kept["records"] if kept is not None else None


def _problem(job: Job, source: nbformat.NotebookNode) -> str | None:
    if job.findings:
        return "the scan flags it: " + "; ".join(job.findings[:3])
    executed = judge(job, source, reference=None)
    records = observations_of(job)
    sites = notebook_sites([cell.source for cell in source.cells if is_test(cell)])
    for cell in executed.cells:
        if not is_test(cell):
            continue
        grade_id = nbgrader_meta(cell)["grade_id"]
        errors = [o for o in cell.get("outputs", []) if o.output_type == "error"]
        if errors:
            first = errors[0]
            problem = (
                f"test {grade_id}: {first.ename}: {sandbox.last_line(first.evalue) or first.evalue}"
            )
        else:
            why = self_check(records.get(grade_id), sites)
            problem = f"test {grade_id}, run again with its hidden checks: {why}" if why else None
        if problem:
            said = _last_words(job)
            return problem + (f" (the kernel's last words: {said})" if said else "")
    if not (job.folder / "status.json").exists():
        return "the runner did not finish: " + (_last_words(job) or "no log")
    return None


# ipykernel's, then the line naming its connection file
_BANNER_END = "To connect another client to this kernel, use:"


def _last_words(job: Job) -> str:
    """The last line the kernel wrote to its output (:data:`autograder.run.session.KERNEL_LOG`),
    else the last line of the runner's log, or ``""``.

    Every kernel that starts writes ipykernel's banner, ending with the path of its connection file
    (``--existing ...``): those are not its last words, only what comes after them is (a kernel that
    died before the banner gets the log's last line, as it stands).
    """
    for name in (KERNEL_LOG, "runner.log"):
        log = job.folder / name
        if not log.exists():
            continue
        text = log.read_text(errors="replace")
        if _BANNER_END in text:
            first, _, rest = text.rsplit(_BANNER_END, 1)[1].lstrip().partition("\n")
            text = rest if first.startswith("--existing") else first + "\n" + rest
        said = sandbox.last_line(text)
        if said:
            return said
    return ""
