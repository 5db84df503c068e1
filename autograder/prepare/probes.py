"""Tests as probes: each test's verdict is decided in the grader, from values, never by the kernel.

After a notebook's cells (phase A, the only output shown), the runner (:mod:`autograder.run.runner`)
runs each test again, whole, as rewritten by :func:`notebook_probes` (phase B): its assertions
record values through :mod:`autograder.inside.recorder` instead of deciding. :mod:`autograder.judge`
compares them, outside every kernel, with the instructor's (:mod:`autograder.judge.reference`).
"""

from __future__ import annotations

import ast
import functools
from dataclasses import dataclass

from autograder.course.cells import hidden_line_numbers
from autograder.prepare.scan import ipython_free
from autograder.prepare.unbind import Unbind, dotted, expected_only, expected_parameters

# The calls whose first argument is the actual value and whose other arguments are the expectation.
VALUE_CALLS = {
    "assert_tensor": "tensor",
    "torch.testing.assert_close": "assert_close",
    "testing.assert_close": "assert_close",
    "assert_close": "assert_close",
}
VALUE_ASSERTS = {"torch.equal": "equal", "torch.allclose": "allclose"}
# Functions that run in other processes (DDP ranks): their assertions stay as written.
WORKER_RUNNERS = {"run_functions"}
# What a probe hands its recorder's end, for the runner to replace with a token of that run of it:
# the record it publishes is told apart from any other display of the same type
# (autograder.run.session.Session.probes).
PROBE_TOKEN = "_course_probe_token"


@dataclass(frozen=True)
class Site:
    """One assertion of a test: its number, what kind of comparison, whether it is hidden, and its
    source."""

    id: int
    kind: str  # "eq", "tensor", "equal", "allclose", "assert_close" (value comparisons) or "check"
    hidden: bool
    text: str
    actual: str = ""  # a value comparison's actual side, as ast.unparse writes it


