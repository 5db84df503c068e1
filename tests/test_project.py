"""The project's own promises: pins agree, course/ and the demo class are generated, not edited."""

import filecmp
import fnmatch
import re
import sys
from pathlib import Path

import nbformat
import pytest
import yaml

from autograder.course import config
from devcourse.instructor import build, demo, paths

ROOT = Path(__file__).resolve().parent.parent


def _requirements():
    lines = (ROOT / "requirements.txt").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def test_environment_yml_pins_the_same_packages_as_requirements_txt():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_lists = [dep["pip"] for dep in env["dependencies"] if isinstance(dep, dict)]
    assert len(pip_lists) == 1
    conda_pip = [line for line in pip_lists[0] if not line.startswith("-e ")]
    assert conda_pip == _requirements()
    assert {"-e ./simdevice", "-e ./autograder", "-e ."} <= set(pip_lists[0]), (
        "conda users get all three too"
    )


def test_every_requirement_is_pinned_exactly_and_torch_to_the_cpu_wheel_version():
    for line in _requirements():
        assert re.fullmatch(r"[A-Za-z0-9_.-]+==[0-9][0-9A-Za-z.+]*", line), (
            f"not an exact pin: {line}"
        )
    assert "torch==2.13.0" in _requirements()


def test_every_assignment_has_a_folder_and_notebook_of_the_same_name():
    names = paths.assignments()
    assert names[:3] == ["00_environment", "01_device_placement", "02_cross_device_errors"]
    for name in names:
        assert re.fullmatch(r"\d\d_[a-z0-9_]+", name)
    released = sorted(p.parent.name for p in (ROOT / "course").glob("*/*.ipynb"))
    assert released == names, "course/ and solutions/ hold different assignments"


def _files(root: Path) -> list[Path]:
    """The files under root, less those nbgrader's CourseDirectory.ignore leaves out (what a run
    writes beside a notebook)."""
    ignored = config.course_config().CourseDirectory.ignore
    return sorted(
        p.relative_to(root)
        for p in root.rglob("*")
        if p.is_file()
        and not any(
            fnmatch.fnmatch(part, pattern)
            for part in p.relative_to(root).parts
            for pattern in ignored
        )
    )


def _tree_differences(a: Path, b: Path) -> list[str]:
    files_a, files_b = _files(a), _files(b)
    if files_a != files_b:
        return [f"files differ: {files_a} vs {files_b}"]
    return [str(f) for f in files_a if not filecmp.cmp(a / f, b / f, shallow=False)]


def test_course_is_exactly_what_nbgrader_generates_from_solutions(tmp_path):
    build.generate_course(tmp_path / "course")
    stale = _tree_differences(tmp_path / "course", ROOT / "course")
    assert not stale, f"course/ is out of date or edited by hand ({stale}): run `make course`"


def test_demo_submissions_are_exactly_what_the_roster_builds(tmp_path):
    demo.build(tmp_path / "submitted")
    stale = _tree_differences(tmp_path / "submitted", demo.SUBMITTED)
    assert not stale, f"the demo class is out of date ({stale}): run `make course`"


@pytest.mark.parametrize("name", paths.assignments())
def test_solution_notebooks_are_stored_with_outputs_and_without_widget_state(name):
    import nbformat

    nb = nbformat.read(paths.solution_path(name), as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code), "run `make execute` to store outputs"
    assert "widgets" not in nb.metadata
    text = paths.solution_path(name).read_text()
    for place in (sys.prefix, str(ROOT)):
        assert place not in text, (
            f"a stored output shows a local path ({place}): run `make execute`"
        )
    for cell in code:
        if "raises-exception" in cell.metadata.get("tags", []):
            assert any(o.output_type == "error" for o in cell.outputs), (
                f"cell {cell.id} should show its error"
            )


def test_only_the_last_assignment_says_it_is_the_last_and_each_other_names_the_next():
    names = paths.assignments()
    for index, name in enumerate(names):
        nb = nbformat.read(paths.solution_path(name), as_version=4)
        text = "\n".join(cell.source for cell in nb.cells if cell.cell_type == "markdown")
        says_last = "last notebook" in text
        assert says_last == (index == len(names) - 1), (
            f"{name} {'says' if says_last else 'does not say'} it is the last"
        )
        if index < len(names) - 1:
            following = names[index + 1]
            last_section = text.rsplit("## ", 1)[-1]
            assert following in last_section or f"notebook {following[:2]}" in last_section, (
                f"{name}'s last section does not name the next notebook, {following}"
            )


