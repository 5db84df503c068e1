"""The documentation site, as ``make docs`` builds it: strict (a warning, a broken link or anchor, a
missing page fails it), the lessons shown without their answers, and the site opened in Chromium.

The site is built once for the module (mkdocs build --strict into a temporary folder); every test
reads it. The leak check (tools/lessons.py) looks for every line of a solution or a hidden test that
no student's notebook shows, in every page and in the search index; a copy of a page with one such
line planted in it shows that the check finds it.
"""

from __future__ import annotations

import html
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
import yaml
from support.lab import CHROMIUM, CHROMIUM_ARGS, SECOND
from support.system import missing

from autograder.course.cells import is_answer, is_test

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("lessons", ROOT / "tools" / "lessons.py")
lessons = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lessons)


def mkdocs_build(config: Path, site: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mkdocs",
            "build",
            "--strict",
            "--config-file",
            str(config),
            "--site-dir",
            str(site),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("site") / "site"
    done = mkdocs_build(ROOT / "mkdocs.yml", folder)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "WARNING" not in done.stderr, done.stderr[-4000:]
    return folder


def test_every_page_of_the_nav_is_built(site):
    nav = yaml.safe_load((ROOT / "mkdocs.yml").read_text())["nav"]

    def pages(entries):
        for entry in entries:
            value = entry if isinstance(entry, str) else next(iter(entry.values()))
            yield from (pages(value) if isinstance(value, list) else [value])

    for page in pages(nav):
        built = site / (
            "index.html" if page == "index.md" else f"{page.rsplit('.', 1)[0]}/index.html"
        )
        assert built.is_file(), f"{page} was not built"
    assert len(list((site / "lessons").glob("*/index.html"))) == len(lessons.assignments()) == 10


def test_the_lessons_show_the_exercises_as_the_student_sees_them(site):
    """The pages the site built: answers and tests as course/ has them and without output; lesson
    outputs shown."""
    shown = 0
    for name in lessons.assignments():
        page = nbformat.read(lessons.OUT / f"{name}.ipynb", as_version=4)
        student = nbformat.read(ROOT / "course" / name / f"{name}.ipynb", as_version=4)
        for ours, theirs in zip(page.cells, student.cells, strict=True):
            assert ours.source == theirs.source, f"{name}: a cell differs from the student's"
            if ours.cell_type == "code" and (is_answer(theirs) or is_test(theirs)):
                assert not ours.outputs, f"{name}: an answer or test cell shows an output"
            shown += ours.cell_type == "code" and bool(ours.outputs)
    assert shown > 200  # the lessons' own outputs, from the executed solutions


def test_no_line_of_a_solution_or_of_a_hidden_test_reaches_the_site(site, tmp_path):
    secrets = lessons.secrets()
    assert len(secrets) > 500, "the check looks for too few lines to mean anything"
    assert lessons.leaks(site) == []

    # Planted in a copy of a page, a solution line is found.
    line, name = next(
        (line, name) for line, name in secrets.items() if name == "01_device_placement"
    )
    page = tmp_path / "lessons" / "01_device_placement" / "index.html"
    page.parent.mkdir(parents=True)
    text = (site / "lessons" / "01_device_placement" / "index.html").read_text()
    page.write_text(text.replace("</body>", f"<pre><code>{html.escape(line)}</code></pre></body>"))
    assert lessons.leaks(tmp_path) == [f"lessons/01_device_placement/index.html: {line!r} ({name})"]


def test_a_broken_link_a_missing_page_or_a_notebook_that_does_not_parse_fails_naming_it(
    tmp_path, monkeypatch
):
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text(
        "# Home\n\nSee [the grading page](grading.md#no-such-part) and [gone](gone.md).\n"
    )
    (docs / "grading.md").write_text("# Grading\n")
    config.update(
        docs_dir=str(docs),
        plugins=["search"],
        hooks=[],
        not_in_nav="",
        nav=[{"Home": "index.md"}, {"Grading": "grading.md"}, {"Missing": "missing.md"}],
    )
    (tmp_path / "mkdocs.yml").write_text(yaml.safe_dump(config))
    done = mkdocs_build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0
    for named in ("missing.md", "gone.md", "#no-such-part"):
        assert named in done.stderr, done.stderr

    course = tmp_path / "course" / "00_environment"
    course.mkdir(parents=True)
    (course / "00_environment.ipynb").write_text('{"cells": [')
    monkeypatch.setattr(lessons, "COURSE", tmp_path / "course")
    with pytest.raises(lessons.LessonError, match="00_environment.ipynb does not parse"):
        lessons.write(tmp_path / "out")


def test_the_site_opens_in_chromium(site):
    """The home page and a lesson, from the files, in Debian's Chromium: navigation, the lesson's
    cells and outputs."""
    from playwright.sync_api import sync_playwright

    if not Path(CHROMIUM).exists():
        missing(
            f"no Chromium at {CHROMIUM}: run `make browser`, or point CHROMIUM at a Chromium binary"
        )
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM, args=CHROMIUM_ARGS, timeout=60 * SECOND
        )
        try:
            tab = browser.new_page()
            tab.set_default_timeout(30 * SECOND)
            tab.goto((site / "index.html").as_uri())
            assert "PyTorch device management" in tab.title()
            tab.get_by_role("link", name="Students").first.wait_for()
            tab.goto((site / "lessons" / "02_cross_device_errors" / "index.html").as_uri())
            assert tab.locator(".jp-Cell").count() > 20
            assert tab.locator(".jp-OutputArea-output").count() > 5
            assert tab.get_by_text("raise NotImplementedError()").count() >= 3
        finally:
            browser.close()
