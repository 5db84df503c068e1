"""The benchmarks page's table, as the scripts write it with ``--write-page`` (benchmarks/page.py):
one script's row replaced in a copy of the page, the rest of the page as it was; no benchmark is
run."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "benchmarks.md"
_spec = importlib.util.spec_from_file_location("benchmark_page", ROOT / "benchmarks" / "page.py")
page = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(page)

SCRIPTS = sorted(path for path in (ROOT / "benchmarks").glob("*.py") if path.name != "page.py")


def test_a_scripts_row_is_replaced_and_the_rest_of_the_page_is_unchanged(tmp_path):
    copy = tmp_path / "benchmarks.md"
    copy.write_text(PAGE.read_text())
    before = copy.read_text().splitlines()

    page.write_row(
        str(ROOT / "benchmarks" / "simulated_device.py"),
        "sim:0 / cpu: 2.50x | all",
        page=copy,
        ran_on="Linux x86_64, 2 CPUs, PyTorch 2.13.0+cpu",
    )

    after = copy.read_text().splitlines()
    assert len(after) == len(before)
    changed = [i for i, (old, new) in enumerate(zip(before, after)) if old != new]
    assert len(changed) == 1 and "<!-- benchmark:simulated_device -->" in before[changed[0]]
    row = after[changed[0]]
    compares = before[changed[0]].split("|")[2]
    assert row == (
        "| <!-- benchmark:simulated_device --> `benchmarks/simulated_device.py` |"
        + compares
        + "| sim:0 / cpu: 2.50x \\| all | Linux x86_64, 2 CPUs, PyTorch 2.13.0+cpu"
        " <!-- /benchmark:simulated_device --> |"
    )
    assert PAGE.read_text().splitlines() == before  # the page itself untouched


def test_by_default_the_row_names_this_machine(tmp_path):
    copy = tmp_path / "benchmarks.md"
    copy.write_text(PAGE.read_text())
    page.write_row("state_growth", "written whole: 1.00 ms a pair", page=copy)
    row = next(
        line for line in copy.read_text().splitlines() if "<!-- benchmark:state_growth -->" in line
    )
    assert f"{os.cpu_count()} CPUs" in row and "PyTorch" in row


def test_a_missing_marker_is_an_error_naming_the_script(tmp_path):
    copy = tmp_path / "benchmarks.md"
    copy.write_text(PAGE.read_text().replace("<!-- /benchmark:cluster_scale -->", ""))
    with pytest.raises(page.MarkerMissing, match=r"benchmarks/cluster_scale\.py"):
        page.write_row("cluster_scale", "265 s and 158 s: 1.67x", page=copy)
    with pytest.raises(page.MarkerMissing, match=r"benchmarks/no_such_script\.py"):
        page.write_row("no_such_script", "nothing", page=copy)


def test_a_scripts_block_is_replaced_whole_and_the_rest_of_the_page_is_unchanged(tmp_path):
    copy = tmp_path / "benchmarks.md"
    copy.write_text(PAGE.read_text())
    before = copy.read_text()
    start = "<!-- benchmark-block:grading_throughput -->"
    end = "<!-- /benchmark-block:grading_throughput -->"
    assert before.count(start) == 1 and before.count(end) == 1

    for text in ("| a | b |\n|---|---|\n| 1 | 2 |", "one line"):  # longer, then shorter
        page.write_block("grading_throughput", text, page=copy)
        after = copy.read_text()
        assert after.split(start)[0] == before.split(start)[0]
        assert after.split(end)[1] == before.split(end)[1]
        assert after.split(start)[1].split(end)[0] == f"\n\n{text}\n\n"
    copy.write_text(before.replace(end, ""))
    with pytest.raises(page.MarkerMissing, match=r"benchmarks/grading_throughput\.py"):
        page.write_block("grading_throughput", "x", page=copy)


@pytest.mark.parametrize("script", SCRIPTS, ids=[path.stem for path in SCRIPTS])
def test_every_script_has_its_row_and_writes_it_when_asked(script):
    text = PAGE.read_text()
    rows = [line for line in text.splitlines() if f"<!-- benchmark:{script.stem} -->" in line]
    assert (
        len(rows) == 1
        and rows[0].startswith("|")
        and rows[0].endswith(f"<!-- /benchmark:{script.stem} --> |")
    ), f"docs/benchmarks.md: no single table row for {script.name}"
    source = script.read_text()
    assert '"--write-page"' in source and re.search(r"write_row\(\s*__file__,", source), script.name
