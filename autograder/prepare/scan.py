"""Read the student's code, without running it, for reaches into the grading machinery.

A notebook with findings has its score withheld for the instructor's review
(see :mod:`autograder.judge.verdict`).
"""

from __future__ import annotations

import ast

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
    # inspect's ways to the caller's frames (a test's source and locals); getsource on what you hold is fine
    "currentframe", "getouterframes", "getinnerframes", "getframeinfo",
}
INSPECT_FRAMES = {"stack", "trace"}  # inspect.stack(), inspect.trace(): names too common to flag alone (torch.stack)

FORBIDDEN_DOTTED = {"sys.modules", "os.kill", "os.killpg", "os._exit", "os.abort", "signal.signal"}

# gc and inspect are taught (gc.collect in 08, inspect.getsource in 07): their dangerous parts are attributes above.
FORBIDDEN_MODULES = {"ctypes", "builtins", "signal", "IPython", "ipykernel"}
# What a notebook shows with (08 shows a picture); imported by name, they reach no shell.
DISPLAY_HELPERS = {"display", "Image", "HTML", "Markdown", "Math", "SVG", "JSON", "clear_output", "update_display"}


def scan(cells: list) -> list[str]:
    """What in the student's code reaches into the grading machinery: one line per finding, [] if nothing.

    Flags the names, attributes and modules above, and any attribute the code assigns or deletes on a
    module it imported (``torch.allclose = ...``, ``setattr(devcourse.grading, ...)``).
    """
    trees = []
    for cell in cells:
        try:
            trees.append(ast.parse(ipython_free(cell.source)))
        except SyntaxError:
            continue
    modules, inspect_names = _imported(trees)
    findings = []
    for tree in trees:
        for node in ast.walk(tree):
            name = _forbidden_use(node, inspect_names)
            if name:
                findings.append(f"line {node.lineno} uses {name}")
            findings += _changes(node, modules)
    return sorted(set(findings), key=lambda f: int(f.split()[1]))


def _imported(trees: list[ast.Module]) -> tuple[set[str], set[str]]:
    """The names the code binds to modules it imports, and the names it gives ``inspect``."""
    modules: set[str] = set()
    inspect_names = {"inspect"}
    for tree in trees:
        for node in ast.walk(tree):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            for alias in node.names:
                modules.add(alias.asname or alias.name.split(".")[0])
                if isinstance(node, ast.Import) or alias.name in ("testing", "nn", "grading"):
                    modules.add(alias.asname or alias.name)
                if isinstance(node, ast.Import) and alias.name == "inspect" and alias.asname:
                    inspect_names.add(alias.asname)
    return modules, inspect_names


def _forbidden_use(node: ast.AST, inspect_names: set[str]) -> str | None:
    """The forbidden name, attribute or module ``node`` uses, or None."""
    frames = INSPECT_FRAMES | FORBIDDEN_ATTRIBUTES
    if isinstance(node, ast.Name):
        return node.id if node.id in FORBIDDEN_NAMES else None
    if isinstance(node, ast.Attribute):
        if isinstance(node.value, ast.Name) and node.value.id in inspect_names and node.attr in INSPECT_FRAMES:
            return f"inspect.{node.attr}"
        dotted = f"{node.value.id}.{node.attr}" if isinstance(node.value, ast.Name) else ""
        return dotted if dotted in FORBIDDEN_DOTTED else node.attr if node.attr in FORBIDDEN_ATTRIBUTES else None
    if isinstance(node, ast.ImportFrom) and node.module == "inspect" and any(a.name in frames for a in node.names):
        return "inspect." + next(a.name for a in node.names if a.name in frames)
    if isinstance(node, ast.Import):
        return next((a.name for a in node.names if a.name.split(".")[0] in FORBIDDEN_MODULES), None)
    if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in FORBIDDEN_MODULES and \
            not (node.module == "IPython.display" and {a.name for a in node.names} <= DISPLAY_HELPERS):
        return node.module
    return None


def _changes(node: ast.AST, modules: set[str]) -> list[str]:
    """The findings of ``node`` assigning, deleting or setting an attribute of an imported module."""
    targets = []
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
        targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("setattr", "delattr"):
        targets = node.args[:1]
    found = []
    for target in targets:
        root = target
        while isinstance(root, ast.Attribute):
            root = root.value
        if root is not target and isinstance(root, ast.Name) and root.id in modules:
            found.append(f"line {node.lineno} changes {ast.unparse(target)}")
        elif target is not node and isinstance(target, ast.Name) and target.id in modules and \
                isinstance(node, ast.Call):
            found.append(f"line {node.lineno} changes an attribute of module {target.id}")
    return found


def ipython_free(source: str) -> str:
    """Cell source with IPython's ``%magic`` and ``!shell`` lines blanked, so ``ast`` can read it."""
    return "\n".join("" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())
