"""Autograde a whole class: in parallel, sandboxed, with limits (``make grade``).

For every ``<submitted>/<student>/<assignment>/`` folder, and for each
notebook of that assignment:

1. the notebook to run is assembled from the instructor's source: the
   student's answer cells (and any cells they added) go in, every other cell,
   tests with their hidden parts included, comes from the source, so an
   edited or deleted test cell changes nothing;
2. the student's code is scanned (without running it) for reaching into what
   the tests or the grader rely on; such a notebook's score is withheld and
   the report says why, for the instructor to review;
3. it runs in its own kernel in :mod:`autograder.sandbox` (own working copy,
   no network, memory and wall-time limits), several at once, one per core;
   before each test cell :mod:`autograder.guard` puts back what student code
   may have patched, and a test counts only when it prints its secret
   completion marker and raises nothing;
4. nbgrader records the scores in its gradebook (SQLite in the work folder,
   or PostgreSQL with ``--db-url``) and writes feedback HTML, from which the
   hidden tests, their tracebacks and any output quoting them are removed.

Then it prints students by assignments and writes ``scores.csv``,
``scores.png`` (a histogram) and ``report.txt`` into the work folder.

Run ``python -m autograder.grade --help`` from the repository root.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import csv
import hashlib
import hmac
import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Iterator
from unittest import mock

import nbformat

from autograder import sandbox
from autograder.pipeline import ROOT, SOLUTIONS, assignments, course_config, tool_env

DEMO_CLASS = ROOT / "autograder" / "demo_class" / "submitted"
WORKDIR = ROOT / "build" / "grade"
CELL_TIMEOUT_S = 60.0
TIME_LIMIT_S = 600.0
MEMORY_LIMIT_MIB = 4096
GRADEBOOK_ENV = "COURSE_GRADEBOOK_URL"


@dataclass(frozen=True)
class Result:
    """One student's result on one assignment. ``score`` is None when not graded."""

    student: str
    assignment: str
    score: float | None
    max_score: float
    note: str = ""
    devices: str = ""
    seconds: float = 0.0


@dataclass
class Settings:
    jobs: int = field(default_factory=lambda: os.cpu_count() or 1)
    cell_timeout_s: float = CELL_TIMEOUT_S
    time_limit_s: float = TIME_LIMIT_S
    memory_mib: int = MEMORY_LIMIT_MIB
    db_url: str | None = None
    feedback: bool = True
    progress: bool = True
    sandbox: bool = True
    user_namespace: bool | None = None  # None: namespaces inside a user namespace unless the grader is root

    def isolation(self) -> sandbox.Isolation:
        if not self.sandbox:
            return sandbox.Isolation(False, "switched off with --no-sandbox")
        return sandbox.probe(self.user_namespace)


# ---- nbgrader ----------------------------------------------------------------


def _api(workdir: Path, db_url: str):
    from nbgrader.apps import NbGraderAPI
    from nbgrader.preprocessors import (AssignLatePenalties, CheckCellMetadata, DeduplicateIds, LimitOutput,
                                        OverwriteCells, OverwriteKernelspec, SaveAutoGrades)
    from traitlets.config import Config

    config = course_config()
    overrides = Config()
    overrides.CourseDirectory.root = str(workdir)
    overrides.CourseDirectory.source_directory = "source"
    overrides.CourseDirectory.release_directory = "release"
    overrides.CourseDirectory.db_url = db_url
    # The notebooks arrive executed by the sandboxed runner: nbgrader must neither clear nor re-run them.
    overrides.Autograde.sanitize_preprocessors = [DeduplicateIds, OverwriteKernelspec, OverwriteCells, CheckCellMetadata]
    overrides.Autograde.autograde_preprocessors = [LimitOutput, SaveAutoGrades, AssignLatePenalties, CheckCellMetadata]
    config.merge(overrides)
    return NbGraderAPI(config=config)


@contextlib.contextmanager
def _grading_environment() -> Iterator[None]:
    """nbgrader runs ``alembic`` by name and warns on every submission; both for this block only."""
    from sqlalchemy.exc import SAWarning

    with mock.patch.dict(os.environ, {"PATH": tool_env()["PATH"]}), warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=SAWarning)
        yield


