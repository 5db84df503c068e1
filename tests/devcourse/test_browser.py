"""The course as students see it: JupyterLab in a real browser.

One JupyterLab server, started from this environment on a free local port with
its own token and settings folders, serves every test here. Debian's Chromium,
driven by Playwright, opens a fresh copy of a student notebook from
``course/``, runs it, works each widget's controls and reads what they show,
and clicks nbgrader's Validate button. The last test plays a student who
types the answers of notebook 02 into the editor.

Screenshots, and JupyterLab's log, go to ``build/browser/``. Run
``make browser`` first if Chromium is missing: without it these tests fail,
they never skip. ``make screenshots`` (``DOCS_SCREENSHOTS=1``) also copies the
pictures the docs show into ``docs/``.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest
from support.lab import (
    ARTIFACTS,
    CELLS,
    COURSE,
    ROOT,
    SECOND,
    Lab,
    chromium,
    keep_for_docs,
    start_lab,
    stop_lab,
)

from autograder.run.watch import alive
from devcourse import validation


@pytest.fixture(scope="session")
def lab(tmp_path_factory):
    """JupyterLab as ``make lab`` starts it (see :func:`start_lab`), stopped at the end of the
    session."""
    server, running = start_lab(tmp_path_factory.mktemp("jupyterlab"))
    try:
        yield running
    finally:
        stop_lab(server)


@pytest.fixture(scope="module")
def browser():
    """Chromium (:func:`support.lab.chromium`), stopped with this file's tests."""
    with chromium() as started:
        yield started


@pytest.fixture
def page(browser, lab, request):
    """A fresh browser page; its screenshot lands in the test's artifact folder whatever the
    outcome."""
    folder = ARTIFACTS / request.node.name
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.set_default_timeout(30 * SECOND)
    tab = context.new_page()
    tab.artifacts = folder
    try:
        yield tab
    finally:
        try:
            tab.screenshot(path=folder / "last.png")
        finally:
            context.close()
            for session in lab.api("GET", "sessions"):  # kernels outlive the page: stop them
                lab.api("DELETE", f"sessions/{session['id']}")


# ---- a notebook in the page ------------------------------------------------------


@dataclass
class Notebook:
    page: object
    path: Path  # the copy on disk
    cells: list  # the notebook as nbformat read it

    def cell(self, source: str):
        """The page's cell whose source is exactly ``source``."""
        matches = [i for i, c in enumerate(self.cells) if c.source == source]
        assert len(matches) == 1, f"expected one cell holding {source!r}, found {len(matches)}"
        return self.cell_at(matches[0])

    def cell_at(self, index: int):
        return self.page.locator(CELLS).nth(index)

    def index_of(self, grade_id: str) -> int:
        return next(
            i
            for i, c in enumerate(self.cells)
            if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id
        )

    def graded_tests(self) -> list[int]:
        return [
            i
            for i, c in enumerate(self.cells)
            if c.metadata.get("nbgrader", {}).get("grade")
            and not c.metadata["nbgrader"].get("solution")
        ]

    def written_answers(self) -> list[int]:
        """Answers that no test checks, graded by hand (Exercise 4 of 00)."""
        return [
            i
            for i, c in enumerate(self.cells)
            if c.metadata.get("nbgrader", {}).get("grade")
            and c.metadata["nbgrader"].get("solution")
        ]

    def first_stub_call(self) -> int:
        """The first code cell after the first answer cell: it calls the answer, still a stub."""
        first_answer = min(
            i for i, c in enumerate(self.cells) if c.metadata.get("nbgrader", {}).get("solution")
        )
        return next(
            i for i, c in enumerate(self.cells) if i > first_answer and c.cell_type == "code"
        )

    def saved(self):
        return nbformat.read(self.path, as_version=4)


def kernel_idle(page):
    """The status bar's kernel item once it reads "Python 3 (ipykernel) | Idle".

    Before the kernel is connected it reads "No Kernel | Initializing", then
    "... | Connecting"; Run All at that time would clear the cells, not run them.
    """
    return page.locator(".jp-StatusBar-TextItem", has_text=re.compile(r"\| Idle$"))


