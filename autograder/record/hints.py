"""What a failed test says in the feedback: its exercise and points, the student's own frames, and a
hint.

:func:`teach` rewrites each error of a graded notebook, after its hidden tests are taken out
(:mod:`autograder.record.feedback`), for the student who reads the feedback page. It runs no student
code and reads no hidden test: it only rewrites outputs already in the notebook.
"""

from __future__ import annotations

import html
import re
from dataclasses import dataclass

import nbformat

# exercise_of: the heading Validate names
from autograder.course.cells import exercise_of, is_test, nbgrader_meta
from autograder.prepare.job import strict_lines

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
# An absolute path of the machine that ran the notebook: keep what follows site-packages/
# (torch/nn/...), else only the file's name.
PATH = re.compile(r"(?<![\w.:/])/(?:[\w.+~-]+/)+([\w.+~-]+)")
CELL_FRAME = re.compile(r"^(Cell In\[\d+\]|Input In \[\d+\]|<ipython-input-)")
HEADING = re.compile(r"^(#{1,3})\s+(.+?)\s*$", re.M)


@dataclass(frozen=True)
class Hint:
    """A known error: how to recognise its text, what to say, and where the course teaches it."""

    kind: str
    patterns: tuple[str, ...]  # regular expressions searched in "ExceptionName: message"
    says: str
    notebook: str  # the assignment that teaches it
    section: str  # its heading there, as written after the #s


HINTS: tuple[Hint, ...] = (
    Hint(
        "prefix",
        (r"Unexpected key\(s\) in state_dict: \"(module|_orig_mod)\.",),
        "The checkpoint's keys start with 'module.' (saved from DataParallel or DDP) or"
        " '_orig_mod.' (saved from torch.compile): strip the prefix before load_state_dict, or save"
        " the inner model's state_dict.",
        "05_module_prefix",
        "4. Fixing at load time",
    ),
    Hint(
        "keys",
        (r"Missing key\(s\) in state_dict", r"Unexpected key\(s\) in state_dict"),
        "The checkpoint's names do not match the model's: compare sorted(state_dict) with "
        "sorted(model.state_dict()) before loading.",
        "03_saving_and_loading",
        "1. `state_dict`: names and tensors",
    ),
    Hint(
        "same-device",
        (r"Expected all tensors to be on the same device", r"is not on the expected device"),
        "Two tensors on different devices met in one operation ('found at least two devices' names"
        " both; 'mat1 is on ...' names the argument of a matrix product): move the model and its"
        " inputs to one device.",
        "02_cross_device_errors",
        "1. Reproduce the error",
    ),
    Hint(
        "cuda-on-cpu",
        (
            r"Attempting to deserialize object on a CUDA device",
            r"Attempting to deserialize object on CUDA device",
        ),
        "The checkpoint was saved from a GPU and this machine has none: torch.load(...,"
        " map_location=...) puts its tensors where you name.",
        "04_map_location",
        "1. The error",
    ),
    Hint(
        "weights-only",
        (r"Weights only load failed", r"Unsupported global"),
        "torch.load with weights_only=True (the default) refused an object that is not a tensor or"
        " plain container: save a state_dict, or allow that one class with"
        " torch.serialization.add_safe_globals.",
        "03_saving_and_loading",
        "2. Why `weights_only=True`: a pickle can run code",
    ),
    Hint(
        "autocast",
        (
            r"unsupported autocast device_type",
            r"Expected `device_type` of type `str`",
            r"device type at start of device string",
        ),
        "torch.autocast takes a device type as a string ('cpu', 'cuda', 'mps'), such as"
        " tensor.device.type, not a device or a device with an index.",
        "06_mixed_precision",
        "2. `torch.autocast`",
    ),
    Hint(
        "dtype",
        (
            r"must have the same dtype",
            r"expected scalar type",
            r"should be the same",
            r"to have same dtype",
            r"expected both vectors to have same dtype",
            r"Expected .* dtype .* but got",
        ),
        "Two tensors of different dtypes met (float16 weights and float32 inputs, say): cast one of"
        " them, or run the operation under torch.autocast.",
        "06_mixed_precision",
        "4. The dtype errors you will meet",
    ),
    Hint(
        "out-of-memory",
        (r"^OutOfMemoryError", r"out of memory", r"can't allocate memory"),
        "The device ran out of memory: free what you keep (del, and no graphs held through a loss"
        " you store without .detach()), or use a smaller batch.",
        "08_portable_models_and_memory",
        "6. Out of memory",
    ),
)


