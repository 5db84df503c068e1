"""What a student's probe leaves out (:mod:`autograder.prepare.probes`): the names and parameters of
a test that only feed its expected sides, which a student's run of the test never binds, so no
answer can read them."""

from __future__ import annotations

import ast

# what a student's probe binds instead of a loop target that only feeds expectations
UNBOUND = "_course_probe_unused"


def dotted(node: ast.AST) -> str:
    """A name or attribute chain as written (``torch.testing.assert_close``); "" for anything
    else."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.insert(0, node.attr)
        node = node.value
    return ".".join([node.id, *parts]) if isinstance(node, ast.Name) else ""


def _positions(tree: ast.AST, excluded: list[ast.AST]) -> tuple[set[str], set[str]]:
    """Names loaded inside the excluded expressions, and names loaded anywhere else."""
    inside = {id(n) for e in excluded for n in ast.walk(e)}
    there, elsewhere = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            (there if id(node) in inside else elsewhere).add(node.id)
    return there, elsewhere


class Unbind(ast.NodeTransformer):
    """In a student's probe: names that only feed expected sides are never bound (an assignment
    keeps any side effect, a loop binds a throwaway name instead), and the test's own helpers get
    None for parameters that only feed expected sides. ``scopes`` maps a function's path in the cell
    ("" for the cell's top level) to those names."""

    def __init__(self, scopes: dict[str, set[str]], parameters: dict[str, list[tuple[int, str]]]):
        self.scopes, self.parameters, self.path = scopes, parameters, [""]

    @property
    def names(self) -> set[str]:
        return self.scopes.get(self.path[-1], set())

    def visit_FunctionDef(self, node: ast.FunctionDef) -> ast.AST:
        self.path.append(f"{self.path[-1]}.{node.name}".lstrip("."))
        try:
            return self.generic_visit(node)
        finally:
            self.path.pop()

    visit_AsyncFunctionDef = visit_FunctionDef

    def visit_Assign(self, node: ast.Assign) -> ast.AST:
        if all(isinstance(t, ast.Name) and t.id in self.names for t in node.targets):
            if any(isinstance(n, ast.Call) for n in ast.walk(node.value)):  # keep its side effects
                return ast.copy_location(ast.Expr(self.visit(node.value)), node)
            return ast.copy_location(ast.Pass(), node)
        return self.generic_visit(node)

    def visit_For(self, node: ast.For) -> ast.AST:
        # the loop goes on; its expected-only targets are not bound
        for target in ast.walk(node.target):
            if isinstance(target, ast.Name) and target.id in self.names:
                target.id = UNBOUND
        return self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> ast.AST:
        self.generic_visit(node)
        for index, name in self.parameters.get(dotted(node.func), []):
            if index < len(node.args) and not isinstance(node.args[index], ast.Starred):
                node.args[index] = ast.Constant(None)
            for keyword in node.keywords:
                if keyword.arg == name:
                    keyword.value = ast.Constant(None)
        return node


def _bound_here(body: list[ast.stmt]) -> set[str]:
    """The names a scope binds itself (its nested functions, classes and comprehensions left
    out)."""
    names = set()

    def visit(node):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
            return
        if isinstance(
            node, (ast.Lambda, ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
        ):
            return
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        for child in ast.iter_child_nodes(node):
            visit(child)

    for statement in body:
        visit(statement)
    return names


def _functions(node: ast.AST, path: str = ""):
    """Every function defined in ``node``, with its path of names ("check", "check.helper")."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
            inner = f"{path}.{child.name}".lstrip(".")
            yield inner, child
            yield from _functions(child, inner)
        else:
            yield from _functions(child, path)


def expected_only(trees: list[ast.AST], analyses: list) -> list[dict[str, set[str]]]:
    """For each test cell: scope path -> the names bound there that are loaded only on expected
    sides.

    The cells' top level is one scope across the notebook (a later test may read an earlier one's
    names)."""
    excluded = [e for analysis in analyses for e in analysis.expected]  # each a probes._Rewrite
    bound_top = set().union(*(_bound_here(tree.body) for tree in trees)) if trees else set()
    there, elsewhere = set(), set()
    for tree in trees:
        a, b = _positions(tree, excluded)
        there |= a
        elsewhere |= b
    top = bound_top & (there - elsewhere)
    scopes = []
    for tree, analysis in zip(trees, analyses):
        found = {"": top}
        for path, function in _functions(tree):
            if function.name in analysis.workers:
                continue
            arguments = function.args
            bound = _bound_here(function.body) | {
                a.arg for a in [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs]
            }
            inside, outside = _positions(function, excluded)
            found[path] = bound & (inside - outside)
        scopes.append(found)
    return scopes


def expected_parameters(
    trees: list[ast.AST], scopes: list[dict[str, set[str]]]
) -> dict[str, list[tuple[int, str]]]:
    """For each function the tests define at a cell's top level: its parameters (position, name)
    used only on expected sides, which a student's probe does not pass."""
    found = {}
    for tree, scope in zip(trees, scopes):
        for node in tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in scope:
                arguments = [a.arg for a in [*node.args.posonlyargs, *node.args.args]]
                dropped = [(i, a) for i, a in enumerate(arguments) if a in scope[node.name]]
                if dropped:
                    found[node.name] = dropped
    return found
