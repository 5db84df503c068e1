"""Feedback that teaches: each error kind the course teaches, raised by a student's answer in a real
kernel, gets its hint, its exercise and points, and a traceback with the student's frames only."""

from __future__ import annotations

import re
import textwrap

import nbformat
import pytest
from nbclient import NotebookClient

from devcourse.instructor.paths import solution_path
from autograder.record import hints
from autograder.record.feedback import redact

# kind -> an answer a student could write that raises that error; the test cell calls answer().
ANSWERS = {
    "same-device": (
        """
        def answer():
            model = nn.Linear(3, 2).to(sim1)
            return model(torch.ones(1, 3))  # the input stayed on the CPU
    """
    ),
    "cuda-on-cpu": (
        """
        def answer():
            tagged_save({"w": torch.ones(2)}, "saved_on_gpu.pt", saved_on="cuda:0")
            return torch.load("saved_on_gpu.pt")  # no map_location on a machine without CUDA
    """
    ),
    "dtype": (
        """
        def answer():
            return nn.Linear(3, 2).half()(torch.ones(1, 3))  # float16 weights, float32 input
    """
    ),
    "prefix": (
        """
        def answer():
            model = nn.Linear(3, 2)
            # from DDP
            saved = {"module." + name: value for name, value in model.state_dict().items()}
            return model.load_state_dict(saved)
    """
    ),
    "keys": (
        """
        def answer():
            # the bias is missing
            return nn.Linear(3, 2).load_state_dict({"weight": torch.ones(2, 3)})
    """
    ),
    "weights-only": (
        """
        class Settings:
            lr = 0.1

        def answer():
            torch.save({"settings": Settings()}, "with_object.pt")
            return torch.load("with_object.pt")
    """
    ),
    "autocast": (
        """
        def answer():
            with torch.autocast(device_type=sim1):  # a device, not its type
                return torch.ones(2)
    """
    ),
    "out-of-memory": (
        """
        def answer():
            simdevice.set_memory_budget(sim1, 2**20)
            try:
                return torch.empty(2**20, device=sim1)  # 4 MiB on a 1 MiB device
            finally:
                simdevice.set_memory_budget(sim1, None)
    """
    ),
}


def _notebook() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells.append(
        nbformat.v4.new_code_cell(
            textwrap.dedent("""
        import torch
        import torch.nn as nn
        import simdevice
        from devcourse.checkpoints import tagged_save
        sim0, sim1 = simdevice.enable(2)
    """)
        )
    )
    for number, (kind, answer) in enumerate(ANSWERS.items(), start=1):
        nb.cells.append(nbformat.v4.new_markdown_cell(f"## Exercise {number} (2 points): {kind}"))
        nb.cells.append(
            nbformat.v4.new_code_cell(
                textwrap.dedent(answer).replace("def answer", f"def answer_{number}")
            )
        )
        test = nbformat.v4.new_code_cell(f"answer_{number}()")
        test.metadata["nbgrader"] = {
            "grade": True,
            "solution": False,
            "locked": True,
            "grade_id": f"test_{number}",
            "points": 2,
            "schema_version": 3,
        }
        nb.cells.append(test)
    return nb


@pytest.fixture(scope="module")
def taught(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hints")
    nb = _notebook()
    NotebookClient(
        nb,
        timeout=60,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(folder)}},
    ).execute()
    return hints.teach(redact(nb, set()), "99_hints"), folder


