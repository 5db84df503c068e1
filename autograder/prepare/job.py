"""One job: a notebook of one student's assignment, prepared for the sandboxed runner.

:func:`prepare` writes the assembled notebook, whose test cells are the visible tests the student
sees (each after the guard and the course's imports, its comparisons made strict), the probe of
every test (:mod:`autograder.prepare.probes`) and the student's working copy;
:mod:`autograder.run.jobfile` adds where and how it runs on a machine.
"""

from __future__ import annotations

import ast
import functools
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from autograder.course.config import DEFAULT_STUBS
from autograder.course.cells import is_answer, is_test, nbgrader_meta, visible_source
from autograder.prepare.probes import notebook_probes, worker_functions
from autograder.prepare.scan import ipython_free, names_stand_in, scan
from autograder.prepare.status import Status
from autograder.prepare.submission import assemble


@dataclass
class Job:
    student: str
    assignment: str
    notebook: str
    folder: Path  # this job's own folder in the work folder
    findings: list[str] = field(default_factory=list)
    status: Status = field(default_factory=Status)  # what its run said, once it ran


def course_imports(source: nbformat.NotebookNode) -> str:
    """The course's own import statements, re-run before each test so its names mean what they
    meant."""
    lines = []
    for cell in source.cells:
        if cell.cell_type != "code" or is_answer(cell) or is_test(cell):
            continue
        try:
            tree = ast.parse(ipython_free(cell.source))
        except SyntaxError:
            continue
        lines += [
            ast.unparse(node)
            for node in tree.body
            if isinstance(node, (ast.Import, ast.ImportFrom))
        ]
    return "\n".join(dict.fromkeys(lines))


class _StrictComparisons(ast.NodeTransformer):
    def __init__(self, guard_name: str):
        self.guard_name = guard_name

    def visit_Compare(self, node: ast.Compare) -> ast.AST:
        self.generic_visit(node)
        if len(node.ops) != 1 or not isinstance(node.ops[0], (ast.Eq, ast.NotEq)):
            return node
        function = "eq" if isinstance(node.ops[0], ast.Eq) else "ne"
        # Functions a test ships to other processes (DDP ranks) have no guard there: operator.eq/ne
        # instead.
        checker = ast.parse(
            f"__import__('builtins').__dict__.get({self.guard_name!r}, __import__('operator'))",
            mode="eval",
        ).body
        call = ast.Call(
            func=ast.Attribute(value=checker, attr=function, ctx=ast.Load()),
            args=[node.left, node.comparators[0]],
            keywords=[],
        )
        return ast.copy_location(call, node)

    # torch.equal(a, b) and the like -> the guard's checked version (torch's own where there is no
    # guard)
    TENSOR_CHECKS = {
        ("torch", "equal"): "torch",
        ("torch", "allclose"): "torch",
        ("torch", "isclose"): "torch",
        ("torch", "testing", "assert_close"): "torch.testing",
    }

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
        checker = ast.parse(
            f"__import__('builtins').__dict__.get({self.guard_name!r}, "
            f"__import__('importlib').import_module({fallback!r}))",
            mode="eval",
        ).body
        node.func = ast.Attribute(value=checker, attr=path[-1], ctx=ast.Load())
        return node


def test_prelude(guard_name: str, imports: str, probe: bool = False, keep: tuple = ()) -> str:
    """What the grader runs in a test's cell before the test: its guard's start, then the course's
    imports (:func:`course_imports`); a traceback counts these lines too
    (:func:`autograder.record.hints.frame_as_written`).

    A ``probe``'s guard ran in a cell of its own just before
    (:meth:`autograder.run.session.Session.probes`): its first line takes its own source out of
    ``linecache`` instead, all but the line ranges ``keep``.
    """
    return (
        f"{guard_name}.forget({list(keep)!r})\n{imports}\n"
        if probe
        else f"{guard_name}()\n{imports}\n"
    )


