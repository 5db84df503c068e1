"""From a submitted notebook to the notebook that is graded.

:func:`read_submission` refuses what cannot be graded with a :class:`SubmissionError` whose text is
the report's note. :func:`assemble` builds the notebook to run from the instructor's source: the
student's answer cells and added code cells go in; every other cell, tests with their hidden parts,
comes from the source, so an edited or deleted test changes nothing.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import nbformat

from autograder.course.cells import grade_ids_of, is_answer, nbgrader_meta
from autograder.course.config import DEFAULT_STUBS
from autograder.settings import MAX_CODE_CELLS, MAX_NOTEBOOK_MIB


class SubmissionError(Exception):
    """A notebook that cannot be graded; its message is the report's note."""


class OverLimit(SubmissionError):
    """A notebook past a limit per notebook (:data:`autograder.settings.MAX_CODE_CELLS`,
    ``MAX_NOTEBOOK_MIB``): it is graded as if no answer were in it, so it gets 0 points; its message
    names the limit."""


def read_submission(path: Path, own: set[str], other_sources: dict[str, set[str]]):
    """Read a submitted notebook, or raise SubmissionError saying why it cannot be graded
    (:class:`OverLimit`: why it gets 0 points)."""
    size = path.stat().st_size
    if size > MAX_NOTEBOOK_MIB << 20:
        raise OverLimit(
            f"{path.name} is {size / (1 << 20):.0f} MiB, over the limit of {MAX_NOTEBOOK_MIB} MiB"
            " per notebook: 0 points for it"
        )
    try:
        nb = nbformat.read(path, as_version=4)
        nbformat.validate(nb)
    except Exception as error:  # noqa: BLE001 - json, schema and encoding errors alike
        raise SubmissionError(
            f"{path.name} is not a valid notebook ({type(error).__name__}: "
            f"{str(error).splitlines()[0][:120] if str(error) else ''})"
        ) from None
    ids = grade_ids_of(nb)
    if ids and not ids & own:
        owners = [name for name, other in other_sources.items() if ids & other]
        where = f"the notebook of {owners[0]}" if owners else "not from this assignment"
        raise SubmissionError(f"{path.name} is {where}")
    cells = sum(cell.cell_type == "code" for cell in nb.cells)
    if cells > MAX_CODE_CELLS:
        raise OverLimit(
            f"{path.name} has {cells} code cells, over the limit of {MAX_CODE_CELLS} per notebook: "
            "0 points for it"
        )
    return nb


def assemble(
    source: nbformat.NotebookNode,
    submitted: nbformat.NotebookNode,
    stubs: tuple[str, str] = DEFAULT_STUBS,
) -> nbformat.NotebookNode:
    """The notebook to grade: the source's cells, with the student's answers and added cells put in;
    an answer cell the student deleted gets nbgrader's stub (``stubs``: the code stub and the text
    stub, :func:`autograder.course.config.answer_stubs`)."""
    answers = {
        nbgrader_meta(c)["grade_id"]: c
        for c in submitted.cells
        if is_answer(c) and nbgrader_meta(c).get("grade_id")
    }
    source_ids = {c.get("id") for c in source.cells}
    source_grade_ids = {nbgrader_meta(c).get("grade_id") for c in source.cells} - {None}
    added: dict[str | None, list] = {}
    anchor = None
    for cell in submitted.cells:
        grade_id = nbgrader_meta(cell).get("grade_id")
        if cell.get("id") in source_ids or grade_id in source_grade_ids:
            anchor = grade_id or cell.get("id")
            continue
        if cell.cell_type == "code" and not nbgrader_meta(cell):
            added.setdefault(anchor, []).append(cell)
    out = nbformat.v4.new_notebook(metadata=source.metadata)
    cells = list(added.get(None, []))
    for cell in source.cells:
        grade_id = nbgrader_meta(cell).get("grade_id")
        if is_answer(cell):
            mine = answers.get(grade_id)
            new = nbformat.from_dict(dict(cell))
            new.source = (
                mine.source if mine is not None else stubs[0 if cell.cell_type == "code" else 1]
            )
            cells.append(new)
        else:
            cells.append(nbformat.from_dict(dict(cell)))
        cells += added.get(grade_id or cell.get("id"), [])
    for cell in cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    out.cells = cells
    return out


def fingerprint(root: Path, recursive: bool = False, suffix: str = "") -> str:
    """A hash of the files in ``root`` (and below it, if ``recursive``) whose names end with
    ``suffix``, names included.

    Of a submission folder (every file): a re-run grades a changed submission
    again. Of the course's source (recursive, notebooks only): a changed
    course is graded afresh. Of the grader's code: a kept reference is made
    again (:mod:`autograder.judge.reference`).
    """
    digest = hashlib.sha256()
    paths = root.rglob("*") if recursive else root.glob("*")
    for path in sorted(p for p in paths if p.is_file() and p.name.endswith(suffix)):
        if ".ipynb_checkpoints" not in path.parts:
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def write_whole(path: Path, text: str) -> None:
    """Write ``text`` whole or not at all, through a temporary file of this process's: a reader, or
    a run stopped halfway, never leaves half of it (the work folder's state, a reference several
    graders share)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    temporary.write_text(text)
    os.replace(temporary, path)