@pytest.mark.parametrize("number,kind", list(enumerate(ANSWERS, start=1)))
def test_each_error_kind_gets_its_hint_exercise_and_points(taught, number, kind):
    nb, folder = taught
    cell = next(
        c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == f"test_{number}"
    )
    errors = [o for o in cell.outputs if o.output_type == "error"]
    assert len(errors) == 1, f"{kind}: the answer raised nothing"
    lines = errors[0].traceback
    assert lines[0].startswith(
        f"Failed: Exercise {number} (2 points): {kind} -- this test (test_{number}) "
        "is worth 2 points"
    ), lines[0]
    assert any(line.startswith("Cell In[") for line in lines), lines  # the student's own frames
    shown = "\n".join(lines)
    assert "\x1b[" not in shown and "site-packages" not in shown and str(folder) not in shown, shown
    assert not re.search(r"(^|[\s(])/(usr|tmp|work|home|root|opt)/", shown), shown
    said = [o for o in cell.outputs if o.output_type == "display_data"]
    assert len(said) == 1, f"{kind}: no hint for {errors[0].ename}: {errors[0].evalue}"
    hint = next(h for h in hints.HINTS if h.kind == kind)
    assert hint.says in said[0].data["text/plain"], said[0].data["text/plain"]


def test_library_frames_are_counted_not_shown(taught):
    nb, _ = taught
    # inside nn.Linear
    cell = next(c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "test_3")
    lines = cell.outputs[0].traceback
    assert any(re.search(r"\.\.\. \d+ frames? inside torch", line) for line in lines), lines
    assert not any("linear.py" in line for line in lines), lines


SPY = """
import stack_data as _sd

_sd_calls = []
_sd_frames = _sd.FrameInfo.stack_data
_sd.FrameInfo.stack_data = lambda *args, **kwargs: (
    _sd_calls.append(1),
    _sd_frames(*args, **kwargs),
)[1]
"""


def test_the_graders_plain_library_frames_leave_the_feedback_as_it_was(tmp_path):
    """A grading kernel shows a library file's frames from their raw lines (autograder.run.runner's
    TRACEBACK_SOURCE, about a seventh of the demo class's processor time): stack_data is not called
    for any error, yet every error's feedback reads as it does from a kernel that IPython left as it
    is (the cells' frames are shown the raw way in both, and the library frames are only
    counted)."""
    from autograder.run.kernel import TRACEBACK_SOURCE

    shown, calls = {}, {}
    for kind, setup in [
        ("as IPython has it", SPY),
        ("as the grader starts it", TRACEBACK_SOURCE + SPY),
    ]:
        nb = _notebook()
        # one cell: the execution counts stay the same
        nb.cells[0].source = setup + nb.cells[0].source
        nb.cells.append(nbformat.v4.new_code_cell("print(len(_sd_calls))"))
        NotebookClient(
            nb,
            timeout=60,
            kernel_name="python3",
            allow_errors=True,
            resources={"metadata": {"path": str(tmp_path)}},
        ).execute()
        calls[kind] = int(nb.cells[-1].outputs[0].text)
        taught = hints.teach(redact(nb, set()), "99_hints")
        shown[kind] = [output for cell in taught.cells[1:-1] for output in cell.get("outputs", [])]
    assert calls["as the grader starts it"] == 0 and calls["as IPython has it"] > 0, calls
    assert sum(output.output_type == "error" for output in shown["as the grader starts it"]) == len(
        ANSWERS
    )
    assert shown["as the grader starts it"] == shown["as IPython has it"]


def test_an_unknown_error_gets_no_hint():
    assert hints.hint_for("ZeroDivisionError", "division by zero") is None
    assert (
        hints.hint_for("RuntimeError", '\x1b[1mMissing key(s) in state_dict\x1b[0m: "bias"').kind
        == "keys"
    )


def test_scrubbed_paths_keep_the_library_path_and_drop_the_machine():
    text = (
        "File /srv/x/.venv/lib/python3.11/site-packages/torch/nn/modules/linear.py:134, and"
        " /tmp/j/ab/saved.pt"
    )
    assert hints.scrub_paths(text) == "File torch/nn/modules/linear.py:134, and saved.pt"


def test_every_hint_names_a_section_its_notebook_has():
    for hint in hints.HINTS:
        nb = nbformat.read(solution_path(hint.notebook), as_version=4)
        assert hint.section in hints.sections(nb), (hint.kind, hint.notebook, hint.section)


