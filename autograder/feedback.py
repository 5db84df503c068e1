"""Feedback for students: nbgrader's HTML, from graded notebooks with the hidden tests taken out."""

from __future__ import annotations

import re
from pathlib import Path

import nbformat

from autograder.gradebook import last_line
from autograder.submission import is_test


HIDDEN = re.compile(r"^[ \t]*### BEGIN HIDDEN TESTS.*?### END HIDDEN TESTS[ \t]*\n?", re.S | re.M)


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
                output.traceback = [clean(f"{output.ename}: {output.evalue}")] if is_test(cell) else \
                    [clean(line) for line in output.traceback]
                output.evalue = clean(output.evalue)
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
    for path in (workdir / "autograded" / student / name).glob("*.ipynb"):
        nbformat.write(redact(nbformat.read(path, as_version=4), hidden), path)
    outcome = api.generate_feedback(name, student, force=True)
    if not outcome["success"]:
        notes.setdefault(pair, []).append("no feedback: " + last_line(outcome.get("error") or outcome.get("log")))