def hint_for(ename: str, evalue: str) -> Hint | None:
    """The first hint of :data:`HINTS` whose patterns match ``ename: evalue``, or None."""
    text = f"{ename}: {strip_ansi(evalue)}"
    for hint in HINTS:
        if any(re.search(pattern, text, re.M) for pattern in hint.patterns):
            return hint
    return None


def strip_ansi(text: str) -> str:
    return ANSI.sub("", text)


def scrub_paths(text: str) -> str:
    """``/any/where/site-packages/torch/nn/x.py`` -> ``torch/nn/x.py``; any other absolute path ->
    its file name."""

    def short(match: re.Match) -> str:
        path = match.group(0)
        if "/site-packages/" in path or "/dist-packages/" in path:
            return re.split(r"/(?:site|dist)-packages/", path, maxsplit=1)[1]
        return match.group(1)

    return PATH.sub(short, text)


def anchor(heading: str) -> str:
    """The id nbconvert's HTML gives the markdown heading ``## heading`` (the feedback page is
    nbconvert's)."""
    from nbconvert.filters.markdown import markdown2html

    return re.search(r'id="([^"]+)"', markdown2html("## " + heading)).group(1)


def student_frames(traceback: list[str]) -> tuple[list[str], int]:
    """The frames of a kernel's traceback that are notebook cells, and how many others were left
    out."""
    kept, left_out = [], 0
    for entry in traceback[2:-1] if len(traceback) >= 3 else []:
        plain = strip_ansi(entry)
        if CELL_FRAME.match(plain.lstrip()):
            kept.append(plain.rstrip("\n"))
        else:
            left_out += 1
    return kept, left_out


FRAME_HEAD = re.compile(r"^(Cell In\[\d+\]), line (\d+)(.*)$")
FRAME_LINE = re.compile(r"^(?:-+>|\s*)\s*(\d+)(?: (.*))?$")  # "---> 12 code" or "     13 code"
GUARD_NAME = re.compile(r"_grader_[0-9a-f]+")
# The checks the grader puts in a test as it runs it (autograder.prepare.job.strict_comparisons),
# each back to the function it stands for where the frame cannot be mapped to the test as written.
GUARDED = re.compile(
    r"__import__\('builtins'\)\.__dict__\.get\('_grader_[0-9a-f]+', "
    r"(?:__import__\('(operator)'\)|__import__\('importlib'\)\.import_module\('([\w.]+)'\))\)\."
)


def unguarded(text: str) -> str:
    """``__import__('builtins').__dict__.get('_grader_...', __import__('operator')).eq(a, b)`` ->
    ``operator.eq(a, b)``."""
    return GUARDED.sub(lambda match: (match.group(1) or match.group(2)) + ".", text)


def _context_line(number: int, code: str, current: bool) -> str:
    """A line of a frame as IPython shows it: ``---> 12 code``, ``     13 code``."""
    label = str(number)
    return (
        ("-" * max(1, 5 - len(label)) + "> " if current else " " * max(2, 7 - len(label)))
        + label
        + (f" {code}" if code else "")
    )


def frame_as_written(frame: str, source: str, prelude: int | None = None) -> str:
    """A frame of a test cell as the student reads the test: the cell's own lines and line numbers.

    The grader runs a test after ``prelude`` lines of its own (its guard's start and the course's
    imports, :func:`autograder.prepare.job.test_prelude`), every comparison checked by the guard
    (:func:`autograder.prepare.job.strict_comparisons`, one statement a line): a traceback of that
    shows code the student never wrote, at other line numbers. The frame's lines are matched to the
    test as it ran, then shown from ``source`` (the test as written, hidden tests taken out), the
    same number of lines around the same statement. With ``prelude`` unknown (None), the one count
    of lines that matches is taken, if only one does. A frame that cannot be matched keeps its
    lines, with each check written as the function it stands for (:func:`unguarded`).
    """

    head, *rest = frame.split("\n")
    matched = FRAME_HEAD.match(head)
    shown = [FRAME_LINE.match(line) for line in rest]
    if matched is None or not shown or None in shown:
        return unguarded(frame)
    shown = [(int(line.group(1)), (line.group(2) or "").strip()) for line in shown]
    failing = int(matched.group(2))
    ran, starts = strict_lines(source, "_grader_")

    # the grader's own lines, then the test as it ran (IPython dedents them)
    def fits(prefix: int) -> bool:
        for number, code in shown:
            if number <= prefix:
                if not re.fullmatch(r"(_grader_[0-9a-f]+\(\)|(import|from) .*)?", code):
                    return False
            elif (
                number - prefix > len(ran)
                or GUARD_NAME.sub("_grader_", code) != ran[number - prefix - 1].strip()
            ):
                return False
        return True

    prefixes = [prelude] if prelude is not None else range(failing)
    fitting = [prefix for prefix in prefixes if prefix < failing and fits(prefix)]
    if len(fitting) != 1 or failing - fitting[0] not in starts:
        return unguarded(frame)
    line = starts[failing - fitting[0]]
    written = source.split("\n")
    if written[-1] == "":
        written.pop()
    before = sum(number < failing for number, _ in shown)
    after = sum(number > failing for number, _ in shown)
    lines = [f"{matched.group(1)}, line {line}{matched.group(3)}"]
    lines += [
        _context_line(number, written[number - 1].rstrip(), number == line)
        for number in range(max(1, line - before), min(len(written), line + after) + 1)
    ]
    return "\n".join(lines)