def open_notebook(page, lab: Lab, name: str) -> Notebook:
    """Copy ``course/<name>/<name>.ipynb`` into the server's folder and open it with a started
    kernel."""
    folder = lab.root / page.artifacts.name / name
    shutil.copytree(ROOT / "course" / name, folder)
    path = folder / f"{name}.ipynb"
    relative = path.relative_to(lab.root).as_posix()
    # A workspace per test, so that no test reopens the notebooks of the one before.
    page.goto(f"{lab.url}/lab/workspaces/{page.artifacts.name}/tree/{relative}?token={lab.token}")
    notebook = Notebook(page, path, nbformat.read(path, as_version=4).cells)
    page.locator(CELLS).nth(len(notebook.cells) - 1).wait_for()
    kernel_idle(page).wait_for(timeout=120 * SECOND)
    assert page.locator(CELLS).count() == len(notebook.cells)
    return notebook


def run_all(notebook: Notebook) -> list[tuple[int, str | None, str]]:
    """Run > Run All Cells, wait until the run has stopped, and return ``(index, prompt count,
    output)`` per code cell.

    JupyterLab sends one cell at a time, and lets a cell tagged ``raises-exception``
    fail and goes on. In a student notebook the first other error is the stub's
    NotImplementedError, in the "try it" cell after the first answer cell: that
    cell ends the run, and the cells after it are never run.
    """
    page = notebook.page
    page.get_by_role("menuitem", name="Run", exact=True).click()
    page.get_by_role("menuitem", name="Run All Cells", exact=True).click()
    # The stop cell has its number and no cell shows [*] (queued or running) any more.
    try:
        page.wait_for_function(
            """([selector, stop]) => {
                const prompts = [...document.querySelectorAll(selector)].map(
                    cell => cell.querySelector('.jp-InputArea-prompt')?.textContent ?? '');
                return /\\[\\d+\\]/.test(prompts[stop]) && !prompts.some(p => p.includes('*'));
            }""",
            arg=[CELLS, notebook.first_stub_call()],
            timeout=120 * SECOND,
        )
    except Exception:  # noqa: BLE001 - whatever ended the wait, the prompts say where the run stopped
        prompts = page.locator(f"{CELLS} .jp-InputArea-prompt").all_inner_texts()
        raise AssertionError(
            f"Run All did not reach cell {notebook.first_stub_call()} within 120 s; "
            f"the prompts read {prompts}"
        ) from None
    kernel_idle(page).wait_for()
    states = []
    for i, cell in enumerate(notebook.cells):
        if cell.cell_type != "code":
            continue
        element = notebook.cell_at(i)
        count = re.search(r"\[(\d+)\]", element.locator(".jp-InputArea-prompt").inner_text())
        states.append(
            (i, count and count.group(1), element.locator(".jp-Cell-outputArea").inner_text())
        )
    return states


def assert_run_stopped_at_the_first_stub(notebook: Notebook, states) -> None:
    """Every cell before the first stub call ran, error demonstrations showing their errors; none
    after it."""
    stop = notebook.first_stub_call()
    for i, count, output in states:
        tags = notebook.cells[i].metadata.get("tags", [])
        if i < stop:
            assert count is not None, f"cell {i} before the first stub did not run"
            assert "Traceback" not in output or "raises-exception" in tags, (
                f"cell {i} failed:\n{output}"
            )
            if "raises-exception" in tags:
                assert "Error" in output, f"cell {i} should show its error:\n{output}"
        elif i == stop:
            assert count is not None and "NotImplementedError" in output, (
                f"cell {i} should fail on the stub:\n{output}"
            )
        else:
            assert count is None, f"cell {i} ran after the run should have stopped"


def wait_for_text(locator, expected: str, timeout: float = 30) -> str:
    """Wait until the element's text is ``expected`` (trailing blanks aside) and return it."""
    deadline = time.monotonic() + timeout
    while True:
        text = locator.inner_text().rstrip()
        if text == expected.rstrip():
            return text
        if time.monotonic() > deadline:
            locator.screenshot(path=locator.page.artifacts / "unexpected-text.png")
            raise AssertionError(
                f"after {timeout} s the page shows\n{text}\n\ninstead of\n{expected}"
            )
        time.sleep(0.1)


