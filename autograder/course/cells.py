"""nbgrader's vocabulary for a notebook's cells: answers, tests, their grade ids, and the hidden
parts of a test.

The hidden parts are marked as nbgrader's ``ClearHiddenTests`` marks them by default
(``### BEGIN HIDDEN TESTS`` ... ``### END HIDDEN TESTS``, each on a line of its own).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

# a notebook's type only: a grading kernel imports this module, and nbformat costs it time
if TYPE_CHECKING:
    import nbformat

BEGIN_HIDDEN, END_HIDDEN = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
HIDDEN = re.compile(rf"^[ \t]*{BEGIN_HIDDEN}(.*?){END_HIDDEN}[ \t]*\n?", re.S | re.M)
EXERCISE = re.compile(r"^#{1,3}\s+(Exercise\s+\d+\b.*?)\s*$", re.M)
SECTION = re.compile(r"^#{1,2}\s+\S", re.M)
# a hidden line shorter than this is not looked for in outputs: too common to mean a quote
QUOTABLE = 12


def nbgrader_meta(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def is_answer(cell) -> bool:
    return bool(nbgrader_meta(cell).get("solution"))


def is_test(cell) -> bool:
    """An autograder test: a code cell with points that is not an answer."""
    meta = nbgrader_meta(cell)
    return cell.cell_type == "code" and bool(meta.get("grade")) and not meta.get("solution")


def test_id(cell) -> str | None:
    """The grade_id of a test cell, else None."""
    return nbgrader_meta(cell).get("grade_id") if is_test(cell) else None


def max_points(nb: nbformat.NotebookNode) -> float:
    """A notebook's maximum score as nbgrader counts it: the points of every graded cell and
    task."""
    return sum(
        float(nbgrader_meta(cell).get("points", 0))
        for cell in nb.cells
        if nbgrader_meta(cell).get("grade") or nbgrader_meta(cell).get("task")
    )


def grade_ids_of(nb: nbformat.NotebookNode) -> set[str]:
    return {nbgrader_meta(c)["grade_id"] for c in nb.cells if nbgrader_meta(c).get("grade_id")}


def visible_source(source: str) -> str:
    """A test cell's source as the student sees it: its hidden parts taken out."""
    return HIDDEN.sub("", source)


def has_hidden(source: str) -> bool:
    return HIDDEN.search(source) is not None


def hidden_line_numbers(source: str) -> set[int]:
    """The (1-based) numbers of the lines inside the hidden parts of a test cell."""
    lines, inside = set(), False
    for number, line in enumerate(source.splitlines(), 1):
        stripped = line.strip()
        if stripped.startswith(BEGIN_HIDDEN):
            inside = True
        elif stripped.startswith(END_HIDDEN):
            inside = False
        elif inside:
            lines.add(number)
    return lines


def hidden_test_lines(nb: nbformat.NotebookNode) -> set[str]:
    """Every line of a notebook's hidden tests, stripped, long enough that an output quoting it is a
    quote, but those a student sees in a cell that is not an answer (a hidden test's ``norm =
    Standardize(mean, std)...`` that the visible test above it has is no secret)."""
    lines, seen = set(), set()
    for cell in nb.cells:
        for block in HIDDEN.findall(cell.source):
            lines.update(
                line.strip() for line in block.splitlines() if len(line.strip()) >= QUOTABLE
            )
        if not is_answer(cell):  # an answer's solution is the instructor's: not seen either
            seen.update(line.strip() for line in HIDDEN.sub("", cell.source).splitlines())
    return lines - seen


def exercise_of(nb) -> dict[int, str | None]:
    """Cell index -> the title of the ``## Exercise N (...)`` heading above it, None outside
    exercises."""
    titles, current = {}, None
    for index, cell in enumerate(nb["cells"]):
        if cell["cell_type"] == "markdown":
            source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            found = EXERCISE.search(source)
            if found:
                current = found.group(1)
            elif SECTION.search(source):
                current = None  # a section that is not an exercise
        titles[index] = current
    return titles
