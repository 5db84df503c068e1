"""Read the student's code, without running it, for reaches into the grading machinery.

A notebook with findings has its score withheld for the instructor's review
(see :mod:`autograder.judge.verdict`).
"""

from __future__ import annotations

import ast
import functools
import re

from autograder.course.cells import nbgrader_meta

# Names no answer in this course needs, and that reach into the tests, the kernel or the grader.
FORBIDDEN_NAMES = {  # as a bare name
    "get_ipython",
    "__builtins__",
    "__import__",
    "exec",
    "eval",
    "compile",
    "globals",
    "breakpoint",
}

FORBIDDEN_ATTRIBUTES = {  # as an attribute, whatever it belongs to
    "showtraceback",
    "_showtraceback",
    "showsyntaxerror",
    "set_custom_exc",
    "CustomTB",
    "custom_exceptions",
    "run_cell",
    "run_cell_async",
    "run_ast_nodes",
    "run_code",
    "input_transformers_cleanup",
    "input_transformers_post",
    "ast_transformers",
    "InteractiveShell",
    "excepthook",
    "displayhook",
    "settrace",
    "setprofile",
    "get_referrers",
    "get_referents",
    "get_objects",
    "__code__",
    "__globals__",
    "f_globals",
    "f_locals",
    "f_back",
    "_getframe",
    "__builtins__",
    "__subclasses__",
    # inspect's ways to the caller's frames (a test's source and locals); getsource on what you hold
    # is fine
    "currentframe",
    "getouterframes",
    "getinnerframes",
    "getframeinfo",
}
# inspect.stack(), inspect.trace(): names too common to flag alone (torch.stack)
INSPECT_FRAMES = {"stack", "trace"}

FORBIDDEN_DOTTED = {"sys.modules", "os.kill", "os.killpg", "os._exit", "os.abort", "signal.signal"}

# gc and inspect are taught (gc.collect in 08, inspect.getsource in 07): their dangerous parts are
# attributes above.
FORBIDDEN_MODULES = {"ctypes", "builtins", "signal", "IPython", "ipykernel"}
# What a notebook shows with (08 shows a picture); imported by name, they reach no shell.
DISPLAY_HELPERS = {
    "display",
    "Image",
    "HTML",
    "Markdown",
    "Math",
    "SVG",
    "JSON",
    "clear_output",
    "update_display",
}


# IPython's magics whose argument (a line magic) or body (a cell magic) is Python: scanned as the
# cell's own code.
CODE_MAGICS = {"time", "timeit", "prun", "capture"}
QUIET_MAGICS = {"matplotlib", "pinfo", "pinfo2"}  # run nothing of the student's
# what IPython turns % and ! lines into
_MAGIC_CALLS = {"run_line_magic", "run_cell_magic", "system", "getoutput"}
# options of those magics that take a value
_VALUED_OPTIONS = {"-n", "-r", "-p", "-s", "-l", "-T", "-D"}
# the student's own get_ipython, told apart from the calls IPython writes
_LITERAL = "_scan_written_get_ipython"


def scan(
    cells: list, stand_ins: tuple[str, ...] = (), asked: frozenset[str] = frozenset()
) -> list[str]:
    """What in the student's code reaches into the grading machinery: one line per finding, [] if
    nothing.

    Reads the code as IPython runs it (``%`` and ``!`` lines included), and flags the names,
    attributes and modules above, any attribute the code assigns or deletes on a module it imported
    (``torch.allclose = ...``, ``setattr(devcourse.grading, ...)``), a magic or shell command that
    runs what the scan cannot read, and a string naming one of the course's simulated devices
    (``stand_ins``, ``"sim"`` or ``"sim:1"``) in an answer cell whose exercise does not name one
    itself (``asked``: those cells' grade_ids): an answer that tells the simulated device apart can
    be right only there.
    """
    trees = []
    for cell in cells:
        try:
            trees.append(
                (ast.parse(ipython_code(cell.source)), nbgrader_meta(cell).get("grade_id", ""))
            )
        except SyntaxError:
            continue
    modules, inspect_names = _imported([tree for tree, _ in trees])
    findings = []
    for tree, grade_id in trees:
        findings += _findings(
            tree, modules, inspect_names, stand_ins if grade_id not in asked else ()
        )
    return sorted(set(findings), key=lambda f: int(f.split()[1]))


def _findings(
    tree: ast.AST,
    modules: set[str],
    inspect_names: set[str],
    stand_ins: tuple[str, ...],
    offset: int = 0,
) -> list[str]:
    findings = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 1) + offset
        magic = _magic(node)
        if magic is not None:
            name, code = magic
            if code is not None:
                try:
                    findings += _findings(
                        ast.parse(code), modules, inspect_names, stand_ins, line - 1
                    )
                except SyntaxError:
                    findings.append(
                        f"line {line} runs IPython's %{name} on code the scan cannot read"
                    )
            elif name not in QUIET_MAGICS:
                what = (
                    "a shell command" if name in ("system", "getoutput") else f"IPython's %{name}"
                )
                findings.append(f"line {line} runs {what}, which the scan cannot read")
            continue
        name = _forbidden_use(node, inspect_names)
        if name:
            findings.append(f"line {line} uses {name}")
        if _names_stand_in(node, stand_ins):
            findings.append(
                f"line {line} names the simulated device {node.value!r}, which its exercise"
                " does not"
            )
        findings += [
            f"line {int(f.split()[1]) + offset} {f.split(' ', 2)[2]}"
            for f in _changes(node, modules)
        ]
    return findings