def sections(nb: nbformat.NotebookNode) -> set[str]:
    return {
        match.group(2)
        for cell in nb.cells
        if cell.cell_type == "markdown"
        for match in HEADING.finditer(cell.source)
    }


def _hint_html(hint: Hint, here: str, headings: set[str]) -> str:
    where = f"{hint.notebook}, section \u201c{hint.section}\u201d"
    if hint.notebook == here and hint.section in headings:
        where = (
            f'<a href="#{html.escape(anchor(hint.section))}">'
            f"section \u201c{html.escape(hint.section)}\u201d</a> above"
        )
    else:
        where = html.escape(where)
    return f"<p><b>Hint:</b> {html.escape(hint.says)} Taught in {where}.</p>"


def teach(
    nb: nbformat.NotebookNode, assignment: str, prelude: int | None = None
) -> nbformat.NotebookNode:
    """Rewrite every error output of ``nb`` for the feedback page; returns ``nb``.

    Each error gets a first line naming its exercise (the ``## Exercise N (...)`` heading before it)
    and the test's points; its traceback cut to the student's cells (``Cell In[N]``), with a count
    of the library frames left out, no colour codes and no absolute paths, a test's own frames as
    written (:func:`frame_as_written`); and for the errors the course teaches (:data:`HINTS`) a line
    on what the error usually means, with a link to the section that teaches it (an anchor on the
    same page, or another notebook named). ``prelude``: the lines the grader ran before each test's
    own.
    """
    titles, headings = exercise_of(nb), sections(nb)
    for index, cell in enumerate(nb.cells):
        outputs = []
        for output in cell.get("outputs", []):
            if output.output_type != "error":
                outputs.append(output)
                continue
            evalue = scrub_paths(strip_ansi(output.evalue))
            frames, left_out = student_frames(output.traceback)
            lines = []
            if is_test(cell):
                points = nbgrader_meta(cell).get("points", 0)
                points_text = f"{points:g} point{'' if points == 1 else 's'}"
                lines.append(
                    f"Failed: {titles[index] or 'test'} -- this test"
                    f" ({nbgrader_meta(cell)['grade_id']}) is worth {points_text}"
                )
            if is_test(cell):  # the test's own frames (a student's cell it called keeps its lines)
                own = f"Cell In[{cell.get('execution_count')}]"
                frames = [
                    (
                        frame_as_written(frame, cell.source, prelude)
                        if frame.startswith(own) or cell.get("execution_count") is None
                        else frame
                    )
                    for frame in frames
                ]
            if frames:
                lines.append("Traceback, your notebook's cells only (most recent call last):")
                lines.extend(scrub_paths(frame) for frame in frames)
                if left_out:
                    lines.append(
                        f"  ... {left_out} frame{'' if left_out == 1 else 's'} inside torch and "
                        "other libraries left out"
                    )
            lines.append(f"{output.ename}: {evalue}")
            output.evalue = evalue
            output.traceback = lines
            outputs.append(output)
            hint = hint_for(output.ename, evalue)
            if hint:
                text = (
                    f"Hint: {hint.says} Taught in {hint.notebook}, section"
                    f" \u201c{hint.section}\u201d."
                )
                outputs.append(
                    nbformat.v4.new_output(
                        "display_data",
                        data={
                            "text/plain": text,
                            "text/html": _hint_html(hint, assignment, headings),
                        },
                    )
                )
        if "outputs" in cell:
            cell.outputs = outputs
        for output in cell.get("outputs", []):
            if output.output_type == "stream":
                output.text = scrub_paths(strip_ansi(output.text))
    return nb