def test_a_hint_in_its_own_notebook_links_to_the_section():
    hint = next(h for h in hints.HINTS if h.kind == "weights-only")
    nb = nbformat.read(solution_path(hint.notebook), as_version=4)
    page = hints._hint_html(hint, hint.notebook, hints.sections(nb))
    assert 'href="#2.-Why-weights_only=True:-a-pickle-can-run-code"' in page
    assert "href" not in hints._hint_html(hint, "02_cross_device_errors", set())


def test_a_crashed_rank_keeps_its_rank_exception_and_traceback_in_the_feedback():
    """07: run_functions raises DistributedRunError whose message starts with the crashing rank's
    own error."""
    message = (
        "rank 1 raised ValueError: a batch of 3 rows is not what rank 1 expected\n\n"
        "Traceback (most recent call last):\n"
        '  File "/tmp/ddp-run-x1y2/run.py", line 41, in train_step\n'
        "    raise ValueError(...)\n"
        "ValueError: a batch of 3 rows is not what rank 1 expected\n\n"
        "the run: rank 1 exited with code 1"
    )
    nb = nbformat.v4.new_notebook()
    test = nbformat.v4.new_code_cell("check_on_devices(check_training)")
    test.metadata["nbgrader"] = {
        "grade": True,
        "solution": False,
        "locked": True,
        "grade_id": "ddp_trains",
        "points": 2,
        "schema_version": 3,
    }
    test.outputs = [
        nbformat.v4.new_output(
            "error",
            ename="DistributedRunError",
            evalue=message,
            traceback=[
                "\x1b[31m----\x1b[39m",
                "\x1b[31mDistributedRunError\x1b[39m    Traceback (most recent call last)",
                (
                    "\x1b[36mCell\x1b[39m\x1b[36m \x1b[39m\x1b[32mIn[40]\x1b[39m\x1b[32m, line"
                    " 1\x1b[39m\n----> 1 check_on_devices(...)\n"
                ),
                f"\x1b[31mDistributedRunError\x1b[39m: {message}",
            ],
        )
    ]
    nb.cells = [nbformat.v4.new_markdown_cell("## Exercise 3 (2 points): train with DDP"), test]
    shown = "\n".join(hints.teach(nb, "07_multi_device_training").cells[1].outputs[0].traceback)
    assert "DistributedRunError: rank 1 raised ValueError: a batch of 3 rows" in shown, shown
    assert 'File "run.py", line 41, in train_step' in shown and "/tmp/" not in shown, shown
    assert shown.startswith("Failed: Exercise 3 (2 points): train with DDP"), shown


WRITTEN_TEST = '''\
"""The device check: the CPU first."""
devices = [torch.device("cpu"), torch.device("meta")]  # what the student's answer gave, say

def check(device):
    # a comment the grader's copy of the test does not keep
    assert device == torch.device("cpu"), f"{device} is not the CPU"

check(devices[0])
check(devices[1])
'''


def test_a_failed_test_shows_its_lines_as_written_not_as_the_grader_ran_them(tmp_path):
    """The grader runs a test after a line that starts its guard and the course's imports, each
    comparison rewritten as the guard's check (autograder.prepare.job.strict_comparisons). The
    student's feedback showed those lines, at their line numbers; now each frame of the test shows
    the test as written, at its own lines."""
    from autograder.prepare.job import strict_comparisons

    guard = "_grader_0123456789abcdef"
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell(f"import torch\n\ndef {guard}():\n    pass"))
    nb.cells.append(nbformat.v4.new_markdown_cell("## Exercise 1 (1 point): the CPU first"))
    test = nbformat.v4.new_code_cell(
        f"{guard}()\nimport torch\nfrom pathlib import Path\n"
        f"{strict_comparisons(WRITTEN_TEST, guard)}"
    )
    test.metadata["nbgrader"] = {
        "grade": True,
        "solution": False,
        "locked": True,
        "grade_id": "cpu_first",
        "points": 1,
        "schema_version": 3,
    }
    nb.cells.append(test)
    NotebookClient(
        nb,
        timeout=60,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(tmp_path)}},
    ).execute()
    assert "_grader_" in "".join(test.outputs[0].traceback), (
        "the kernel's traceback shows the test as it ran"
    )
    # the graded notebook holds the test as written (nbgrader's OverwriteCells)
    test.source = WRITTEN_TEST
    shown = "\n".join(
        hints.teach(redact(nb, set()), "99_hints", prelude=3).cells[-1].outputs[0].traceback
    )
    assert "_grader_" not in shown and "__import__" not in shown and "pathlib" not in shown, shown
    # the call, then the assert in check
    assert re.findall(r"Cell In\[\d+\], line (\d+)", shown) == ["9", "6"], shown
    assert "----> 9 check(devices[1])" in shown, shown
    assert (
        '----> 6     assert device == torch.device("cpu"), f"{device} is not the CPU"' in shown
    ), shown
    assert "      5     # a comment the grader's copy of the test does not keep" in shown, shown
    assert shown.endswith("AssertionError: meta is not the CPU"), shown


