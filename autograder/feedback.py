"""Feedback for students: nbgrader's HTML, from graded notebooks with the hidden tests taken out.

The graded notebook is the student's own run (phase A of :mod:`autograder.runner`), in which no hidden
test ran; :func:`redact` still takes hidden test sources out of every cell and any line of an output that
quotes one, and :func:`autograder.hints.teach` rewrites each error for the student (exercise and points,
the student's own frames, a hint for the errors the course teaches).
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat

from autograder.gradebook import last_line
from autograder.hints import strip_ansi, teach
from autograder.probe import HIDDEN
from autograder.submission import is_test




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
        if is_test(cell):
            cell.source = HIDDEN.sub("", cell.source)
        for output in cell.get("outputs", []):
            if output.output_type == "error":
                output.traceback = [clean(strip_ansi(line)) for line in output.traceback]
                output.evalue = clean(strip_ansi(output.evalue))
            elif output.output_type == "stream":
                output.text = clean(output.text)
            elif "data" in output:
                for mime in list(output.data):
                    if isinstance(output.data[mime], str):
                        output.data[mime] = clean(output.data[mime])
    return nb


def write_feedback(api, workdir: Path, pair: tuple[str, str], hidden: set[str], notes: dict) -> None:
    """nbgrader's feedback HTML for one student's assignment, from autograded notebooks without hidden tests."""
    student, name = pair
    kept = {}  # the instructor's view (formgrader) keeps the errors as they ran, hidden tests taken out
    for path in (workdir / "autograded" / student / name).glob("*.ipynb"):
        nb = redact(nbformat.read(path, as_version=4), hidden)
        kept[path] = nbformat.writes(nb)
        nbformat.write(teach(nb, name), path)
    try:
        outcome = api.generate_feedback(name, student, force=True)
    finally:
        for path, text in kept.items():
            path.write_text(text)
    if not outcome["success"]:
        notes.setdefault(pair, []).append("no feedback: " + last_line(outcome.get("error") or outcome.get("log")))
