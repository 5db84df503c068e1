"""Feedback for students: nbgrader's HTML, from graded notebooks with the hidden tests taken out.

The graded notebook is the student's own run (phase A of :mod:`autograder.run.runner`), in which no
hidden test ran; :func:`redact` still takes hidden test sources out of every cell and any line of an
output that quotes one, and :func:`autograder.record.hints.teach` rewrites each error for the
student (exercise and points, the student's own frames, a hint for the errors the course teaches).
"""

from __future__ import annotations

import contextlib
import re
import shutil
from pathlib import Path

import jinja2
import nbformat
from nbconvert.exporters import HTMLExporter
from nbconvert.filters.highlight import Highlight2HTML

from autograder.course.cells import HIDDEN, hidden_test_lines, is_test
from autograder.course.directory import CourseError, is_course_dir
from autograder.prepare.job import course_imports, test_prelude
from autograder.record.gradebook import failure_of, grading_environment, nbgrader_api
from autograder.record.hints import strip_ansi, teach
from autograder.run import sandbox


class _CompiledTemplates(jinja2.BytecodeCache):
    """Jinja's compiled templates, kept in this process's memory (Jinja checks each against its
    source)."""

    def __init__(self):
        self.codes: dict[str, bytes] = {}

    def load_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        code = self.codes.get(bucket.key)
        if code is not None:
            bucket.bytecode_from_string(code)

    def dump_bytecode(self, bucket: jinja2.bccache.Bucket) -> None:
        self.codes[bucket.key] = bucket.bytecode_to_string()


TEMPLATES = _CompiledTemplates()

# cells' sources, each with its highlighted HTML (a few kB): some MB at most
_HIGHLIGHTED_MAX = 4096
_HIGHLIGHTED: dict[tuple, str] = {}


class RememberedHighlight(Highlight2HTML):
    """nbconvert's ``highlight_code`` filter, remembering what it made.

    A class's pages have most cells in common (the instructor's text, demos and tests): each source
    is highlighted once per process, for the first page that shows it (pygments is the costly part
    of a page). The HTML depends only on the source, its language (and a cell's ``magics_language``)
    and the formatter's options, which the key holds.
    """

    def __call__(self, source, language=None, metadata=None):
        key = (
            source,
            language or self.pygments_lexer,
            (metadata or {}).get("magics_language"),
            repr(sorted(self.extra_formatter_options.items())),
        )
        html = _HIGHLIGHTED.get(key)
        if html is None:
            html = super().__call__(source, language, metadata)
            if len(_HIGHLIGHTED) >= _HIGHLIGHTED_MAX:
                del _HIGHLIGHTED[next(iter(_HIGHLIGHTED))]
            _HIGHLIGHTED[key] = html
        return html


NO_ALT = "No description has been provided for this image"  # nbconvert's own words
_SKIPPED = re.compile(r"(<script\b.*?</script\s*>|<style\b.*?</style\s*>|<!--.*?-->)", re.S | re.I)
_IMG = re.compile(
    r"""<img((?:\s+[^\s"'>/=]+(?:\s*=\s*(?:"[^"]*"|'[^']*'|[^\s"'>]+))?)*)(\s*/?>)""", re.I
)
_ATTRIBUTE = re.compile(r"""\s+([^\s"'>/=]+)(?:\s*=\s*(?:"[^"]*"|'[^']*'|[^\s"'>]+))?""")