def test_a_visible_test_that_shares_lines_with_its_hidden_tests_is_shown_as_written(tmp_path):
    """A hidden test that repeats a line of the visible test (as 02's Standardize tests do): the
    student's run ran the test without its hidden part; the failed assert is shown as written, with
    the shared line unredacted (it was redacted, and the frame then shown as the grader ran it,
    operator.eq and all), the hidden part left out."""
    from autograder.course.cells import HIDDEN, hidden_test_lines
    from autograder.prepare.job import strict_comparisons
    from autograder.record.feedback import as_shown

    guard = "_grader_0123456789abcdef"
    written = (
        "def check(x):\n    shared_value = x * 2\n    ### BEGIN HIDDEN TESTS\n"
        '    assert shared_value != 5, "the secret check"\n    ### END HIDDEN TESTS\n'
        '    assert shared_value == 3, "twice x is 3"\n\ncheck(1)\n'
    )
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell(f"def {guard}():\n    pass"))
    nb.cells.append(nbformat.v4.new_markdown_cell("## Exercise 1 (1 point): twice"))
    test = nbformat.v4.new_code_cell(
        f"{guard}()\n{strict_comparisons(HIDDEN.sub('', written), guard)}"
    )
    test.metadata["nbgrader"] = {
        "grade": True,
        "solution": False,
        "locked": True,
        "grade_id": "twice",
        "points": 1,
        "schema_version": 3,
    }
    nb.cells.append(test)
    nb.cells.append(nbformat.v4.new_code_cell("shared_value = 2 * 2  # a student's line"))
    nb.cells[-1].metadata["nbgrader"] = {"solution": True, "grade": False, "grade_id": "answer"}
    NotebookClient(
        nb,
        timeout=60,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(tmp_path)}},
    ).execute()
    test.source = written  # the graded notebook holds the test as written, hidden part and all
    nb.cells[-1].source = (
        written.split("\n")[3] + "  # an answer with a hidden line in it stays secret"
    )
    hidden = hidden_test_lines(nb)
    assert hidden == {'assert shared_value != 5, "the secret check"'}, hidden
    shown = as_shown(nb, "99_hints", 1, hidden).cells[2]
    traceback = "\n".join(shown.outputs[0].traceback)
    assert '----> 3     assert shared_value == 3, "twice x is 3"' in traceback, traceback
    assert "      2     shared_value = x * 2" in traceback, traceback
    assert (
        "redacted" not in traceback and "operator" not in traceback and "secret" not in shown.source
    ), traceback


def test_a_frame_that_matches_no_test_line_keeps_its_lines_with_the_checks_named_plainly():
    frame = (
        "Cell In[3], line 2\n      1 x = 1\n----> 2 assert"
        " __import__('builtins').__dict__.get('_grader_ab12', "
        "__import__('operator')).eq(x, 2) and __import__('builtins').__dict__.get('_grader_ab12', "
        "__import__('importlib').import_module('torch.testing')).assert_close(x, 2)"
    )
    assert (
        hints.frame_as_written(frame, "y = 3\n") == "Cell In[3], line 2\n      1 x = 1\n"
        "----> 2 assert operator.eq(x, 2) and torch.testing.assert_close(x, 2)"
    )


