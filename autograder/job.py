"""One job: a notebook of one student's assignment, prepared for the sandboxed runner and run.

:func:`prepare` writes the assembled notebook, whose test cells are the visible tests the
student sees (each after the guard and the course's imports, with its comparisons made strict),
the probe of every test (:mod:`autograder.probe`: the whole test, hidden parts included,
rewritten to record values), the student's working copy and the runner's settings;
:func:`execute` runs :mod:`autograder.runner` on it in its own process.
"""

from __future__ import annotations

import ast
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from autograder import cgroups, probe, sandbox
from autograder.course.cells import is_answer, is_test, nbgrader_meta, visible_source
from autograder.course.config import tool_env
from autograder.course.paths import ROOT
from autograder.scan import ipython_free, scan
from autograder.settings import Settings
from autograder.submission import assemble
from autograder.zygote import ZygoteUnavailable


@dataclass
class Job:
    student: str
    assignment: str
    notebook: str
    folder: Path  # this job's own folder in the work folder
    findings: list[str] = field(default_factory=list)
    status: dict = field(default_factory=dict)


def course_imports(source: nbformat.NotebookNode) -> str:
    """The course's own import statements, re-run before each test so its names mean what they meant."""
    lines = []
    for cell in source.cells:
        if cell.cell_type != "code" or is_answer(cell) or is_test(cell):
            continue
        try:
            tree = ast.parse(ipython_free(cell.source))
        except SyntaxError:
            continue
        lines += [ast.unparse(node) for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    return "\n".join(dict.fromkeys(lines))


class _StrictComparisons(ast.NodeTransformer):
    def __init__(self, guard_name: str):
        self.guard_name = guard_name

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        self.generic_visit(node)
        if len(node.ops) != 1 or not isinstance(node.ops[0], (ast.Eq, ast.NotEq)):
            return node
        function = "eq" if isinstance(node.ops[0], ast.Eq) else "ne"
        # Functions a test ships to other processes (DDP ranks) have no guard there: operator.eq/ne instead.
        checker = ast.parse(f"__import__('builtins').__dict__.get({self.guard_name!r}, __import__('operator'))",
                            mode="eval").body
        call = ast.Call(func=ast.Attribute(value=checker, attr=function, ctx=ast.Load()),
                        args=[node.left, node.comparators[0]], keywords=[])
        return ast.copy_location(call, node)


    # torch.equal(a, b) and the like -> the guard's checked version (torch's own where there is no guard)
    TENSOR_CHECKS = {("torch", "equal"): "torch", ("torch", "allclose"): "torch", ("torch", "isclose"): "torch",
                     ("torch", "testing", "assert_close"): "torch.testing"}

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        path, target = [], node.func
        while isinstance(target, ast.Attribute):
            path.insert(0, target.attr)
            target = target.value
        if not isinstance(target, ast.Name):
            return node
        fallback = self.TENSOR_CHECKS.get((target.id, *path))
        if fallback is None:
            return node
        checker = ast.parse(f"__import__('builtins').__dict__.get({self.guard_name!r}, "
                            f"__import__('importlib').import_module({fallback!r}))", mode="eval").body
        node.func = ast.Attribute(value=checker, attr=path[-1], ctx=ast.Load())
        return node


def test_prelude(guard_name: str, imports: str) -> str:
    """What the grader runs in a test's cell before the test: its guard's start, then the course's imports
    (:func:`course_imports`); a traceback counts these lines too (:func:`autograder.hints.frame_as_written`)."""
    return f"{guard_name}()\n{imports}\n"


def _strict(source: str, guard_name: str) -> tuple[ast.Module, str] | None:
    """The test's tree, its comparisons checked by the guard, and that tree's source; None if not Python."""
    try:
        tree = ast.parse(ipython_free(source))
    except SyntaxError:
        return None
    return tree, ast.unparse(ast.fix_missing_locations(_StrictComparisons(guard_name).visit(tree)))


def strict_comparisons(source: str, guard_name: str) -> str:
    """A test's source with every ``a == b`` / ``a != b`` and ``torch.equal``-like call checked by the guard.

    See :mod:`autograder.inside.guard`.
    """
    strict = _strict(source, guard_name)
    return source if strict is None else strict[1]


def strict_lines(source: str, guard_name: str) -> tuple[list[str], dict[int, int]]:
    """The lines of :func:`strict_comparisons`, and for each line that begins a statement (an ``except``
    clause, a decorator) the line of ``source`` it begins on (both counted from 1): how a traceback of the test
    as it ran maps to the test as written. Without the map (``{}``) where ``source`` is not Python."""
    strict = _strict(source, guard_name)
    if strict is None:
        return source.splitlines(), {}
    tree, text = strict
    written, ran = _located(tree), _located(ast.parse(text))
    if [type(node) for node in written] != [type(node) for node in ran]:
        return text.splitlines(), {}
    starts: dict[int, int] = {}
    for before, after in zip(written, ran):
        starts.setdefault(after.lineno, before.lineno)
    return text.splitlines(), starts


def _located(tree: ast.AST) -> list[ast.AST]:
    """The nodes a traceback's line can stand on: statements, ``except`` clauses and decorators."""
    nodes = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.stmt, ast.excepthandler)):
            nodes += [node, *getattr(node, "decorator_list", [])]
    return nodes