class FeedbackExporter(HTMLExporter):
    """nbgrader's feedback exporter (nbconvert's HTML), made faster; the pages read the same.

    nbgrader makes a new exporter, and nbconvert a new Jinja environment, for every student's
    assignment: the templates are compiled once per process here. After the template, nbconvert
    parses and writes the whole page again with BeautifulSoup to add an alternative text to each
    image without one and ``tabindex`` to the cells of a JupyterLab-styled page; nbgrader's feedback
    template has no such cells, so for its pages the alternative texts are added to the text as it
    is, outside scripts, styles and comments: BeautifulSoup reads the two pages as the same document
    (tested). A page with JupyterLab's cells (another template, configured) gets the same
    BeautifulSoup pass as nbconvert's, over the page already rendered: the template is rendered once
    either way. Set as ``GenerateFeedback.exporter_class`` by
    :func:`autograder.record.gradebook.nbgrader_api`.
    """

    def _create_environment(self) -> jinja2.Environment:
        environment = super()._create_environment()
        environment.bytecode_cache = TEMPLATES
        return environment

    def from_notebook_node(self, nb, resources=None, **kw):
        from nbconvert.exporters.templateexporter import TemplateExporter
        from nbconvert.filters.widgetsdatatypefilter import WidgetsDataTypeFilter

        # HTMLExporter.from_notebook_node's filters, then the template alone
        info = nb.metadata.get("language_info", {})
        lexer = info.get("pygments_lexer", info.get("name", None))
        self.register_filter(
            "highlight_code",
            self.filters.get(
                "highlight_code", RememberedHighlight(pygments_lexer=lexer, parent=self)
            ),
        )
        resources = self._init_resources(resources)
        self.register_filter(
            "filter_data_type",
            WidgetsDataTypeFilter(
                notebook_metadata=self._nb_metadata, parent=self, resources=resources
            ),
        )
        html, resources = TemplateExporter.from_notebook_node(self, nb, resources, **kw)
        if "jp-Notebook" in html:  # cells nbconvert gives a tabindex
            return self._soup_pass(html), resources
        missing = 0

        def with_alt(tag: re.Match) -> str:
            nonlocal missing
            if any(name.lower() == "alt" for name in _ATTRIBUTE.findall(tag.group(1))):
                return tag.group(0)
            missing += 1
            return f'<img{tag.group(1)} alt="{NO_ALT}"{tag.group(2)}'

        parts = _SKIPPED.split(html)
        page = "".join(
            part if index % 2 else _IMG.sub(with_alt, part) for index, part in enumerate(parts)
        )
        if missing:
            self.log.warning("Alternative text is missing on %s image(s).", missing)
        return page, resources

    def _soup_pass(self, html: str) -> str:
        """What HTMLExporter does to a rendered page: alternative texts, and JupyterLab's cells
        focusable."""
        from bs4 import BeautifulSoup

        soup = BeautifulSoup(html, features="html.parser")
        images = soup.select("img:not([alt])")
        for image in images:
            image.attrs["alt"] = NO_ALT
        if images:
            self.log.warning("Alternative text is missing on %s image(s).", len(images))
        for cell in soup.select(
            ".jp-Notebook div.jp-Cell-inputWrapper, .jp-Notebook div.jp-OutputArea-output"
        ):
            cell.attrs["tabindex"] = "0"
        return str(soup)


def redact(nb: nbformat.NotebookNode, hidden: set[str]) -> nbformat.NotebookNode:
    """Remove hidden tests from a graded notebook: sources, tracebacks, and any output that quotes
    them."""

    def clean(text: str) -> str:
        return "\n".join(
            "[hidden test redacted]" if any(h in line for h in hidden) else line
            for line in text.split("\n")
        )

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


def as_shown(nb: nbformat.NotebookNode, assignment: str, prelude: int | None, hidden: set[str]):
    """A graded notebook as its feedback page shows it: redacted, then taught
    (:func:`autograder.record.hints.teach`): a test's frames are of the test as the student's run
    ran it, without its hidden tests, and are mapped to it as written so."""
    return teach(redact(nb, hidden), assignment, prelude)


TAUGHT = ".taught"  # in the work folder: the copies a page is made from, for as long as that takes


