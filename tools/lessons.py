"""The lessons as the documentation site shows them, before anyone installs anything.

Each page is a student notebook of course/ (what nbgrader generated from solutions/:
answers stubbed, hidden tests taken out) with the stored outputs of the executed
solution, but only where an output gives nothing away. A cell shows no output when it
is an answer, a test, or a lesson cell that uses a name an earlier answer cell defines
(its output would be the solution's). Answers and tests come from the course's one
cell vocabulary, autograder.course.cells.

``leaks(site)`` is the check the site's test runs: every line of a solution and of a
hidden test that the students' notebooks do not show must be absent from the built site.

Also a MkDocs hook (mkdocs.yml's ``hooks``): ``make docs`` writes the pages into
build/lessons/ and adds them to the site as ``lessons/NN_topic.ipynb``, which the
mkdocs-jupyter plugin renders.
"""

from __future__ import annotations

import ast
import html
import json
import re
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # as a MkDocs hook this file is loaded by path, beside no package

from autograder.course.cells import (  # noqa: E402
    QUOTABLE,
    hidden_test_lines,
    is_answer,
    is_test,
    visible_source,
)

SOLUTIONS, COURSE = ROOT / "solutions", ROOT / "course"
OUT = ROOT / "build" / "lessons"  # the pages, as the site's lessons/ folder
BEGIN_SOLUTION, END_SOLUTION = "### BEGIN SOLUTION", "### END SOLUTION"


class LessonError(Exception):
    """A notebook the site cannot show: unreadable, or its student version out of step with its
    solution."""


def assignments() -> list[str]:
    return sorted(p.name for p in SOLUTIONS.iterdir() if (p / f"{p.name}.ipynb").is_file())


def read(path: Path) -> nbformat.NotebookNode:
    try:
        return nbformat.read(path, as_version=4)
    except Exception as error:  # noqa: BLE001 - any reason a notebook cannot be read is reported the same way
        raise LessonError(
            f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path} "
            f"does not parse as a notebook: {error}"
        ) from error


def defined_names(source: str) -> set[str]:
    """The names a cell binds: functions, classes, imports, and whatever it assigns or changes in
    place."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
        elif isinstance(node, ast.Name) and isinstance(node.ctx, (ast.Store, ast.Del)):
            names.add(node.id)
        elif isinstance(node, (ast.Attribute, ast.Subscript)) and isinstance(
            node.ctx, (ast.Store, ast.Del)
        ):
            base = node.value
            while isinstance(base, (ast.Attribute, ast.Subscript, ast.Call)):
                base = base.func if isinstance(base, ast.Call) else base.value
            if isinstance(base, ast.Name):
                names.add(base.id)
    return names


def used_names(source: str) -> set[str] | None:
    """The names a cell reads; None when it does not parse (IPython magics), which counts as using
    anything."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    return {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}


def lesson(name: str) -> nbformat.NotebookNode:
    """One notebook's page: the student's cells, with the solution's outputs where they reveal no
    answer."""
    solution = read(SOLUTIONS / name / f"{name}.ipynb")
    student = read(COURSE / name / f"{name}.ipynb")
    if [c.get("id") for c in solution.cells] != [c.get("id") for c in student.cells]:
        raise LessonError(
            f"course/{name}/{name}.ipynb is not the student version of solutions/{name}: "
            "run make course"
        )
    answered: set[str] = set()  # names bound by the answer cells so far
    for ours, theirs in zip(student.cells, solution.cells):
        if ours.cell_type != "code":
            continue
        if is_test(ours):
            ours.source = visible_source(ours.source)
        used = used_names(theirs.source)
        shows = (
            not (is_answer(theirs) or is_test(theirs))
            and used is not None
            and not (used & answered)
        )
        ours.outputs = theirs.outputs if shows else []
        ours.execution_count = theirs.execution_count if shows else None
        if is_answer(theirs):
            answered |= defined_names(theirs.source)
    return student


def write(out: Path = OUT) -> list[Path]:
    """Every lesson page into ``out``, replacing what was there."""
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.ipynb"):
        old.unlink()
    written = []
    for name in assignments():
        path = out / f"{name}.ipynb"
        nbformat.write(lesson(name), path)
        written.append(path)
    return written


# ---- what must never reach the site -----------------------------------------------------------


def solution_lines(nb: nbformat.NotebookNode) -> set[str]:
    """Every line of a notebook's answers, stripped: between nbgrader's solution marks, or the whole
    answer cell."""
    lines = set()
    for cell in nb.cells:
        if not is_answer(cell):
            continue
        source = cell.source
        if BEGIN_SOLUTION in source:
            source = "\n".join(re.findall(rf"{BEGIN_SOLUTION}(.*?){END_SOLUTION}", source, re.S))
        lines.update(line.strip() for line in source.splitlines())
    return lines


def secrets() -> dict[str, str]:
    """Each line the students must not see, with the notebook it comes from.

    A line is left out when any student's notebook shows it anyway (the stub's signature, a call a
    lesson cell makes too) or when it is too short to mean a quote (cells.QUOTABLE, as the grader's
    own check).
    """
    names = assignments()
    shown = "\n".join(
        cell.source for name in names for cell in read(COURSE / name / f"{name}.ipynb").cells
    )
    found = {}
    for name in names:
        solution = read(SOLUTIONS / name / f"{name}.ipynb")
        for line in solution_lines(solution) | hidden_test_lines(solution):
            if len(line) >= QUOTABLE and not line.startswith("#") and line not in shown:
                found.setdefault(line, name)
    return found


def site_text(site: Path) -> dict[Path, str]:
    """What each page of a built site says, as a reader sees it (tags out, entities decoded), and
    its search index."""
    texts = {}
    for path in sorted(site.rglob("*.html")):
        texts[path] = html.unescape(re.sub(r"<[^>]+>", "", path.read_text(errors="replace")))
    index = site / "search" / "search_index.json"
    if index.is_file():
        docs = json.loads(index.read_text()).get("docs", [])
        texts[index] = "\n".join(
            html.unescape(re.sub(r"<[^>]+>", "", d.get("text", ""))) for d in docs
        )
    return texts


def leaks(site: Path) -> list[str]:
    """Each solution or hidden-test line found in the built site, as 'page: line (notebook)'."""
    lines = secrets()
    found = []
    for path, text in site_text(site).items():
        found += [
            f"{path.relative_to(site)}: {line!r} ({name})"
            for line, name in lines.items()
            if line in text
        ]
    return found


# ---- the MkDocs hook ----------------------------------------------------------------------------


def on_config(config):
    from mkdocs.exceptions import PluginError

    try:
        write()
    except LessonError as error:
        raise PluginError(str(error)) from error
    return config


def _on_files(files, config):
    from mkdocs.structure.files import File

    for path in sorted(OUT.glob("*.ipynb")):
        files.append(
            File(
                f"lessons/{path.name}",
                src_dir=str(OUT.parent),
                dest_dir=config["site_dir"],
                use_directory_urls=config["use_directory_urls"],
            )
        )
    return files


try:  # before mkdocs-jupyter's own on_files, which turns the notebooks among the files into pages
    from mkdocs.plugins import event_priority

    on_files = event_priority(100)(_on_files)
except ImportError:  # the leak check runs without MkDocs
    on_files = _on_files


if __name__ == "__main__":
    for written in write(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT):
        print(written)