@dataclass(frozen=True)
class RunContext:
    """What every job of one grading run shares."""

    settings: Settings
    isolation: sandbox.Isolation
    guard_name: str  # the kernel's name for the guard; the recorder's is this plus "_probe"
    ipc_root: Path  # the kernels' IPC folders are made in it
    imports: dict[str, dict[str, str]]  # assignment -> notebook -> the source's import lines (course_imports)
    cgroups: cgroups.Cgroups = cgroups.Cgroups(0, reason="not asked for")  # where each sandbox gets a cgroup
    executor: object = None  # where the jobs run: the autograder.executors.Executor the batch made


def prepare(job: Job, source: nbformat.NotebookNode, submitted: nbformat.NotebookNode, submitted_dir: Path,
            run: RunContext, reference: bool = False) -> Path:
    """Write the job's assembled notebook, probes, working copy and runner settings; return the job file.

    ``reference`` makes the instructor's probes, which record the expected sides too (the canary's run).
    """
    settings, isolation, guard_name = run.settings, run.isolation, run.guard_name
    imports = run.imports[job.assignment][job.notebook]
    nb = assemble(source, submitted)
    course_cells = {c.get("id") for c in source.cells if not is_answer(c)}
    student_cells = [c for c in nb.cells if c.cell_type == "code" and (is_answer(c) or not nbgrader_meta(c))
                     and c.get("id") not in course_cells]
    job.findings = scan(student_cells)
    recorder_name = guard_name + "_probe"
    tests = [cell for cell in nb.cells if is_test(cell)]
    codes, _ = probe.notebook_probes([cell.source for cell in tests], recorder_name, reference)
    probes = [[nbgrader_meta(cell)["grade_id"],
               test_prelude(guard_name, imports) + strict_comparisons(code, guard_name)]
              for cell, code in zip(tests, codes)]
    for cell in tests:
        cell.source = (test_prelude(guard_name, imports)
                       + strict_comparisons(visible_source(cell.source), guard_name))
    job.folder.mkdir(parents=True)
    work = job.folder / "work"
    shutil.copytree(submitted_dir, work, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    nbformat.write(nb, job.folder / "in.ipynb")
    description = {"guard_name": guard_name, "recorder_name": recorder_name, "probes": probes}
    hide = [str(ROOT), str(job.folder.parents[3]), str(submitted_dir.parents[1])]
    _place(job.folder, description, settings, isolation, run.ipc_root, hide, run.cgroups)
    # What the verdict needs, kept for a review of a withheld score (autograder.review); the kernel cannot see it.
    (job.folder / "verdict.json").write_text(json.dumps({"findings": job.findings}))
    return job.folder / "job.json"


def _place(folder: Path, description: dict, settings: Settings, isolation: sandbox.Isolation, ipc_root: Path,
           hide: list[str], groups: cgroups.Cgroups) -> None:
    """Write ``folder/job.json``: ``description`` with this machine's paths, limits and sandbox for the job.

    The sandbox hides ``hide`` and brings back this Python's folders, none of them inside ``hide``
    but the environment and ``devcourse`` (:func:`autograder.sandbox.python_paths`).
    """
    work = folder / "work"
    ipc = Path(tempfile.mkdtemp(prefix="k", dir=ipc_root))
    spec = sandbox.Spec(
        workdir=str(work), memory_mib=settings.memory_mib, namespaces=isolation.namespaces,
        user_namespace=isolation.user_namespace, max_processes=settings.max_processes,
        disk_mib=0 if settings.keep_work else settings.disk_mib, ipc_dir=str(ipc),
        hide=hide, read_only=sandbox.python_paths(hide), read_write=[str(work), str(ipc)])
    description.update({
        "notebook_in": str(folder / "in.ipynb"), "notebook_out": str(folder / "out.ipynb"),
        "status_out": str(folder / "status.json"), "ipc_dir": str(ipc), "workdir": str(work),
        "cell_timeout_s": settings.cell_timeout_s, "time_limit_s": settings.time_limit_s,
        "observations_out": str(folder / "observations.json"), "probes_log": str(folder / "probes.log"),
        "sandbox": spec.__dict__, "cgroups": {"version": groups.version, "parents": groups.parents},
    })
    if spec.as_nobody:
        for path in (work, ipc, *work.rglob("*")):
            os.chown(path, sandbox.NOBODY, sandbox.NOBODY)
    (folder / "job.json").write_text(json.dumps(description))


def relocate(job_file: Path, settings: Settings, ipc_root: Path, hide: list[str]) -> None:
    """Make a job prepared on another machine (unpacked at ``job_file``) runnable on this one.

    Its paths become this folder's, its sandbox this machine's (isolation,
    Python folders, cgroups), hiding this machine's copy of the course and
    ``hide``; what the job runs (notebook, probes, guard) is unchanged.
    """
    description = json.loads(job_file.read_text())
    kept = {key: description[key] for key in ("guard_name", "recorder_name", "probes")}
    groups = cgroups.find()  # decided once per process, on a worker as on a grader
    cgroups.sweep(groups)
    _place(job_file.parent, kept, settings, sandbox.isolation_of(settings), ipc_root, [str(ROOT), *hide], groups)


class Runners:
    """The runner processes of this grader that are still running, so that a stopped run can end them."""

    def __init__(self):
        self.lock = threading.Lock()
        self.running: set[subprocess.Popen] = set()
        self.stopping = threading.Event()

    def stop(self, grace_s: float = 3.0) -> None:
        """End every runner: SIGTERM (each ends its kernel's sandbox and writes what it has), SIGKILL after grace_s."""
        self.stopping.set()
        with self.lock:
            running = list(self.running)
        for process in running:
            try:
                process.terminate()
            except OSError:
                pass
        deadline = time.monotonic() + grace_s
        for process in running:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()


RUNNERS = Runners()


def execute(job_file: Path, settings: Settings, runners: Runners = RUNNERS, zygote=None) -> None:
    """Run the runner for one job in its own process (forked by ``zygote`` if given, see :func:`launch`); never
    raises. Does nothing once ``runners`` is stopping."""
    finish(launch(job_file, runners, zygote=zygote), job_file, settings, runners)


def launch(job_file: Path, runners: Runners = RUNNERS, warm: bool = False, zygote=None, note: str = ""):
    """Start the runner of one job (None once ``runners`` is stopping): a ``subprocess.Popen``, or with
    ``zygote`` (an :class:`autograder.zygote.Zygote`) a runner it forked, which is used the same way.

    ``warm``: it starts the kernel in its sandbox, imports torch, installs the guard, then waits for
    :func:`finish` to let it run the notebook (or to take the job back). ``note`` begins its log.
    """
    log = job_file.parent / "runner.log"
    with log.open("w") as handle:
        if note:
            handle.write(note + "\n")
            handle.flush()
        if zygote is not None and not runners.stopping.is_set():
            try:
                process = zygote.spawn(job_file, handle.fileno(), warm, tool_env())
            except ZygoteUnavailable as error:  # every later job starts fresh too
                handle.write(f"runner started fresh: the zygote cannot fork runners, {error}\n")
                handle.flush()
            else:
                with runners.lock:
                    runners.running.add(process)
                    if not runners.stopping.is_set():
                        return process
                process.kill()
                return None
    with log.open("a") as handle, runners.lock:
        if runners.stopping.is_set():
            return None
        process = subprocess.Popen(
            [sys.executable, "-m", "autograder.runner", str(job_file), str(os.getpid()), *(["--warm"] if warm else [])],
            cwd=ROOT, stdin=subprocess.PIPE if warm else subprocess.DEVNULL, stdout=handle, stderr=subprocess.STDOUT,
            env=tool_env(), text=True)
        runners.running.add(process)
    return process


def finish(process: subprocess.Popen | None, job_file: Path, settings: Settings, runners: Runners = RUNNERS,
           go: bool = True) -> None:
    """Let a started runner (warm or not) run its job to its end, or take a warm one's job back
    (``go=False``: it ends writing nothing); never raises. Removes the job's working copy.

    A runner forked by a zygote that died while it ran died with it, its job not done: the job runs
    again from its start, in a runner started fresh."""
    try:
        if process is not None:
            if process.stdin is not None:
                with contextlib.suppress(OSError):
                    process.stdin.write("go\n" if go else "")
                    process.stdin.close()
            try:
                process.wait(timeout=settings.time_limit_s + 120)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if go and getattr(process, "lost", False):
                with runners.lock:
                    runners.running.discard(process)
                Path(json.loads(job_file.read_text())["probes_log"]).unlink(missing_ok=True)
                fresh = launch(job_file, runners, note="this job runs again, in a runner started fresh: the zygote "
                                                        "that had forked its runner ended while it ran")
                finish(fresh, job_file, settings, runners)
                return
    finally:
        if process is not None:
            with runners.lock:
                runners.running.discard(process)
        if not settings.keep_work:
            remove_tree(job_file.parent / "work")


def remove_tree(folder: Path) -> None:
    """Remove ``folder`` and all in it, folders a submission made unwritable or unreadable included."""
    def writable_then_again(function, path, _error):
        for place in {os.path.dirname(path), path}:
            try:
                os.chmod(place, 0o700)
            except OSError:
                pass
        function(path)

    if folder.exists():
        shutil.rmtree(folder, onerror=writable_then_again)