class GradebookLock:
    """One grader at a time writes a shared PostgreSQL gradebook (a PostgreSQL advisory lock).

    nbgrader creates assignments, notebooks and students with "update or
    create", which two graders doing it at once turn into a duplicate-key
    error. Any other database (SQLite in the work folder) has one grader: no lock.
    """

    KEY = 0x6E626772  # any number the graders of one course agree on

    def __init__(self, url: str):
        from sqlalchemy.engine import make_url

        self.engine = None
        if make_url(url).get_backend_name() == "postgresql":
            import sqlalchemy

            self.engine = sqlalchemy.create_engine(url)

    def __enter__(self) -> "GradebookLock":
        return self

    def __exit__(self, *_exc) -> None:
        if self.engine is not None:
            self.engine.dispose()

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        if self.engine is None:
            yield
            return
        from sqlalchemy import text

        with self.engine.connect() as connection:
            connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": self.KEY})
            try:
                yield
            finally:
                connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": self.KEY})


def gradebook_url(settings: Settings, workdir: Path) -> str:
    """``--db-url``, else ``$COURSE_GRADEBOOK_URL``, else nbgrader's SQLite file in the work folder."""
    return settings.db_url or os.environ.get(GRADEBOOK_ENV) or f"sqlite:///{Path(workdir).resolve() / 'gradebook.db'}"


def shown_url(url: str) -> str:
    """The gradebook URL as the report prints it: the password replaced by ``***``."""
    from sqlalchemy.engine import make_url

    return make_url(url).render_as_string(hide_password=True)


def gradebook_problem(url: str) -> str | None:
    """Why the gradebook at ``url`` cannot be opened (server down, wrong password...), or None if it can."""
    import sqlalchemy

    try:
        engine = sqlalchemy.create_engine(url)
        with engine.connect():
            pass
        engine.dispose()
    except Exception as error:  # noqa: BLE001 - any reason is reported to the instructor, in one line
        reason = str(getattr(error, "orig", None) or error)
        return " ".join(line.strip() for line in reason.splitlines() if line.strip()) or type(error).__name__
    return None


def _last_line(text: str | None) -> str:
    return sandbox.last_line(text or "") or "unknown error"


# ---- assembling the notebook to run ---------------------------------------------