def _names_stand_in(node: ast.AST, stand_ins: tuple[str, ...]) -> bool:
    """Whether ``node`` is a string naming one of ``stand_ins`` as a device (``"sim"``,
    ``"sim:1"``)."""
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and node.value.split(":")[0] in stand_ins
        and node.value.partition(":")[2] in ("", *"0123456789")
    )


def names_stand_in(cell, stand_ins: tuple[str, ...]) -> bool:
    """Whether a cell's code, as IPython runs it, names one of ``stand_ins`` as a device (see
    :func:`scan`)."""
    try:
        tree = ast.parse(ipython_code(cell.source))
    except SyntaxError:
        return False
    return any(_names_stand_in(node, stand_ins) for node in ast.walk(tree))


def _magic(node: ast.AST) -> tuple[str, str | None] | None:
    """A call IPython wrote for a ``%`` or ``!`` line: (the magic's name, or "system"/"getoutput"
    for a shell command; the Python it runs, for :data:`CODE_MAGICS`, else None); None for any other
    node."""
    if not (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _MAGIC_CALLS
        and isinstance(node.func.value, ast.Call)
        and isinstance(node.func.value.func, ast.Name)
        and node.func.value.func.id == "get_ipython"
    ):
        return None
    words = [
        a.value if isinstance(a, ast.Constant) and isinstance(a.value, str) else ""
        for a in node.args
    ]
    if node.func.attr in ("system", "getoutput"):
        return node.func.attr, None
    name = words[0] if words else ""
    if name not in CODE_MAGICS:
        return name, None
    if node.func.attr == "run_cell_magic":
        return name, words[2] if len(words) > 2 else ""
    tokens = (words[1] if len(words) > 1 else "").split(" ")
    # %timeit -n 3 -r 2 f(x): the options, then the code
    while tokens and tokens[0].startswith("-"):
        if tokens.pop(0) in _VALUED_OPTIONS and tokens:
            tokens.pop(0)
    return name, " ".join(tokens)


@functools.lru_cache(maxsize=1)
def _transformer():
    from IPython.core.inputtransformer2 import TransformerManager

    return TransformerManager()


def ipython_code(source: str) -> str:
    """Cell source as IPython runs it: ``%magic`` and ``!shell`` lines as the calls IPython makes of
    them. A ``get_ipython`` the student wrote is renamed, so that only the calls IPython wrote keep
    that name."""
    renamed = re.sub(r"\bget_ipython\b", _LITERAL, source)
    # IPython drops leading blank lines: lines keep their numbers
    blank = len(renamed) - len(renamed.lstrip("\n"))
    try:
        return "\n" * blank + _transformer().transform_cell(renamed)
    except Exception:  # noqa: BLE001 - what IPython cannot transform, it cannot run either
        return ipython_free(renamed)


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
        return (
            "get_ipython"
            if node.id == _LITERAL
            else node.id
            if node.id in FORBIDDEN_NAMES - {"get_ipython"}
            else None
        )
    if isinstance(node, ast.Attribute):
        if (
            isinstance(node.value, ast.Name)
            and node.value.id in inspect_names
            and node.attr in INSPECT_FRAMES
        ):
            return f"inspect.{node.attr}"
        dotted = f"{node.value.id}.{node.attr}" if isinstance(node.value, ast.Name) else ""
        return (
            dotted
            if dotted in FORBIDDEN_DOTTED
            else node.attr
            if node.attr in FORBIDDEN_ATTRIBUTES
            else None
        )
    if (
        isinstance(node, ast.ImportFrom)
        and node.module == "inspect"
        and any(a.name in frames for a in node.names)
    ):
        return "inspect." + next(a.name for a in node.names if a.name in frames)
    if isinstance(node, ast.Import):
        return next((a.name for a in node.names if a.name.split(".")[0] in FORBIDDEN_MODULES), None)
    if (
        isinstance(node, ast.ImportFrom)
        and (node.module or "").split(".")[0] in FORBIDDEN_MODULES
        and not (
            node.module == "IPython.display" and {a.name for a in node.names} <= DISPLAY_HELPERS
        )
    ):
        return node.module
    return None


def _changes(node: ast.AST, modules: set[str]) -> list[str]:
    """The findings of ``node`` assigning, deleting or setting an attribute of an imported
    module."""
    targets = []
    if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Delete)):
        targets = node.targets if isinstance(node, (ast.Assign, ast.Delete)) else [node.target]
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("setattr", "delattr")
    ):
        targets = node.args[:1]
    found = []
    for target in targets:
        root = target
        while isinstance(root, ast.Attribute):
            root = root.value
        if root is not target and isinstance(root, ast.Name) and root.id in modules:
            found.append(f"line {node.lineno} changes {ast.unparse(target)}")
        elif (
            target is not node
            and isinstance(target, ast.Name)
            and target.id in modules
            and isinstance(node, ast.Call)
        ):
            found.append(f"line {node.lineno} changes an attribute of module {target.id}")
    return found


def ipython_free(source: str) -> str:
    """Cell source with IPython's ``%magic`` and ``!shell`` lines blanked, so ``ast`` can read
    it."""
    return "\n".join(
        "" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()
    )