def write_feedback(
    api, workdir: Path, pair: tuple[str, str], hidden: set[str], notes: dict
) -> None:
    """nbgrader's feedback HTML for one student's assignment, from autograded notebooks without
    hidden tests.

    The page is made from copies (``.taught/<student>/<assignment>`` in the work folder, removed
    after): the autograded notebooks, the instructor's view in formgrader, stay as they ran,
    whatever becomes of the process making the page.
    """
    student, name = pair
    taught = workdir / TAUGHT / student / name
    shutil.rmtree(taught, ignore_errors=True)  # what a process ended mid-page left
    # New files, not copies of nbgrader's modes: it leaves graded notebooks read-only (444) to their
    # owner too.
    shutil.copytree(workdir / "autograded" / student / name, taught, copy_function=shutil.copyfile)
    try:
        for path in taught.glob("*.ipynb"):
            nb = nbformat.read(path, as_version=4)
            nbformat.write(
                as_shown(nb, name, prelude_lines(workdir / "source" / name / path.name), hidden),
                path,
            )
        directory = api.coursedir.autograded_directory
        api.coursedir.autograded_directory = TAUGHT
        try:
            outcome = api.generate_feedback(name, student, force=True)
        finally:
            api.coursedir.autograded_directory = directory
    finally:
        shutil.rmtree(taught, ignore_errors=True)
        for folder in (taught.parent, taught.parent.parent):
            with contextlib.suppress(OSError):
                folder.rmdir()  # if no other page is being made
    if not outcome["success"]:
        notes.setdefault(pair, []).append("no feedback: " + failure_of(outcome))


def page_notes(api, workdir: Path, pair: tuple[str, str], hidden: set[str]) -> list[str]:
    """:func:`write_feedback` for one pair, returning its notes: a page that cannot be made, by
    nbgrader's account or by an exception, is a note (``no feedback: ...``), and the class goes
    on."""
    notes: dict = {}
    try:
        write_feedback(api, workdir, pair, hidden, notes)
    except Exception as error:  # noqa: BLE001 - any failure is a note, and the class goes on
        notes.setdefault(pair, []).append(
            f"no feedback: {type(error).__name__}: {sandbox.last_line(str(error))}"
        )
    return notes.get(pair, [])


_PRELUDES: dict[tuple[str, int], int | None] = {}


def prelude_lines(source: Path) -> int | None:
    """How many lines the grader ran before each test of the notebook ``source`` (the instructor's):
    :func:`autograder.prepare.job.test_prelude` with its imports; None where the notebook is not
    there."""

    try:
        key = (str(source), source.stat().st_mtime_ns)
    except OSError:
        return None
    if key not in _PRELUDES:
        _PRELUDES[key] = test_prelude(
            "_", course_imports(nbformat.read(source, as_version=4))
        ).count("\n")
    return _PRELUDES[key]


def regenerate(
    course: Path, assignment: str, students: list[str] | None = None
) -> dict[tuple[str, str], list[str]]:
    """Feedback again for an assignment of a course directory, with the gradebook's scores as they
    are now.

    For after a review in formgrader: nbgrader's feedback shows the scores and
    comments formgrader saved, and the errors are taught as in the grader's own
    feedback. Returns notes per (student, assignment) that got none.
    """

    course = Path(course).resolve()
    if not is_course_dir(course):
        raise CourseError(f"{course} is not a course directory (no nbgrader_config.py)")
    source = course / "source" / assignment
    if not source.is_dir():
        raise CourseError(f"no assignment named {assignment} in {course / 'source'}")
    graded = sorted(
        p.parent.name for p in (course / "autograded").glob(f"*/{assignment}") if p.is_dir()
    )
    unknown = sorted(set(students or ()) - set(graded))
    if unknown:
        raise CourseError(
            f"{', '.join(unknown)} has no graded {assignment} in {course / 'autograded'}"
        )
    hidden = set().union(
        *(hidden_test_lines(nbformat.read(p, as_version=4)) for p in source.glob("*.ipynb"))
    )
    notes: dict[tuple[str, str], list[str]] = {}
    with grading_environment():
        api = nbgrader_api(course)
        for student in students or graded:
            write_feedback(api, course, (student, assignment), hidden, notes)
    return notes