def _nbgrader(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def _is_answer(cell) -> bool:
    return bool(_nbgrader(cell).get("solution"))


def _is_test(cell) -> bool:
    meta = _nbgrader(cell)
    return cell.cell_type == "code" and bool(meta.get("grade")) and not meta.get("solution")


def _grade_ids(nb: nbformat.NotebookNode) -> set[str]:
    return {_nbgrader(c)["grade_id"] for c in nb.cells if _nbgrader(c).get("grade_id")}


class SubmissionError(Exception):
    """A notebook that cannot be graded; its message is the report's note."""


def read_submission(path: Path, own: set[str], other_sources: dict[str, set[str]]):
    """Read a submitted notebook, or raise SubmissionError saying why it cannot be graded."""
    try:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
    except Exception as error:  # noqa: BLE001 - json, schema and encoding errors alike
        raise SubmissionError(f"{path.name} is not a valid notebook ({type(error).__name__}: "
                              f"{str(error).splitlines()[0][:120] if str(error) else ''})") from None
    ids = _grade_ids(nb)
    if ids and not ids & own:
        owners = [name for name, other in other_sources.items() if ids & other]
        where = f"the notebook of {owners[0]}" if owners else "not from this assignment"
        raise SubmissionError(f"{path.name} is {where}")
    return nb


def assemble(source: nbformat.NotebookNode, submitted: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The notebook to grade: the source's cells, with the student's answers and added cells put in."""
    answers = {_nbgrader(c)["grade_id"]: c for c in submitted.cells if _is_answer(c) and _nbgrader(c).get("grade_id")}
    source_ids = {c.get("id") for c in source.cells}
    source_grade_ids = {_nbgrader(c).get("grade_id") for c in source.cells} - {None}
    added: dict[str | None, list] = {}
    anchor = None
    for cell in submitted.cells:
        grade_id = _nbgrader(cell).get("grade_id")
        if cell.get("id") in source_ids or grade_id in source_grade_ids:
            anchor = grade_id or cell.get("id")
            continue
        if cell.cell_type == "code" and not _nbgrader(cell):
            added.setdefault(anchor, []).append(cell)
    out = nbformat.v4.new_notebook(metadata=source.metadata)
    cells = list(added.get(None, []))
    for cell in source.cells:
        grade_id = _nbgrader(cell).get("grade_id")
        if _is_answer(cell):
            mine = answers.get(grade_id)
            new = nbformat.from_dict(dict(cell))
            new.source = mine.source if mine is not None else _stub(cell)
            cells.append(new)
        else:
            cells.append(nbformat.from_dict(dict(cell)))
        cells += added.get(grade_id or cell.get("id"), [])
    for cell in cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    out.cells = cells
    return out


def _stub(cell) -> str:
    """What nbgrader writes into a student version's answer cell (nbgrader_config.py's stubs)."""
    code, text = _stubs()
    return code if cell.cell_type == "code" else text


@lru_cache(maxsize=1)
def _stubs() -> tuple[str, str]:
    stubs = course_config().ClearSolutions
    return stubs.code_stub["python"], stubs.text_stub


# ---- scanning the student's code ------------------------------------------------

# Names no answer in this course needs, and that reach into the tests, the kernel or the grader.
FORBIDDEN_NAMES = {  # as a bare name
    "get_ipython", "__builtins__", "__import__", "exec", "eval", "compile", "globals", "breakpoint",
}
FORBIDDEN_ATTRIBUTES = {  # as an attribute, whatever it belongs to
    "showtraceback", "_showtraceback", "showsyntaxerror", "set_custom_exc", "CustomTB", "custom_exceptions",
    "run_cell", "run_cell_async", "run_ast_nodes", "run_code", "input_transformers_cleanup",
    "input_transformers_post", "ast_transformers", "InteractiveShell", "excepthook", "displayhook", "settrace",
    "setprofile", "get_referrers", "get_referents", "get_objects", "__code__", "__globals__", "f_globals",
    "f_locals", "f_back", "_getframe", "__builtins__", "__subclasses__",
}
FORBIDDEN_DOTTED = {"sys.modules", "os.kill", "os.killpg", "os._exit", "os.abort", "signal.signal"}
FORBIDDEN_MODULES = {"ctypes", "gc", "builtins", "signal", "IPython", "ipykernel", "inspect"}


def scan(cells: list) -> list[str]:
    """What in the student's code reaches into the grading machinery: one line per finding, [] if nothing.

    Flags the names, attributes and modules above, and any attribute the code assigns or deletes on a
    module it imported (``torch.allclose = ...``, ``setattr(devcourse.grading, ...)``).
    """
    findings = []
    modules: set[str] = set()
    trees = []
    for index, cell in enumerate(cells):
        try:
            tree = ast.parse(_ipython_free(cell.source))
        except SyntaxError:
            continue
        trees.append((index, tree))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for alias in node.names:
                    modules.add(alias.asname or alias.name.split(".")[0])
                    if isinstance(node, ast.Import) or alias.name in ("testing", "nn", "grading"):
                        modules.add(alias.asname or alias.name)
    for index, tree in trees:
        for node in ast.walk(tree):
            name = None
            if isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
                name = node.id
            elif isinstance(node, ast.Attribute):
                dotted = f"{node.value.id}.{node.attr}" if isinstance(node.value, ast.Name) else ""
                name = dotted if dotted in FORBIDDEN_DOTTED else node.attr if node.attr in FORBIDDEN_ATTRIBUTES else None
            elif isinstance(node, ast.Import):
                name = next((a.name for a in node.names if a.name.split(".")[0] in FORBIDDEN_MODULES), None)
            elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in FORBIDDEN_MODULES:
                name = node.module
            if name:
                findings.append(f"line {node.lineno} uses {name}")
            targets = []
            if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
                targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr"):
                targets = node.args[:1]
            for target in targets:
                root = target
                while isinstance(root, ast.Attribute):
                    root = root.value
                if root is not target and isinstance(root, ast.Name) and root.id in modules:
                    findings.append(f"line {node.lineno} changes {ast.unparse(target)}")
                elif target is not node and isinstance(target, ast.Name) and target.id in modules and \
                        isinstance(node, ast.Call):
                    findings.append(f"line {node.lineno} changes an attribute of module {target.id}")
    return sorted(set(findings), key=lambda f: int(f.split()[1]))


def _ipython_free(source: str) -> str:
    """Cell source with IPython's ``%magic`` and ``!shell`` lines blanked, so ``ast`` can read it."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


# ---- one job: a notebook of a student's assignment -------------------------------------


@dataclass
class Job:
    student: str
    assignment: str
    notebook: str
    folder: Path  # this job's own folder in the work folder
    markers: dict[str, str] = field(default_factory=dict)  # grade_id -> what the test prints when it passes
    findings: list[str] = field(default_factory=list)
    status: dict = field(default_factory=dict)


def _imports(source: nbformat.NotebookNode) -> str:
    """The course's own import statements, re-run before each test so its names mean what they meant."""
    lines = []
    for cell in source.cells:
        if cell.cell_type != "code" or _is_answer(cell) or _is_test(cell):
            continue
        try:
            tree = ast.parse(_ipython_free(cell.source))
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


def strict_comparisons(source: str, guard_name: str) -> str:
    """A test's source with every ``a == b`` / ``a != b`` checked by the guard (see :mod:`autograder.guard`)."""
    try:
        tree = ast.parse(_ipython_free(source))
    except SyntaxError:
        return source
    return ast.unparse(ast.fix_missing_locations(_StrictComparisons(guard_name).visit(tree)))


def prepare(job: Job, source: nbformat.NotebookNode, submitted: nbformat.NotebookNode, submitted_dir: Path,
            secret: bytes, guard_name: str, settings: Settings, isolation: sandbox.Isolation, ipc_root: Path,
            imports: str, read_only: list[str]) -> Path:
    """Write the job's assembled notebook, working copy and runner settings; return the job file.

    ``imports`` is the source's import lines (:func:`_imports`), ``read_only`` the folders Python imports from.
    """
    nb = assemble(source, submitted)
    course_cells = {c.get("id") for c in source.cells if not _is_answer(c)}
    student_cells = [c for c in nb.cells if c.cell_type == "code" and (_is_answer(c) or not _nbgrader(c))
                     and c.get("id") not in course_cells]
    job.findings = scan(student_cells)
    for cell in nb.cells:
        if _is_test(cell):
            grade_id = _nbgrader(cell)["grade_id"]
            token = hmac.new(secret, f"{job.student}/{job.assignment}/{grade_id}".encode(), hashlib.sha256).hexdigest()[:32]
            job.markers[grade_id] = f"test passed: {token}"
            cell.source = f"{guard_name}()\n{imports}\n{strict_comparisons(cell.source, guard_name)}\n" \
                          f"print({job.markers[grade_id]!r})"
    job.folder.mkdir(parents=True)
    work = job.folder / "work"
    shutil.copytree(submitted_dir, work, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    ipc = Path(tempfile.mkdtemp(prefix="k", dir=ipc_root))
    nbformat.write(nb, job.folder / "in.ipynb")
    spec = sandbox.Spec(
        workdir=str(work), memory_mib=settings.memory_mib, namespaces=isolation.namespaces,
        user_namespace=isolation.user_namespace,
        hide=[str(ROOT), str(job.folder.parents[3]), str(submitted_dir.parents[1])],
        read_only=read_only, read_write=[str(work), str(ipc)])
    description = {
        "notebook_in": str(job.folder / "in.ipynb"), "notebook_out": str(job.folder / "out.ipynb"),
        "status_out": str(job.folder / "status.json"), "ipc_dir": str(ipc), "workdir": str(work),
        "cell_timeout_s": settings.cell_timeout_s, "time_limit_s": settings.time_limit_s,
        "guard_name": guard_name, "sandbox": spec.__dict__,
    }
    if spec.as_nobody:
        for path in (work, ipc, *work.rglob("*")):
            os.chown(path, sandbox.NOBODY, sandbox.NOBODY)
    (job.folder / "job.json").write_text(json.dumps(description))
    return job.folder / "job.json"


def execute(job_file: Path, settings: Settings) -> None:
    """Run the runner for one job in its own process; never raises."""
    log = job_file.parent / "runner.log"
    try:
        with log.open("w") as handle:
            subprocess.run([sys.executable, "-m", "autograder.runner", str(job_file)], cwd=ROOT,
                           stdout=handle, stderr=subprocess.STDOUT, timeout=settings.time_limit_s + 120,
                           env=tool_env())
    except subprocess.TimeoutExpired:
        pass


def _feedback(api, workdir: Path, pair: tuple[str, str], hidden: set[str], notes: dict) -> None:
    """nbgrader's feedback HTML for one student's assignment, from autograded notebooks without hidden tests."""
    student, name = pair
    for path in (workdir / "autograded" / student / name).glob("*.ipynb"):
        nbformat.write(redact(nbformat.read(path, as_version=4), hidden), path)
    outcome = api.generate_feedback(name, student, force=True)
    if not outcome["success"]:
        notes.setdefault(pair, []).append("no feedback: " + _last_line(outcome.get("error") or outcome.get("log")))


def verdict(job: Job, executed: nbformat.NotebookNode, source: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """Decide each test from the outside: it passed only if it printed its marker and raised nothing.

    Tests that failed that way get an error output saying why, so that
    nbgrader scores them 0 and the feedback shows the reason.
    """
    originals = {_nbgrader(c)["grade_id"]: c.source for c in source.cells if _is_test(c)}
    stopped = job.status.get("stopped", "") or ""
    for cell in executed.cells:
        if not _is_test(cell):
            continue
        grade_id = _nbgrader(cell)["grade_id"]
        token = job.markers[grade_id]
        cell.source = originals[grade_id]
        marked = False
        for output in cell.outputs:
            if output.output_type == "stream" and token in output.text:
                marked = True
                output.text = output.text.replace(token + "\n", "").replace(token, "")
        cell.outputs = [o for o in cell.outputs if not (o.output_type == "stream" and not o.text)]
        failed = any(o.output_type == "error" for o in cell.outputs)
        reason = None
        if job.findings:
            reason = "score withheld for review: the submission reaches into the grading machinery (" + \
                     "; ".join(job.findings[:3]) + ("; ..." if len(job.findings) > 3 else "") + ")"
            cell.outputs = []
        elif not failed and not marked:
            if cell.execution_count is None:
                reason = f"not run: {stopped or 'the notebook stopped before this test'}"
            else:
                reason = "the test did not report completion (its output or the kernel was tampered with)"
        if reason:
            cell.outputs.append(nbformat.v4.new_output("error", ename="GradingError", evalue=reason, traceback=[
                f"GradingError: {reason}"]))
    return executed


# ---- feedback without hidden tests ---------------------------------------------------

HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS[ \t]*\n?", re.S | re.M)


def hidden_lines(source: nbformat.NotebookNode) -> set[str]:
    lines = set()
    for cell in source.cells:
        for block in re.findall(r"### BEGIN HIDDEN TESTS(.*?)### END HIDDEN TESTS", cell.source, re.S):
            lines.update(line.strip() for line in block.splitlines() if len(line.strip()) >= 12)
    return lines


def redact(nb: nbformat.NotebookNode, hidden: set[str]) -> nbformat.NotebookNode:
    """Remove hidden tests from a graded notebook: sources, tracebacks, and any output that quotes them."""
    def clean(text: str) -> str:
        return "\n".join("[hidden test redacted]" if any(h in line for h in hidden) else line
                         for line in text.split("\n"))

    for cell in nb.cells:
        if _is_test(cell):
            cell.source = HIDDEN.sub("", cell.source)
        for output in cell.get("outputs", []):
            if output.output_type == "error":
                output.traceback = [clean(f"{output.ename}: {output.evalue}")] if _is_test(cell) else \
                    [clean(line) for line in output.traceback]
                output.evalue = clean(output.evalue)
            elif output.output_type == "stream":
                output.text = clean(output.text)
            elif "data" in output:
                for mime in list(output.data):
                    if isinstance(output.data[mime], str):
                        output.data[mime] = clean(output.data[mime])
    return nb


# ---- the batch -------------------------------------------------------------------------


class Progress:
    """A one-line progress bar on a terminal, one line per notebook otherwise."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.done, self.enabled = total, 0, enabled and total > 0
        self.tty = sys.stderr.isatty()
        self.started = time.monotonic()
        self.lock = threading.Lock()

    def step(self, label: str) -> None:
        if not self.enabled:
            return
        with self.lock:
            self.done += 1
            width = 30
            filled = int(width * self.done / self.total)
            line = (f"[{'#' * filled}{'.' * (width - filled)}] {self.done}/{self.total} notebooks "
                    f"{time.monotonic() - self.started:5.0f} s  {label}")
            if self.tty:
                print("\r" + line[:120].ljust(120), end="" if self.done < self.total else "\n",
                      file=sys.stderr, flush=True)
            else:
                print(line, file=sys.stderr, flush=True)


def devices_text() -> str:
    from devcourse.grading import device_matrix

    labels = {"": "", "sim": " (simulated)"}
    return " ".join(f"{entry.device}{labels.get(entry.stand_in, '')}" for entry in device_matrix("tensor"))


def grade(submitted: Path = DEMO_CLASS, workdir: Path = WORKDIR, settings: Settings | None = None) -> list[Result]:
    """Autograde every ``submitted/<student>/<assignment>/`` folder; return one Result per pair.

    A student who handed nothing in for an assignment gets ``score=None`` and
    a note; a notebook that cannot be graded (corrupt, from another
    assignment) gets a note with the reason, and the batch goes on.
    """
    settings = settings or Settings()
    submitted, workdir = Path(submitted).resolve(), Path(workdir).resolve()
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    shutil.copytree(SOLUTIONS, workdir / "source", ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    (workdir / "submitted").mkdir()
    db_url = gradebook_url(settings, workdir)
    with _grading_environment(), tempfile.TemporaryDirectory(prefix="grade-") as ipc_root, \
            GradebookLock(db_url) as lock:
        os.chmod(ipc_root, 0o755)
        return _grade_in(submitted, workdir, db_url, settings, Path(ipc_root), lock)


def _grade_in(submitted: Path, workdir: Path, db_url: str, settings: Settings, ipc_root: Path,
              lock: GradebookLock) -> list[Result]:
    from nbgrader.api import Gradebook, MissingEntry

    api = _api(workdir, db_url)
    names = assignments()
    sources: dict[str, dict[str, nbformat.NotebookNode]] = {}
    for name in names:
        with lock.held():
            outcome = api.generate_assignment(name, force=True)
        if not outcome["success"]:
            raise RuntimeError(f"could not generate {name}:\n{outcome.get('error') or outcome.get('log')}")
        sources[name] = {p.stem: nbformat.read(p, as_version=4) for p in sorted((workdir / "source" / name).glob("*.ipynb"))}
    grade_ids = {a: set().union(*(_grade_ids(nb) for nb in nbs.values())) for a, nbs in sources.items()}
    imports = {a: {notebook: _imports(nb) for notebook, nb in nbs.items()} for a, nbs in sources.items()}
    read_only = sandbox.python_paths()

    isolation = settings.isolation()
    secret, guard_name = secrets.token_bytes(32), "_grader_" + secrets.token_hex(8)
    students = sorted(p.name for p in submitted.iterdir() if p.is_dir() and not p.name.startswith("."))
    notes: dict[tuple[str, str], list[str]] = {}
    jobs: dict[tuple[str, str], list[Job]] = {}
    job_files: list[tuple[Job, Path]] = []
    for student in students:
        for name in names:
            folder = submitted / student / name
            if not folder.is_dir():
                notes[student, name] = ["not submitted"]
                continue
            others = {a: ids for a, ids in grade_ids.items() if a != name}
            for notebook, source in sources[name].items():
                path = folder / f"{notebook}.ipynb"
                if not path.is_file():
                    notes.setdefault((student, name), []).append(f"{notebook}.ipynb missing: 0 points for it")
                    continue
                try:
                    nb = read_submission(path, _grade_ids(source), others)
                except SubmissionError as error:
                    notes.setdefault((student, name), []).append(f"not graded: {error}")
                    continue
                job = Job(student, name, notebook, workdir / "jobs" / student / name / notebook)
                job_files.append((job, prepare(job, source, nb, folder, secret, guard_name, settings, isolation, ipc_root,
                                               imports[name][notebook], read_only)))
                jobs.setdefault((student, name), []).append(job)

    hidden = {name: set().union(*(hidden_lines(nb) for nb in sources[name].values())) for name in names}
    progress = Progress(len(job_files), settings.progress)
    remaining = {pair: len(pair_jobs) for pair, pair_jobs in jobs.items()}
    graded: set[tuple[str, str]] = set()
    with ThreadPoolExecutor(max_workers=max(1, settings.jobs)) as pool:
        futures = {pool.submit(execute, path, settings): job for job, path in job_files}
        for future in as_completed(futures):
            job = futures[future]
            pair = (job.student, job.assignment)
            status_path = job.folder / "status.json"
            job.status = json.loads(status_path.read_text()) if status_path.exists() else {
                "stopped": "the runner did not finish; see runner.log", "seconds": 0}
            out = job.folder / "out.ipynb"
            executed = nbformat.read(out if out.exists() else job.folder / "in.ipynb", as_version=4)
            executed = verdict(job, executed, sources[job.assignment][job.notebook])
            target = workdir / "submitted" / job.student / job.assignment
            target.mkdir(parents=True, exist_ok=True)
            nbformat.write(executed, target / f"{job.notebook}.ipynb")
            if job.status.get("stopped"):
                notes.setdefault(pair, []).append(f"{job.notebook}: stopped, {job.status['stopped']}")
            if job.findings:
                notes.setdefault(pair, []).append(f"{job.notebook}: score withheld for review, " + "; ".join(job.findings[:3]))
            remaining[pair] -= 1
            if remaining[pair] == 0:
                # Scores and feedback of a finished pair, while the pool runs the next notebooks.
                with lock.held():
                    outcome = api.autograde(job.assignment, job.student, force=True, create=True)
                if outcome["success"]:
                    graded.add(pair)
                    if settings.feedback:
                        _feedback(api, workdir, pair, hidden[job.assignment], notes)
                else:
                    notes.setdefault(pair, []).append("not graded: " + _last_line(outcome.get("error") or outcome.get("log")))
            progress.step(f"{job.student}/{job.assignment}")

    devices = devices_text()
    results = []
    with Gradebook(db_url, course_config().CourseDirectory.course_id) as gradebook:
        for student in students:
            for name in names:
                max_score = gradebook.find_assignment(name).max_score
                pair_notes = notes.get((student, name), [])
                score = None
                if (student, name) in graded:
                    try:
                        score = gradebook.find_submission(name, student).score
                    except MissingEntry:
                        pair_notes = [*pair_notes, "not graded: no submission in the gradebook"]
                ran = any(j.status.get("seconds") for j in jobs.get((student, name), []))
                seconds = sum(j.status.get("seconds", 0) for j in jobs.get((student, name), []))
                results.append(Result(student, name, score, max_score, "; ".join(pair_notes),
                                      devices if ran else "", round(seconds, 1)))
    return results


# ---- the report -------------------------------------------------------------------------


def format_table(results: list[Result]) -> str:
    """Students by assignment, ``score/max`` in each cell, then the total; notes below."""
    names = sorted({r.assignment for r in results})
    students = sorted({r.student for r in results})
    by_pair = {(r.student, r.assignment): r for r in results}
    header = ["student", *names, "total"]
    rows = []
    for student in students:
        cells, total, total_max = [student], 0.0, 0.0
        for name in names:
            result = by_pair[student, name]
            total_max += result.max_score
            if result.score is None:
                cells.append(f"-/{result.max_score:g}")
            else:
                total += result.score
                cells.append(f"{result.score:g}/{result.max_score:g}")
        cells.append(f"{total:g}/{total_max:g}")
        rows.append(cells)
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in [header, *rows]]
    lines.insert(1, "  ".join("-" * width for width in widths))
    notes = [f"{r.student} / {r.assignment}: {r.note}" for r in results if r.note and r.note != "not submitted"]
    if notes:
        lines += ["", "Notes:", *(f"  {note}" for note in notes)]
    return "\n".join(lines)


def write_csv(results: list[Result], path: Path) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(["student", "assignment", "score", "max_score", "devices", "seconds", "note"])
        for r in results:
            writer.writerow([r.student, r.assignment, "" if r.score is None else f"{r.score:g}", f"{r.max_score:g}",
                             r.devices, f"{r.seconds:g}", r.note])


def write_histogram(results: list[Result], path: Path) -> None:
    """A PNG histogram of each student's total, as a percentage of the points of the course."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    totals: dict[str, list[float]] = {}
    for r in results:
        got, most = totals.setdefault(r.student, [0.0, 0.0])
        totals[r.student] = [got + (r.score or 0.0), most + r.max_score]
    percents = [100 * got / most if most else 0.0 for got, most in totals.values()]
    figure, axes = plt.subplots(figsize=(6, 3.5), dpi=100)
    axes.hist(percents, bins=[0, 10, 20, 30, 40, 50, 60, 70, 80, 90, 100.001], color="#4472c4", edgecolor="white")
    axes.set_xlabel("total score (% of the course's points)")
    axes.set_ylabel("students")
    axes.set_title(f"Scores of {len(percents)} students")
    axes.yaxis.get_major_locator().set_params(integer=True)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m autograder.grade", description=__doc__.split("\n\n")[0],
                                     epilog="Writes report.txt, scores.csv, scores.png and feedback/ in the work folder.")
    parser.add_argument("--submitted", type=Path, default=DEMO_CLASS,
                        help="folder of <student>/<assignment>/ submissions (default: the demo class)")
    parser.add_argument("--workdir", type=Path, default=WORKDIR,
                        help="scratch folder for this run, emptied first (default: build/grade)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="notebooks graded at once (default: one per core, here %(default)s)")
    parser.add_argument("--cell-timeout", type=float, default=CELL_TIMEOUT_S, metavar="SECONDS",
                        help="wall-time limit of one cell (default: %(default)g)")
    parser.add_argument("--time-limit", type=float, default=TIME_LIMIT_S, metavar="SECONDS",
                        help="wall-time limit of one notebook (default: %(default)g)")
    parser.add_argument("--memory-limit-mib", type=int, default=MEMORY_LIMIT_MIB, metavar="MIB",
                        help="memory limit of every process of a submission, 0 for none (default: %(default)s)")
    parser.add_argument("--db-url", default=None,
                        help=f"gradebook URL, e.g. postgresql://user:password@host/db for several graders "
                             f"(default: ${GRADEBOOK_ENV}, else SQLite in the work folder)")
    parser.add_argument("--no-feedback", action="store_true", help="skip the feedback HTML")
    parser.add_argument("--no-sandbox", action="store_true",
                        help="run kernels without namespaces (limits on time and memory still hold)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    if not args.submitted.is_dir():
        parser.error(f"no submissions folder at {args.submitted}")
    settings = Settings(jobs=args.jobs, cell_timeout_s=args.cell_timeout, time_limit_s=args.time_limit,
                        memory_mib=args.memory_limit_mib, db_url=args.db_url, feedback=not args.no_feedback,
                        progress=not args.quiet, sandbox=not args.no_sandbox)
    db_url = gradebook_url(settings, args.workdir)
    if settings.db_url or os.environ.get(GRADEBOOK_ENV):
        problem = gradebook_problem(db_url)
        if problem:
            parser.exit(2, f"cannot open the gradebook at {shown_url(db_url)}: {problem}\n")
    isolation = settings.isolation()
    header = [f"Grading {args.submitted} with {settings.jobs} notebook(s) at a time.",
              f"Gradebook: {shown_url(db_url)}",
              f"Devices every submission is checked on: {devices_text()}", "Limits on each submission:",
              *(f"  {line}" for line in isolation.describe(settings.memory_mib, settings.time_limit_s,
                                                             settings.cell_timeout_s))]
    print("\n".join(header), flush=True)
    started = time.monotonic()
    results = grade(args.submitted, args.workdir, settings)
    table = format_table(results)
    workdir = args.workdir.resolve()
    write_csv(results, workdir / "scores.csv")
    write_histogram(results, workdir / "scores.png")
    footer = f"Graded in {time.monotonic() - started:.0f} s. Written to {workdir}: scores.csv, scores.png, report.txt" + \
             (", feedback/" if settings.feedback else "")
    (workdir / "report.txt").write_text("\n".join([*header, "", table, "", footer]) + "\n")
    print("\n" + table + "\n\n" + footer)
    return 0


if __name__ == "__main__":
    sys.exit(main())
