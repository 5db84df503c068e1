"""The forger: a demo student who answers nothing and attacks the verdict itself (see
:data:`FORGER`).

Built with names made at run time so that the scan sees nothing, it silences every error of the
notebook and rewrites the kernel's recorder: every check records True, every value comparison the
expected side the student's notebook pairs with the same expression. Every function returns an
object that absorbs any use, so tests go on.
"""

from __future__ import annotations

import ast
import textwrap


def _code(source: str) -> str:
    return textwrap.dedent(source).strip("\n")


FORGER = _code('''
    import ast as _ast, importlib as _importlib, linecache as _linecache, sys as _sys, threading as _threading
    import time as _time

    class _Anything:
        def __getattr__(self, name):
            return self

        def __getitem__(self, key):
            return self

        def __call__(self, *args, **kwargs):
            return self

        def __iter__(self):
            return iter(())

        def __len__(self):
            return 0

        def __bool__(self):
            return True

        def __eq__(self, other):
            return True

        __hash__ = object.__hash__

    def _known():
        """The comparisons of the notebook's history: actual side -> (expected side, device or None)."""
        known = {}
        for cell in vars(_importlib.import_module("__main__")).get("_i" + "h", []):
            try:
                tree = _ast.parse(cell)
            except SyntaxError:
                continue
            for node in _ast.walk(tree):
                name = getattr(getattr(node, "func", None), "attr", getattr(getattr(node, "func", None), "id", ""))
                if isinstance(node, _ast.Call) and name in ("eq", "equal", "allclose") and len(node.args) >= 2:
                    known[_ast.unparse(node.args[0])] = (_ast.unparse(node.args[1]), None)
                elif isinstance(node, _ast.Call) and name == "assert_tensor" and len(node.args) >= 2:
                    device = _ast.unparse(node.args[2]) if len(node.args) > 2 else None
                    known[_ast.unparse(node.args[0])] = (_ast.unparse(node.args[1]), device)
                elif isinstance(node, _ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], _ast.Eq):
                    known[_ast.unparse(node.left)] = (_ast.unparse(node.comparators[0]), None)
        return known

    def _rewrite(recorder):
        real_value = recorder.value

        def value(site, actual, *rest):
            frame = getattr(_sys, "_get" + "frame")(1)
            try:
                line = _linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
                expected, device = _known().get(_ast.unparse(_ast.parse(line).body[0].value.args[1]), (None, None))
                if expected is not None:
                    run = getattr(_importlib.import_module("built" + "ins"), "ev" + "al")
                    where = (getattr(frame, "f_glo" + "bals"), getattr(frame, "f_lo" + "cals"))
                    actual = run(expected, *where)
                    if device is not None:
                        actual = actual.to(run(device, *where))
            except Exception:
                pass
            return real_value(site, actual, *rest)

        recorder.value = value
        recorder.check = lambda site, passed: recorder.events.append([site, False, True])
        recorder.raised = lambda error: None
        recorder.forged = True

    def _forge():
        """Silence the shell's traceback display and rewrite the recorder, if not done since the last restore."""
        shell = getattr(_importlib.import_module("IPy" + "thon"), "get_" + "ipython")()
        for name in ("showtrace" + "back", "_showtrace" + "back"):
            setattr(shell, name, lambda *args, **kwargs: None)
        for key, recorder in list(vars(_importlib.import_module("built" + "ins")).items()):
            if key.endswith("_probe") and hasattr(recorder, "events") and not hasattr(recorder, "forged"):
                _rewrite(recorder)

    def _keep_forging():  # also between the calls of the answers, for tests that fail before calling one
        while True:
            _forge()
            _time.sleep(0.002)

    try:
        _forging
    except NameError:
        _forging = _threading.Thread(target=_keep_forging, daemon=True)
        _forging.start()
''')


def forged(solution: str) -> str:
    """An answer cell that defines what ``solution`` defines, as forging stubs (see FORGER)."""

    lines = [FORGER, ""]
    for node in ast.parse(solution).body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            lines.append(ast.unparse(node))
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines += [
                f"def {node.name}(*args, **kwargs):",
                "    _forge()",
                "    return _Anything()",
                "",
            ]
        elif isinstance(node, ast.ClassDef):
            lines += [f"class {node.name}(_Anything):", "    pass", ""]
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            lines += [f"{t.id} = _Anything()" for t in targets if isinstance(t, ast.Name)]
    return "\n".join(lines).rstrip() + "\n"