def validate(notebook: Notebook, picture: str = "") -> tuple[str, list[str]]:
    """Click nbgrader's Validate button; return the dialog's text and the first line of each failed
    cell. The page with the dialog is pictured, as ``picture`` (a picture the docs show) where
    given.

    The dialog lists each failed cell as "The following cell failed:", the
    cell's source, then the error; a graded test's first line is its docstring.
    """
    page = notebook.page
    page.locator(".jp-Toolbar .validate-button").click()
    dialog = page.locator(".jp-Dialog")
    dialog.get_by_text("Validation Results").wait_for(timeout=120 * SECOND)
    # the course's plugin adds what hidden checks are worth
    if dialog.locator(".validation-success").count():
        dialog.locator(".course-hidden-points").wait_for(timeout=10 * SECOND)
    text = dialog.locator(".jp-Dialog-body").inner_text()
    shown = page.artifacts / (
        picture or f"validate-{len(list(page.artifacts.glob('validate-*')))}.png"
    )
    page.screenshot(path=shown)
    if picture:
        keep_for_docs(shown)
    dialog.get_by_role("button", name="Ok").click()
    dialog.wait_for(state="detached")
    failed = [
        part.split("\n", 1)[0] for part in re.split(r"The following cell failed:\s*", text)[1:]
    ]
    return text, failed


# ---- the widgets --------------------------------------------------------------


def test_environment_report_runs_a_test_on_each_device_and_validate_lists_the_open_exercises(
    page, lab
):
    from devcourse.envreport import collect_facts

    notebook = open_notebook(page, lab, "00_environment")
    assert_run_stopped_at_the_first_stub(notebook, run_all(notebook))
    facts = collect_facts()
    panel = notebook.cell("report_widget(facts)").locator(".jp-Cell-outputArea")
    table = panel.locator(".widget-html table").inner_text()
    for key, value in facts.rows():  # the kernel runs on this machine, with this environment
        assert re.search(rf"^{re.escape(key)}\s+{re.escape(value)}$", table, re.M), (
            f"{key} {value} not in\n{table}"
        )

    picker = panel.locator(".widget-dropdown select")
    devices = [str(d) for d in facts.devices()]
    assert picker.locator("option").all_inner_texts() == devices
    output = panel.locator(".widget-output")
    assert output.inner_text().strip() == ""
    lines = []
    for device in devices + devices[:1]:  # each device, then the first again
        picker.select_option(device)
        panel.get_by_role("button", name="Run a test").click()
        lines.append(
            rf"{re.escape(device)}: 256x256 matmul ran, result on {re.escape(device)}, \d+\.\d ms"
        )
        deadline = time.monotonic() + 30
        while not re.fullmatch("\n".join(lines), output.inner_text().strip()):
            assert time.monotonic() < deadline, (
                f"expected {len(lines)} test lines, the output shows\n{output.inner_text()}"
            )
            time.sleep(0.1)
    panel.screenshot(path=page.artifacts / "environment-report.png")

    # The untouched student version: Validate names every graded test as failing, and the written
    # answer that still says YOUR ANSWER HERE (nbgrader gives an unchanged answer 0).
    text, failed = validate(notebook)
    cells = sorted(notebook.graded_tests() + notebook.written_answers())
    assert notebook.written_answers() and failed == [
        notebook.cells[i].source.splitlines()[0] for i in cells
    ], text
    assert text.count("NotImplementedError") >= len(notebook.graded_tests())


def test_map_location_explorer_shows_what_each_choice_loads(page, lab):
    import torch

    from devcourse.explorer import explore

    notebook = open_notebook(page, lab, "04_map_location")
    assert_run_stopped_at_the_first_stub(notebook, run_all(notebook))
    panel = notebook.cell("map_location_explorer()").locator(".jp-Cell-outputArea")
    saved_on, choice = panel.locator(".widget-dropdown select").all()
    result = panel.locator(".widget-html pre")

    shown = wait_for_text(result, explore("cuda:1", "None"))
    if not torch.cuda.is_available():
        assert "RuntimeError: Attempting to deserialize object on a CUDA device" in shown
    # Each choice, with what the lesson says it does wherever it runs: the tensors' devices.
    for where, how, devices in [
        ("cuda:1", "'cpu'", {"cpu"}),
        ("cuda:1", "{'cuda:0': 'cpu'}", None),  # a tag the dict does not name goes back to cuda:1
        ("cuda:0", "lambda storage, location: storage", {"cpu"}),
        ("cpu", "'meta'", {"meta"}),
        ("cuda:1", "{'cuda:1': 'cpu'}", {"cpu"}),
    ]:
        saved_on.select_option(where)
        choice.select_option(how)
        before, shown = shown, wait_for_text(result, explore(where, how))
        assert shown != before
        if devices:
            assert {
                line.split()[1]
                for line in shown.splitlines()[1:]
                if not line.startswith("  the callable")
            } == devices
    assert "location=['cuda:0']" in explore("cuda:0", "lambda storage, location: storage")
    notebook.cell("map_location_explorer()").screenshot(
        path=page.artifacts / "map_location_explorer.png"
    )
    keep_for_docs(page.artifacts / "map_location_explorer.png")