def worker_functions(tree: ast.AST) -> set[str]:
    """Names of the functions a test hands to another process (every name in a ``run_functions``
    call)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and dotted(node.func).split(".")[-1] in WORKER_RUNNERS:
            for argument in [*node.args, *(k.value for k in node.keywords)]:
                names.update(n.id for n in ast.walk(argument) if isinstance(n, ast.Name))
    return names


class _Rewrite(ast.NodeTransformer):
    """Number the assertions of a test and rewrite them into recorder calls (see the module
    docstring)."""

    def __init__(self, source: str, recorder: str, reference: bool, first: int = 0):
        self.source, self.recorder, self.reference, self.first = source, recorder, reference, first
        self.hidden = hidden_line_numbers(source)
        self.sites: list[Site] = []
        # expected sides and messages: not sent to a student's kernel
        self.expected: list[ast.AST] = []
        self.workers: set[str] = set()

    def _site(self, kind: str, node: ast.AST, actual: ast.expr | None = None) -> int:
        text = (ast.get_source_segment(self.source, node) or ast.unparse(node)).strip()
        self.sites.append(
            Site(
                self.first + len(self.sites),
                kind,
                node.lineno in self.hidden,
                " ".join(text.split()),
                ast.unparse(actual) if actual is not None else "",
            )
        )
        return self.sites[-1].id

    def _call(self, method: str, *args: ast.expr) -> ast.Call:
        return ast.Call(
            func=ast.Attribute(
                value=ast.Name(self.recorder, ast.Load()), attr=method, ctx=ast.Load()
            ),
            args=list(args),
            keywords=[],
        )

    def _value(self, kind: str, node: ast.AST, actual: ast.expr, expected: ast.expr) -> ast.Call:
        site = self._site(kind, node, actual)
        self.expected.append(expected)
        actual = self.visit(actual)
        args = [ast.Constant(site), actual] + ([expected] if self.reference else [])
        return self._call("value", *args)

    def _expectation(self, call: ast.Call, names: tuple[str, ...]) -> ast.expr:
        """A call's arguments after the first, as a dict the grader reads: {"args": [...], "kwargs":
        {...}}."""
        keywords = [k for k in call.keywords if k.arg is not None]
        return ast.Dict(
            keys=[ast.Constant("args"), ast.Constant("kwargs")],
            values=[
                ast.List(elts=list(call.args[1:]), ctx=ast.Load()),
                ast.Dict(
                    keys=[ast.Constant(k.arg) for k in keywords], values=[k.value for k in keywords]
                ),
            ],
        )

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        if node.name in self.workers:  # runs in another process, where there is no recorder
            return node
        return self.generic_visit(node)

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Assert(self, node: ast.Assert) -> list[ast.stmt]:
        if node.msg is not None:
            self.expected.append(node.msg)
        parts = (
            node.test.values
            if isinstance(node.test, ast.BoolOp) and isinstance(node.test.op, ast.And)
            else [node.test]
        )
        statements = []
        for test in parts:
            call = None
            if (
                isinstance(test, ast.Compare)
                and len(test.ops) == 1
                and isinstance(test.ops[0], ast.Eq)
            ):
                call = self._value("eq", test, test.left, test.comparators[0])
            elif (
                isinstance(test, ast.Call)
                and VALUE_ASSERTS.get(dotted(test.func))
                and test.args
                and not any(k.arg is None for k in test.keywords)
            ):
                call = self._value(
                    VALUE_ASSERTS[dotted(test.func)],
                    test,
                    test.args[0],
                    self._expectation(test, ()),
                )
            if call is None:
                site = self._site("check", test)
                call = self._call("check", ast.Constant(site), self.visit(test))
            statements.append(ast.copy_location(ast.Expr(call), node))
        return statements

    def visit_Call(self, node: ast.Call) -> ast.AST:
        kind = VALUE_CALLS.get(dotted(node.func))
        if kind and node.args and not any(k.arg is None for k in node.keywords):
            return ast.copy_location(
                self._value(kind, node, node.args[0], self._expectation(node, ())), node
            )
        return self.generic_visit(node)


def _wrap_hidden(
    body: list[ast.stmt], hidden: set[int], recorder: str, workers: set[str]
) -> list[ast.stmt]:
    """Put each run of hidden statements of ``body`` (and of the bodies inside it) in ``with
    RECORDER.hidden():``."""
    out: list[ast.stmt] = []
    run: list[ast.stmt] = []

    def flush():
        if run:
            item = ast.withitem(
                context_expr=ast.Call(
                    func=ast.Attribute(
                        value=ast.Name(recorder, ast.Load()), attr="hidden", ctx=ast.Load()
                    ),
                    args=[],
                    keywords=[],
                )
            )
            out.append(ast.copy_location(ast.With(items=[item], body=list(run)), run[0]))
            run.clear()

    for statement in body:
        # A hidden statement is wrapped whole; a class body may hold only definitions; workers run
        # elsewhere.
        if (
            statement.lineno in hidden
            or isinstance(statement, ast.ClassDef)
            or isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef))
            and statement.name in workers
        ):
            pass
        else:
            for field in ("body", "orelse", "finalbody", "handlers"):
                inner = getattr(statement, field, None)
                if isinstance(inner, list) and inner and isinstance(inner[0], ast.stmt):
                    setattr(statement, field, _wrap_hidden(inner, hidden, recorder, workers))
                elif field == "handlers" and inner:
                    for handler in inner:
                        handler.body = _wrap_hidden(handler.body, hidden, recorder, workers)
        worker = (
            isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef))
            and statement.name in workers
        )
        # a worker's source is sent elsewhere as it stands
        if statement.lineno in hidden and not worker:
            run.append(statement)
        else:
            flush()
            out.append(statement)
    flush()
    return out


def notebook_probes(
    tests: list[str], recorder: str, reference: bool = False
) -> tuple[list[str], list[Site]]:
    """The probes of a notebook's test cells (their sources, in order), and the sites of them all.

    Sites are numbered across the notebook: a helper one test defines and a later test calls records
    the helper's own sites. ``recorder`` is the name under which :mod:`autograder.inside.recorder`
    was installed in the kernel's builtins. ``reference=True`` gives the instructor's probes, which
    record the expected sides too and mark what ran inside the hidden parts; the default gives a
    student's probes, which never hold an expected side.

    Every submission of an assignment has the instructor's tests, and the grader asks twice per
    submission (its job's probes, then its verdict's sites): the answer for the same tests is kept,
    whatever the recorder's name.

    A value comparison (``assert L == R``, ``assert_tensor(A, E, device)``, ``torch.equal``,
    ``torch.allclose``, ``torch.testing.assert_close``) becomes "record L (or A)": the expected
    side, the device and the tolerances are not sent to a student's kernel, nor a name bound or a
    helper's parameter that only feeds them. Any other assertion (``is``, ``in``, ``<``,
    ``isinstance``, a plain condition) is a *check*, recorded as True or False. So a kernel that
    records, prints, silences or skips what it likes passes nothing: a test passes only when the
    submission produced, on the test's inputs (hidden ones included), values the reference's
    expected side accepts, event by event in the same order. A check can be faked by code that
    tampers with the kernel, so every test of the course has at least one value comparison among its
    hidden checks (``tests/autograder/judge/test_probe.py`` proves it). A test counts when its
    phase-A cell raised nothing and its probe matches the reference.
    """
    bodies, sites = _notebook_probes(tuple(tests), reference)
    # the recorder's name differs per job, so it is bound above the kept rest of each probe
    bind = f"{_LOCAL} = __import__('builtins').__dict__[{recorder!r}]\n"
    return [bind + body for body in bodies], list(sites)


_LOCAL = "_course_probe"  # the probes' name for the recorder (no "__": a class would mangle it)


@functools.lru_cache(maxsize=64)
def _notebook_probes(
    tests: tuple[str, ...], reference: bool
) -> tuple[tuple[str, ...], tuple[Site, ...]]:
    local = _LOCAL
    sources = [ipython_free(source) for source in tests]
    sites: list[Site] = []
    analyses, trees = [], []
    for source in sources:
        workers = worker_functions(ast.parse(source))
        # sees every expected side in place
        analysis = _Rewrite(source, local, reference=True, first=len(sites))
        analysis.workers = workers
        trees.append(analysis.visit(ast.parse(source)))
        analyses.append(analysis)
        sites += analysis.sites
    if not reference:
        scopes = expected_only(trees, analyses)
        parameters = expected_parameters(trees, scopes)
        trees = []
        for source, analysis, scope in zip(sources, analyses, scopes):
            student = _Rewrite(source, local, reference=False, first=analysis.first)
            student.workers = analysis.workers
            tree = student.visit(ast.parse(source))
            trees.append(Unbind(scope, parameters).visit(tree))
    probes = []
    for tree, analysis in zip(trees, analyses):
        body = tree.body
        if reference:
            body = _wrap_hidden(body, analysis.hidden, local, analysis.workers)
        handler = ast.ExceptHandler(
            type=ast.Name("BaseException", ast.Load()),
            name="_course_probe_error",
            body=[
                ast.Expr(
                    ast.Call(
                        func=ast.Attribute(
                            value=ast.Name(local, ast.Load()), attr="raised", ctx=ast.Load()
                        ),
                        args=[ast.Name("_course_probe_error", ast.Load())],
                        keywords=[],
                    )
                )
            ],
        )
        module = ast.Module(
            body=[
                ast.parse(f"{local}.begin()").body[0],
                ast.Try(body=body or [ast.Pass()], handlers=[handler], orelse=[], finalbody=[]),
                ast.parse(f"{local}.end({PROBE_TOKEN!r})").body[0],
            ],
            type_ignores=[],
        )
        probes.append(ast.unparse(ast.fix_missing_locations(module)))
    return tuple(probes), tuple(sites)


def probe_source(source: str, recorder: str, reference: bool = False) -> tuple[str, list[Site]]:
    """The probe of one test cell, alone in its notebook, and its sites (see
    :func:`notebook_probes`)."""
    probes, sites = notebook_probes([source], recorder, reference)
    return probes[0], sites


def notebook_sites(tests: list[str]) -> list[Site]:
    """The sites of a notebook's test cells, numbered across the notebook (see
    :func:`notebook_probes`)."""
    return notebook_probes(tests, "_", reference=True)[1]


def sites_of(source: str) -> list[Site]:
    """The sites of a test cell alone in its notebook."""
    return notebook_sites([source])