def test_readme_states_each_notebooks_points_and_the_total():
    readme = (ROOT / "README.md").read_text()
    stated = {
        name: int(points)
        for name, points in re.findall(r"^\| `(\d\d_[a-z0-9_]+)` \| (\d+) \|", readme, re.M)
    }
    actual = {}
    for name in paths.assignments():
        cells = nbformat.read(paths.solution_path(name), as_version=4).cells
        actual[name] = sum(
            c.metadata.get("nbgrader", {}).get("points", 0)
            for c in cells
            if c.metadata.get("nbgrader", {}).get("grade")
        )
    assert stated == actual
    assert f"{sum(actual.values())} points in all" in readme


def test_make_lab_starts_the_students_lab():
    """make lab puts jupyter/student-lab first on JUPYTER_CONFIG_PATH (what the browser test starts
    too)."""
    import subprocess

    printed = subprocess.run(
        ["make", "-n", "lab"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    assert f'JUPYTER_CONFIG_PATH="{ROOT / "jupyter" / "student-lab"}"' in printed, printed
    for name in ["labconfig/page_config.json", "jupyter_server_config.json"]:
        assert (ROOT / "jupyter" / "student-lab" / name).is_file()


def test_devcourse_modules_import_without_jupyters_server_or_jsonschema():
    """Each grading kernel imports every devcourse module (autograder.inside.guard) before the
    student's first cell.

    Jupyter's server modules bring in jsonschema, whose IRI format checker compiles a grammar at
    import: about a second of every kernel's start, for nothing the kernel uses.
    """
    import subprocess

    code = (
        "import importlib, pkgutil, sys, devcourse\nfor info in"
        " pkgutil.iter_modules(devcourse.__path__):\n   "
        " importlib.import_module(f'devcourse.{info.name}')\nprint(sorted(m for m in"
        " ('jupyter_server', 'tornado', 'jsonschema', 'nbformat') if m in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", (
        f"importing devcourse's modules brought in {done.stdout.strip()}"
    )


def test_the_grader_starts_without_torch_and_devcourse_still_offers_its_helpers():
    """The grader's zygote imports torch while the grader sets up: the grader's modules, and the
    devcourse modules it uses, must not import it first. A notebook still finds
    ``devcourse.best_device`` (and Jupyter's completion lists it)."""
    import subprocess

    code = (
        "import sys, autograder.cli.grade, autograder.batch, autograder.run.forkclient,"
        " devcourse.warmstart, devcourse.validation\nprint('torch' in sys.modules)\nimport"
        " devcourse\nfrom devcourse import best_device\nprint(best_device is devcourse.best_device,"
        " 'best_device' in dir(devcourse), 'torch' in sys.modules)"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True", "True", "True"], done.stdout


def test_sim_output_cells_are_compared_only_where_there_is_no_real_accelerator(
    monkeypatch, request
):
    from devcourse import devices

    # the checkout's own conftest, as pytest registered it (``import conftest`` may find another
    # test folder's)
    conftest = request.config.pluginmanager.get_plugin(str(ROOT / "conftest.py"))

    class Cell:
        def __init__(self, tags):
            self.cell, self.options = {"metadata": {"tags": tags}}, {"check": True}

    tagged, plain = Cell(["sim-output"]), Cell(["nbval-ignore-output"])
    monkeypatch.setattr(devices, "hardware_accelerator", lambda: None)
    assert conftest.ignore_simulated_outputs([tagged, plain]) == [] and tagged.options["check"]
    monkeypatch.setattr(devices, "hardware_accelerator", lambda: "cuda")
    assert conftest.ignore_simulated_outputs([tagged, plain]) == [tagged]
    assert tagged.options["check"] is False and plain.options["check"] is True


def test_every_sim_output_cell_asks_for_its_device():
    """A cell tagged sim-output runs on a real accelerator where there is one, so it must not turn
    on sim itself."""
    for name in paths.assignments():
        nb = nbformat.read(paths.solution_path(name), as_version=4)
        for cell in nb.cells:
            if "sim-output" in cell.metadata.get("tags", []):
                assert "simdevice.enable(" not in cell.source, f"{name}: {cell.source[:80]}"


@pytest.mark.parametrize(
    "command",
    [["ruff", "check", "."], ["ruff", "format", "--check", "."], ["lint-imports", "--no-cache"]],
    ids=["ruff", "format", "layers"],
)
def test_the_code_keeps_its_style_and_the_grader_its_layers(command):
    """ruff with the rules pyproject.toml names, and import-linter's contracts: the grader's layers,
    no import cycle, nothing of the grader inside the sandbox or in the course's package, nothing of
    the course in the simulated device."""
    import subprocess

    done = subprocess.run(
        [str(Path(sys.executable).parent / command[0]), *command[1:]],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]


def test_importing_any_module_of_the_grader_or_the_course_changes_nothing(tmp_path):
    """Every module of autograder and devcourse imported in a fresh process: no import made to fail,
    no environment variable, signal handler, working folder or file of the checkout changed."""
    import subprocess

    script = r"""
import os, pkgutil, signal, sys, importlib

before = (
    dict(os.environ),
    {s: signal.getsignal(s) for s in signal.valid_signals() if s < signal.NSIG},
    os.getcwd(),
    {k for k, v in sys.modules.items() if v is None},
)
for package in ("autograder", "devcourse", "simdevice"):
    module = importlib.import_module(package)
    for info in pkgutil.walk_packages(module.__path__, package + "."):
        if not info.name.endswith("__main__"):
            importlib.import_module(info.name)
after = (
    dict(os.environ),
    {s: signal.getsignal(s) for s in signal.valid_signals() if s < signal.NSIG},
    os.getcwd(),
    {k for k, v in sys.modules.items() if v is None},
)
for name, was, now in zip(
    ("environment", "signal handlers", "working folder", "imports made to fail"), before, after
):
    assert was == now, (name, was, now)
print("ok")
"""

    def files() -> list[str]:
        # build/ and the tools' caches are where other tests, running beside this one, write
        skipped = {
            ".git",
            ".venv",
            "__pycache__",
            ".grimp_cache",
            ".ruff_cache",
            ".pytest_cache",
            "build",
        }
        return sorted(
            str(p.relative_to(ROOT)) for p in ROOT.rglob("*") if not skipped & set(p.parts)
        )

    listed = files()
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert done.stdout.strip() == "ok", done.stderr[-3000:]
    assert files() == listed


# One file by design: it runs with python -I before anything of the grader can be imported.
LONG_MODULES = {"autograder/inside/launcher.py"}
# Sent whole into a kernel as one closure, so that nothing of them is left in the student's
# namespace.
LONG_FUNCTIONS = {"autograder/inside/guard.py:install", "autograder/inside/recorder.py:install"}


def test_the_packages_modules_are_small_and_the_graders_functions_short():
    """No module of the grader, the course or the simulated device over 400 lines, no function of
    the grader over 80, but those that say why above."""
    import ast

    long_modules, long_functions = [], []
    for path in _modules_of_the_grader_and_the_course():
        name = str(path.relative_to(ROOT))
        text = path.read_text()
        if text.count("\n") > 400 and name not in LONG_MODULES:
            long_modules.append(f"{name}: {text.count(chr(10))} lines")
        if path.parts[len(ROOT.parts)] != "autograder":
            continue
        for node in ast.walk(ast.parse(text)):
            if (
                isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
                and node.end_lineno - node.lineno >= 80
                and f"{name}:{node.name}" not in LONG_FUNCTIONS
            ):
                long_functions.append(
                    f"{name}:{node.name}: {node.end_lineno - node.lineno + 1} lines"
                )
    assert long_modules == [] and long_functions == [], (long_modules, long_functions)


def _modules_of_the_grader_and_the_course() -> list[Path]:
    packages = ("autograder", "devcourse", "simdevice")
    return sorted(
        path
        for package in packages
        for path in (ROOT / package).rglob("*.py")
        if "build" not in path.parts
    )


MODULE_DOCSTRING_LINES = 8  # lines of 100 characters: a few sentences
LONG_MODULE_DOCSTRINGS: set[str] = set()  # none now; a module named here may say more


def test_a_graders_object_declares_every_attribute_in_its_constructor():
    """What an object of the grader holds is read in one place: every ``self.x = ...`` of a method
    is declared in ``__init__`` (or ``__post_init__``), or on the class or a class it extends
    (jupyter_client's, nbgrader's)."""
    import ast
    import importlib

    late = []
    for path in (ROOT / "autograder").rglob("*.py"):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ClassDef):
                continue
            methods = [
                m for m in node.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))
            ]
            declared = set().union(
                *(_attributes_set(m) for m in methods if m.name in ("__init__", "__post_init__"))
            )
            for method in methods:
                for name in sorted(_attributes_set(method) - declared):
                    if not hasattr(getattr(importlib.import_module(module), node.name, None), name):
                        late.append(f"{module}.{node.name}.{method.name} sets {name}")
    assert late == [], late


def _attributes_set(function) -> set[str]:
    """The names ``x`` of each ``self.x`` that ``function`` assigns to."""
    import ast

    targets = [
        target
        for node in ast.walk(function)
        for target in (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, (ast.AnnAssign, ast.AugAssign))
            else []
        )
    ]
    return {
        found.attr
        for target in targets
        for found in ast.walk(target)
        if isinstance(found, ast.Attribute)
        and isinstance(found.value, ast.Name)
        and found.value.id == "self"
    }