def _columns(text: str) -> list[list[str]]:
    return [line.split() for line in text.splitlines()]


def test_inspector_filters_the_table_and_flags_the_new_head(page, lab):
    notebook = open_notebook(page, lab, "02_cross_device_errors")
    assert_run_stopped_at_the_first_stub(notebook, run_all(notebook))
    printed = notebook.cell(
        "from devcourse.inspector import inspect_text, inspector_widget\n\n"
        "print(inspect_text(model))"
    )
    everything = _columns(printed.locator(".jp-Cell-outputArea").inner_text().strip())
    panel = notebook.cell("inspector_widget(model)").locator(".jp-Cell-outputArea")
    table = panel.locator(".widget-html pre")
    assert _columns(table.inner_text()) == everything

    expected = {
        "parameters": [row for row in everything if row[1] == "parameter"],
        "buffers": [row for row in everything if row[1] == "buffer"],
        "odd ones": [row for row in everything if "<-" in row],
        "all": everything,
    }
    for show, rows in expected.items():
        before = table.inner_text()
        panel.get_by_role("button", name=show, exact=True).click()
        deadline = time.monotonic() + 30
        while _columns(table.inner_text()) != rows:
            assert time.monotonic() < deadline, f"'{show}' shows\n{table.inner_text()}"
            time.sleep(0.1)
        assert table.inner_text() != before
        if show == "odd ones":
            panel.screenshot(path=page.artifacts / "inspector-odd-ones.png")
    # The lesson's point: the head created after .to(sim0) is the odd one out.
    assert [row[0] for row in expected["odd ones"]] == ["3.weight", "3.bias"]
    assert all("on cpu, the rest on sim:0" in " ".join(row) for row in expected["odd ones"])


# ---- a student at work ------------------------------------------------------------


SOLUTION_02 = ROOT / "solutions" / "02_cross_device_errors" / "02_cross_device_errors.ipynb"


def _solution(grade_id: str) -> tuple[str, list[list[str]]]:
    """The answer cell ``grade_id`` as a student completes it (no solution markers), and its answer
    blocks."""
    solutions = nbformat.read(SOLUTION_02, as_version=4)
    cell = next(
        c for c in solutions.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id
    )
    lines = cell.source.splitlines()
    begins = [i for i, line in enumerate(lines) if line.strip() == "### BEGIN SOLUTION"]
    ends = [i for i, line in enumerate(lines) if line.strip() == "### END SOLUTION"]
    blocks = [lines[b + 1 : e] for b, e in zip(begins, ends)]
    answered = "\n".join(
        line for line in lines if line.strip() not in ("### BEGIN SOLUTION", "### END SOLUTION")
    )
    return answered, blocks


def type_lines(page, lines: list[str]) -> None:
    """Type ``lines`` at the cursor, the first one as it stands after the cursor's indentation.

    The editor indents each new line by itself; selecting back to the line's
    start before typing the next line lets the typed indentation stand.
    """
    for n, line in enumerate(lines):
        if n:
            page.keyboard.press("Enter")
            page.keyboard.press("Shift+Home")
        page.keyboard.type(line if n else line.lstrip())


def select_line_text(cell, text: str, lines: int = 1) -> None:
    """Put the cursor in the line holding ``text`` and select from its indentation to the end of the
    ``lines``-th line."""
    page = cell.page
    cell.locator(".cm-line", has_text=text).first.click()
    page.keyboard.press("End")
    page.keyboard.press("Home")  # from the line's end, Home stops where its indentation ends
    for _ in range(lines - 1):
        page.keyboard.press("Shift+ArrowDown")
    page.keyboard.press("Shift+End")


