"""One job: a notebook of one student's assignment, prepared for the sandboxed runner and run.

:func:`prepare` writes the assembled notebook (each test cell wrapped: the
guard first, the course's imports again, comparisons made strict, and a
secret marker printed last), the student's working copy and the runner's
settings; :func:`execute` runs :mod:`autograder.runner` on it in its own
process.
"""

from __future__ import annotations

import ast
import hashlib
import hmac
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from autograder import sandbox
from autograder.pipeline import ROOT, tool_env
from autograder.scan import ipython_free, scan
from autograder.settings import Settings
from autograder.submission import assemble, is_answer, is_test, nbgrader_meta


@dataclass
class Job:
    student: str
    assignment: str
    notebook: str
    folder: Path  # this job's own folder in the work folder
    markers: dict[str, str] = field(default_factory=dict)  # grade_id -> what the test prints when it passes
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


def strict_comparisons(source: str, guard_name: str) -> str:
    """A test's source with every ``a == b`` / ``a != b`` checked by the guard (see :mod:`autograder.guard`)."""
    try:
        tree = ast.parse(ipython_free(source))
    except SyntaxError:
        return source
    return ast.unparse(ast.fix_missing_locations(_StrictComparisons(guard_name).visit(tree)))


def prepare(job: Job, source: nbformat.NotebookNode, submitted: nbformat.NotebookNode, submitted_dir: Path,
            secret: bytes, guard_name: str, settings: Settings, isolation: sandbox.Isolation, ipc_root: Path,
            imports: str, read_only: list[str]) -> Path:
    """Write the job's assembled notebook, working copy and runner settings; return the job file.

    ``imports`` is the source's import lines (:func:`course_imports`), ``read_only`` the folders Python imports from.
    """
    nb = assemble(source, submitted)
    course_cells = {c.get("id") for c in source.cells if not is_answer(c)}
    student_cells = [c for c in nb.cells if c.cell_type == "code" and (is_answer(c) or not nbgrader_meta(c))
                     and c.get("id") not in course_cells]
    job.findings = scan(student_cells)
    for cell in nb.cells:
        if is_test(cell):
            grade_id = nbgrader_meta(cell)["grade_id"]
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