@functools.lru_cache(maxsize=1024)  # every submission of an assignment has the same tests
def probe_cell(test: str, probe: str, guard_name: str, imports: str) -> str:
    """The cell that runs ``probe``, the probe of the test cell ``test``: what the probe's functions
    that run in another process need of the source (they are sent there as they stand) stays in
    ``linecache``, nothing else."""
    body = strict_comparisons(probe, guard_name)
    offset = test_prelude(guard_name, imports).count("\n")
    workers = worker_functions(ast.parse(ipython_free(test)))
    keep = [
        (
            min([node.lineno, *(d.lineno for d in node.decorator_list)]) + offset,
            node.end_lineno + offset,
        )
        for node in ast.walk(ast.parse(body))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in workers
    ]
    return test_prelude(guard_name, imports, probe=True, keep=keep) + body


@functools.lru_cache(maxsize=1024)  # the same tests in every submission; the tree is only read
def _strict(source: str, guard_name: str) -> tuple[ast.Module, str] | None:
    """The test's tree, its comparisons checked by the guard, and that tree's source; None if not
    Python."""
    try:
        tree = ast.parse(ipython_free(source))
    except SyntaxError:
        return None
    return tree, ast.unparse(ast.fix_missing_locations(_StrictComparisons(guard_name).visit(tree)))


def strict_comparisons(source: str, guard_name: str) -> str:
    """A test's source with every ``a == b`` / ``a != b`` and ``torch.equal``-like call checked by
    the guard.

    See :mod:`autograder.inside.guard`.
    """
    strict = _strict(source, guard_name)
    return source if strict is None else strict[1]


def strict_lines(source: str, guard_name: str) -> tuple[list[str], dict[int, int]]:
    """The lines of :func:`strict_comparisons`, and for each line that begins a statement (an
    ``except`` clause, a decorator) the line of ``source`` it begins on (both counted from 1): how a
    traceback of the test as it ran maps to the test as written. Without the map (``{}``) where
    ``source`` is not Python."""
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


def prepare(
    job: Job,
    source: nbformat.NotebookNode,
    submitted: nbformat.NotebookNode,
    submitted_dir: Path,
    guard_name: str,
    imports: str,
    reference: bool = False,
    stubs: tuple[str, str] = DEFAULT_STUBS,
    stand_ins: tuple[str, ...] = (),
) -> dict:
    """Write the job's assembled notebook, working copy and what its verdict needs; return what the
    runner runs (the names of the guard and the recorder in the kernel, and each test's probe).

    ``imports`` are the source's import lines (:func:`course_imports`); ``reference`` makes the
    instructor's probes, which record the expected sides too (the canary's run); ``stubs``, what an
    answer cell the student deleted gets (:func:`~autograder.prepare.submission.assemble`);
    ``stand_ins``, the device types the grader simulates
    (:attr:`autograder.course.profile.CourseProfile.stand_ins`), which an answer names only where
    its exercise's solution does.
    """
    nb = assemble(source, submitted, stubs)
    course_cells = {c.get("id") for c in source.cells if not is_answer(c)}
    student_cells = [
        c
        for c in nb.cells
        if c.cell_type == "code"
        and (is_answer(c) or not nbgrader_meta(c))
        and c.get("id") not in course_cells
    ]
    # its solution names one itself
    asked = frozenset(
        nbgrader_meta(c).get("grade_id", "")
        for c in source.cells
        if is_answer(c) and names_stand_in(c, stand_ins)
    )
    job.findings = scan(student_cells, stand_ins, asked)
    recorder_name = guard_name + "_probe"
    tests = [cell for cell in nb.cells if is_test(cell)]
    codes, _ = notebook_probes([cell.source for cell in tests], recorder_name, reference)
    probes = [
        [nbgrader_meta(cell)["grade_id"], probe_cell(cell.source, code, guard_name, imports)]
        for cell, code in zip(tests, codes)
    ]
    for cell in tests:
        cell.source = test_prelude(guard_name, imports) + strict_comparisons(
            visible_source(cell.source), guard_name
        )
    job.folder.mkdir(parents=True)
    work = job.folder / "work"
    shutil.copytree(submitted_dir, work, ignore=shutil.ignore_patterns(".ipynb_checkpoints"))
    nbformat.write(nb, job.folder / "in.ipynb")
    # What the verdict needs, kept for a review of a withheld score (autograder.record.review); the
    # kernel cannot see it.
    (job.folder / "verdict.json").write_text(json.dumps({"findings": job.findings}))
    return {"guard_name": guard_name, "recorder_name": recorder_name, "probes": probes}