def answer(notebook: Notebook, grade_id: str, blocks: list[list[str]]) -> None:
    """Replace each stub of the answer cell, in order, by typing a block of the solution."""
    cell = notebook.cell_at(notebook.index_of(grade_id))
    for block in blocks:
        # the comment and `raise NotImplementedError()`
        select_line_text(cell, "# YOUR CODE HERE", lines=2)
        type_lines(notebook.page, block)


def test_student_types_the_answers_validates_and_sees_a_broken_answer_named(page, lab):
    notebook = open_notebook(page, lab, "02_cross_device_errors")
    solutions = {
        grade_id: _solution(grade_id)
        for grade_id in ("find_misplaced", "standardize", "prepare_batch")
    }
    for grade_id, (_, blocks) in solutions.items():
        answer(notebook, grade_id, blocks)
    # the notebook, full width
    page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current").click()
    # Validate saves the notebook first
    text, failed = validate(notebook, picture="students-validate.png")
    saved = notebook.saved()
    for grade_id, (answered, _) in solutions.items():
        assert saved.cells[notebook.index_of(grade_id)].source == answered, (
            f"{grade_id} is not what was typed"
        )
    success, *hidden = [line for line in text.strip().splitlines() if line.strip()]
    assert success == "Success! Your notebook passes all the tests.", text
    expected = validation.message(
        nbformat.read(COURSE / "02_cross_device_errors" / "02_cross_device_errors.ipynb", 4)
    )
    assert [line.strip() for line in hidden] == [line.strip() for line in expected], text
    assert (
        hidden[0].startswith("When graded, hidden checks also run") and "Exercise " in hidden[1]
    ), text

    # The lesson's classic slip: the label made from the data.
    right = "return data.to(device, non_blocking=True), label.to(device, non_blocking=True)"
    wrong = "return data.to(device, non_blocking=True), data.to(device, non_blocking=True)"
    assert right in solutions["prepare_batch"][0]
    select_line_text(notebook.cell_at(notebook.index_of("prepare_batch")), right)
    type_lines(page, [wrong])
    text, failed = validate(notebook)
    assert notebook.saved().cells[notebook.index_of("prepare_batch")].source == solutions[
        "prepare_batch"
    ][0].replace(right, wrong)
    keeps_the_label = notebook.cells[
        notebook.index_of("prepare_batch_keeps_the_label")
    ].source.splitlines()[0]
    assert failed == [keeps_the_label], text
    assert "AssertionError" in text


def test_the_students_lab_has_the_assignment_list_and_validate_but_no_instructor_tools(page, lab):
    def status(path: str) -> int:
        request = urllib.request.Request(
            f"{lab.url}/{path}", headers={"Authorization": f"token {lab.token}"}
        )
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return response.status
        except urllib.error.HTTPError as error:
            return error.code

    assert status("formgrader") == 404, "the formgrader's server extension is on"
    assert status("assignments?course_id=") != 404, "the Assignment List's server extension is off"
    notebook = open_notebook(page, lab, "00_environment")
    assert notebook.page.locator(".jp-Toolbar .validate-button").count() == 1
    page.get_by_role("menuitem", name="Nbgrader").click()
    menu = page.locator("#jp-mainmenu-nbgrader")
    menu.get_by_text("Assignment List").wait_for()
    page.screenshot(path=page.artifacts / "nbgrader-menu.png")
    items = [
        text.strip()
        for text in menu.locator(".lm-Menu-itemLabel").all_inner_texts()
        if text.strip()
    ]
    assert items == ["Assignment List"], items
    assert page.locator(".jp-SideBar").get_by_text("Create Assignment").count() == 0, (
        "the Create Assignment panel"
    )


def test_jupyterlab_stops_when_the_test_process_is_killed(tmp_path):
    """A test run that is killed outright (SIGKILL) leaves no JupyterLab running."""
    child_code = f"""
import os, signal, sys
from pathlib import Path
sys.path.insert(0, {str(Path(__file__).resolve().parents[1])!r})
from support.lab import start_lab
server, lab = start_lab(Path(sys.argv[1]))
print(server.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""
    child = subprocess.run(
        [sys.executable, "-c", child_code, str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == -signal.SIGKILL, child.stderr
    pid = int(child.stdout.split()[0])
    deadline = time.monotonic() + 30
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive(pid):
        os.killpg(pid, signal.SIGKILL)
        raise AssertionError("JupyterLab outlived the process that started it")