def test_module_docstrings_say_what_the_module_does_and_where_it_sits_in_a_few_lines():
    """A module docstring of the grader or the course's package holds at most MODULE_DOCSTRING_LINES
    lines (the summary, the blank line and the text after it): what the module does and who calls it
    or what it stands on. What a function guarantees goes in that function's docstring; how the code
    came to be, in the commit log."""
    import ast

    long = []
    for path in _modules_of_the_grader_and_the_course():
        name = str(path.relative_to(ROOT))
        doc = ast.get_docstring(ast.parse(path.read_text()), clean=False)
        lines = len(doc.strip("\n").splitlines()) if doc else 0
        if lines > MODULE_DOCSTRING_LINES and name not in LONG_MODULE_DOCSTRINGS:
            long.append(f"{name}: {lines} lines")
    assert long == [], long


_TIME_OR_RATIO = (
    r"\d[\d,]*(?:\.\d+)?(?:-\d+(?:\.\d+)?)?\s?(?:s|ms|µs|seconds?|minutes?|x|%)(?![\w-])"
)
MEASUREMENT = re.compile(
    # an estimate: "about 2 s", "~190 MiB", "about a second", "over half"
    r"(?:\b(?:about|around|roughly|nearly|almost)\s|~\s?|≈\s?)\d[\d,.]*\s?(?:s|ms|µs|seconds?|minutes?|x|%|[KMG]i?B)\b"
    r"|\b(?:about|around|roughly|nearly|almost|over|under) (?:(?:a|an|one|two|three|half a) )?"
    r"(?:second|minute|half|third|quarter|fifth|seventh|tenth)s?\b"
    # a timing told as one: "took 14.7 ms", "2 s of processor time less", "132 s against 106", "3 s
    # they take"
    r"|\b(?:measured|took|timed)\b[^.;]{0,80}?"
    + _TIME_OR_RATIO
    + r"|"
    + _TIME_OR_RATIO
    + r"[^.;]{0,40}?\b(?:less|more|faster|slower|before|than|against|instead)\b"
    + r"|"
    + _TIME_OR_RATIO
    + r"[^.;]{0,20}?\b(?:they take|it takes|takes|took)\b"
    # where it was measured: "1.4 s on two cores", "measured on an NVIDIA H200", "(measured: ...)"
    + r"|"
    + _TIME_OR_RATIO
    + r" (?:on|with) (?:an? |\d+ |two |four |eight )?[\w-]*\s?(?:cores?|machine|laptop|GPU|CPU)\b"
    + r"|\bmeasured(?: (?:on|with) (?:an?"
    r" )?(?:NVIDIA|AMD|Intel|Apple|H100|H200|A100|PyTorch|torch|\d)|\s?:)",
    re.IGNORECASE,
)