def _frame(ran: list[str], failing: int, before: int = 4, after: int = 3) -> str:
    """A frame of cell 7 as IPython shows it: the lines around ``failing`` of ``ran``, their common
    indentation taken out."""
    numbers = range(max(1, failing - before), min(len(ran), failing + after) + 1)
    indent = min(len(ran[n - 1]) - len(ran[n - 1].lstrip()) for n in numbers if ran[n - 1].strip())
    return "\n".join(
        [f"Cell In[7], line {failing}"]
        + [hints._context_line(n, ran[n - 1][indent:], n == failing) for n in numbers]
    )


STEPS = "def step():\n    assert False\n\n" + "step()\n" * 8
DECORATED = "import functools\n@functools.lru_cache(undefined)\ndef f():\n    pass\n"


@pytest.mark.parametrize(
    "source, failing, occurrence, line",
    [
        (
            STEPS,
            "step()",
            6,
            9,
        ),  # the sixth step() of eight alike: only the grader's own line count tells which
        (
            WRITTEN_TEST,
            "    assert ",
            1,
            6,
        ),  # inside check: IPython shows those lines without their indentation
        (DECORATED, "@functools", 1, 2),  # a decorator's line
    ],
    ids=["repeated lines", "indented", "decorator"],
)
def test_a_frame_is_mapped_by_the_graders_own_line_count(source, failing, occurrence, line):
    from autograder.prepare.job import strict_comparisons, test_prelude

    prelude = test_prelude("_grader_0123456789abcdef", "import torch")
    ran = (prelude + strict_comparisons(source, "_grader_0123456789abcdef")).split("\n")
    ran_line = [n for n, text in enumerate(ran, start=1) if text.startswith(failing)][
        occurrence - 1
    ]
    frame = _frame(ran, ran_line)
    mapped = hints.frame_as_written(frame, source, prelude.count("\n"))
    assert mapped.split("\n")[0] == f"Cell In[7], line {line}", mapped
    arrow = next(row for row in mapped.split("\n") if "> " in row)
    assert arrow.split("> ", 1)[1] == f"{line} {source.split(chr(10))[line - 1].rstrip()}", mapped
    if source is STEPS:  # without the count, two offsets fit: the frame keeps its own lines
        assert hints.frame_as_written(frame, source) == frame


def test_a_students_cell_called_by_a_test_keeps_its_frame(tmp_path):
    """Only the test's own frames are mapped to the test; a frame of the student's cell it called is
    left as is."""
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_markdown_cell("## Exercise 1 (1 point): answer"))
    nb.cells.append(
        nbformat.v4.new_code_cell(
            "def _grader_0123456789abcdef():\n    pass\n\ndef answer():\n    return 1 / 0"
        )
    )
    test = nbformat.v4.new_code_cell("_grader_0123456789abcdef()\n\nanswer()")
    test.metadata["nbgrader"] = {
        "grade": True,
        "solution": False,
        "locked": True,
        "grade_id": "t",
        "points": 1,
        "schema_version": 3,
    }
    nb.cells.append(test)
    NotebookClient(
        nb,
        timeout=60,
        kernel_name="python3",
        allow_errors=True,
        resources={"metadata": {"path": str(tmp_path)}},
    ).execute()
    test.source = "answer()"
    shown = "\n".join(
        hints.teach(redact(nb, set()), "99_hints", prelude=2).cells[-1].outputs[0].traceback
    )
    assert "Cell In[2], line 1\n----> 1 answer()" in shown, shown  # the test's frame, as written
    assert (
        "Cell In[1], line 5, in answer()\n      4 def answer():\n----> 5     return 1 / 0" in shown
    ), shown  # as it ran