def _comments_docstrings_and_help(path: Path):
    """(line, text) of each comment, docstring and argparse ``help=`` string of the module at
    ``path``."""
    import ast
    import io
    import tokenize

    source = path.read_text()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                yield node.body[0].lineno, doc
        elif isinstance(node, ast.keyword) and node.arg == "help":
            yield (
                node.value.lineno,
                "".join(
                    part.value
                    for part in ast.walk(node.value)
                    if isinstance(part, ast.Constant) and isinstance(part.value, str)
                ),
            )


def test_comments_docstrings_and_help_state_no_measurement():
    """A timing, speed-up, share of time or size measured on one machine, or what the code did
    before, belongs in the benchmarks' docs and the commit log, not in a comment, docstring or
    ``--help`` text that a reader takes for what holds now. Flagged (MEASUREMENT): an estimate
    ("about 2 s", "~190 MiB", "about a second", "over half"), a time or ratio next to a word that
    tells a measurement ("took 14.7 ms", "2 s less", "132 s against 106", "1.4 s on two cores",
    "measured on an NVIDIA H200"). Limits, defaults and constants ("60 s per cell", "4096 MiB",
    "four times a second") are not: they say what the code does, wherever it runs."""
    found = []
    for path in _modules_of_the_grader_and_the_course():
        for line, text in _comments_docstrings_and_help(path):
            found += [
                f"{path.relative_to(ROOT)}:{line}: {m.group(0)!r}"
                for m in MEASUREMENT.finditer(" ".join(text.split()))
            ]
    assert found == [], found


def test_the_graders_distribution_lists_every_package_of_its_folder():
    """autograder/pyproject.toml maps its folder to ``autograder`` and lists the packages: a new
    subpackage left out of the list would be missing from the grader's wheel."""
    import tomllib

    listed = tomllib.loads((ROOT / "autograder" / "pyproject.toml").read_text())["tool"][
        "setuptools"
    ]["packages"]
    found = sorted(
        ".".join(("autograder", *p.parent.relative_to(ROOT / "autograder").parts)).rstrip(".")
        for p in (ROOT / "autograder").rglob("__init__.py")
        if "build" not in p.parts
    )
    assert sorted(listed) == found
