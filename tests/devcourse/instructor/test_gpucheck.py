"""make gpu-check: refuses clearly without CUDA, rehearses on the CPU, never writes CPU results as
GPU ones."""

import re

import pytest
import torch

from devcourse.instructor import gpucheck
from devcourse.instructor import cli

NO_GPU = not torch.cuda.is_available()


@pytest.mark.skipif(not NO_GPU, reason="describes a machine without CUDA")
def test_without_cuda_it_stops_at_once_and_says_why(capsys, tmp_path):
    assert cli.gpu_check(["--report", str(tmp_path / "r.md")]) == 2
    err = capsys.readouterr().err
    assert "needs a CUDA GPU" in err and "--dry-run" in err
    assert not (tmp_path / "r.md").exists()


@pytest.mark.skipif(not NO_GPU, reason="describes a machine without CUDA")
def test_a_dry_run_rehearses_and_marks_gpu_checks_not_run(tmp_path):
    report = tmp_path / "dry.md"
    assert (
        cli.gpu_check(
            ["--dry-run", "--only", "environment,ddp,amp,loading", "--report", str(report)]
        )
        == 0
    )
    text = report.read_text()
    assert text.startswith("# GPU check, dry run on a machine without a GPU")
    assert "Nothing here was measured on a GPU" in text
    assert re.search(
        r"\| ddp \| not run \| \d+ \| rehearsed with gloo on the CPU, world size 2", text
    )
    assert re.search(r"\| amp \| not run \| \d+ \|", text) and re.search(
        r"\| loading \| not run \| \d+ \|", text
    )
    assert "parameters equal on all ranks: True" in text


@pytest.mark.skipif(not NO_GPU, reason="describes a machine without CUDA")
def test_a_dry_run_never_writes_the_gpu_report():
    with pytest.raises(SystemExit):
        cli.gpu_check(["--dry-run", "--only", "environment", "--report", str(gpucheck.GPU_REPORT)])


def test_unknown_checks_are_refused():
    with pytest.raises(SystemExit):
        cli.gpu_check(["--dry-run", "--only", "environment,benchmarks"])


def test_a_check_that_raises_is_reported_as_failed_and_the_rest_run(monkeypatch):
    def broken(ctx):
        raise RuntimeError("no NCCL here")

    monkeypatch.setitem(gpucheck.CHECKS, "amp", broken)
    checks = gpucheck.run(["amp", "environment"], gpucheck.Context(dry_run=True, size_mib=1))
    assert [(c.name, c.status) for c in checks][0] == ("amp", "failed")
    assert checks[0].summary == "RuntimeError: no NCCL here" and checks[1].name == "environment"


def test_report_has_a_summary_table_and_a_section_per_check():
    ctx = gpucheck.Context(dry_run=True, size_mib=1)
    checks = [
        gpucheck.Check("ddp", "passed", "nccl, world size 2", ["- rank 0"]),
        gpucheck.Check("amp", "not run", "no GPU"),
    ]
    text = gpucheck.render(checks, ctx)
    assert (
        "| ddp | passed |  | nccl, world size 2 |" in text
        and "| amp | not run |  | no GPU |" in text
    )
    assert "## ddp: passed" in text and "- rank 0" in text and "## amp: not run" in text


def test_the_report_is_rewritten_after_each_check_so_a_stopped_run_keeps_what_it_measured(
    monkeypatch, tmp_path
):
    report = tmp_path / "r.md"
    seen = []

    def stopped(ctx):
        seen.append(report.read_text())  # what a run stopped here would have left
        raise KeyboardInterrupt

    monkeypatch.setitem(gpucheck.CHECKS, "amp", stopped)
    with pytest.raises(KeyboardInterrupt):
        cli.gpu_check(["--dry-run", "--only", "environment,amp", "--report", str(report)])
    assert "| environment | not run |" in seen[0] and "| amp |" not in seen[0]


def test_make_gpu_check_installs_where_the_sandbox_lets_kernels_import_from(monkeypatch, tmp_path):
    """The sandbox hides the course folder from kernels; a package folder inside it would not come
    back (with GPU_SITE=build/gpu-site, its old place, this fails)."""
    import os
    import re
    import subprocess
    import sys

    from devcourse.instructor.paths import ROOT
    from autograder.run import sandbox

    home = tmp_path / "home"
    dry = subprocess.run(
        ["make", "-n", "gpu-check", f"GPU_PYTHON={sys.executable}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "HOME": str(home)},
    ).stdout
    site = os.path.join(ROOT, re.search(r"--target (\S+)", dry).group(1))  # make runs in ROOT
    pythonpath = re.search(r'PYTHONPATH="([^"]+)"', dry).group(1).split(":")
    assert site == pythonpath[0]
    os.makedirs(site, exist_ok=True)
    monkeypatch.syspath_prepend(site)  # as PYTHONPATH puts it, before the environment's own folders
    assert os.path.realpath(site) in sandbox.python_paths(hide=[str(ROOT)])


def test_the_environment_says_when_torch_is_not_the_pinned_one(monkeypatch):
    assert gpucheck.pinned_torch() == "2.13.0"
    ctx = gpucheck.Context(dry_run=True, size_mib=1)
    assert not any("pins torch" in line for line in gpucheck.check_environment(ctx).details)
    monkeypatch.setattr(torch, "__version__", "2.11.0+cu130")
    assert any(
        "pins torch 2.13.0" in line and "2.11.0+cu130" in line
        for line in gpucheck.check_environment(ctx).details
    )


def test_unexpected_scores_names_each_row_that_differs_from_expected_scores_csv():
    """The comparison gpu-check and slurm-check judge a run by: withheld and ungraded rows as the
    CSV writes them."""
    import csv

    from devcourse.instructor.demo import EXPECTED_SCORES, unexpected_scores
    from autograder.settings import Result

    with EXPECTED_SCORES.open() as handle:
        rows = list(csv.DictReader(handle))
    as_expected = [
        Result(
            r["student"],
            r["assignment"],
            None if r["score"] in ("", "withheld") else float(r["score"]),
            10,
            withheld=r["score"] == "withheld",
        )
        for r in rows
    ]
    assert {r["score"] for r in rows} >= {"", "withheld"}  # both kinds are in the file
    assert unexpected_scores(as_expected) == []
    first = as_expected[0]
    off = Result(first.student, first.assignment, 99.0, 10)
    assert unexpected_scores([off, *as_expected[1:]]) == [
        f"{first.student} / {first.assignment}: got 99, expected {rows[0]['score'] or 'nothing'}"
    ]


def test_the_mistakes_check_reports_each_test_of_the_catalog_and_fails_with_its_message(
    monkeypatch, tmp_path
):
    """A real pytest run with a JUnit file: a failing test fails the check and its message is in the
    report."""
    catalog = tmp_path / "test_catalog.py"
    catalog.write_text(
        "import os\n\n"
        "def test_mistakes_lose_points_on_their_exercise():\n"
        "    assert os.environ['COURSE_MISTAKE_ROUNDS'] == 'all'\n\n"
        "def test_correct_fixes_keep_every_point():\n"
        "    assert False, 'correct fixes that lost points: [(\"sync_each_call\", (0.0, 2.0))]'\n"
    )
    monkeypatch.setattr(gpucheck, "MISTAKES_TESTS", catalog)
    check = gpucheck.check_mistakes(gpucheck.Context(dry_run=True, size_mib=1))
    assert check.status == "failed"
    assert "1 of 2 tests passed on cpu, " in check.summary
    text = "\n".join(check.details)
    assert "| test_mistakes_lose_points_on_their_exercise | passed |" in text
    assert "| test_correct_fixes_keep_every_point | failed |" in text and "sync_each_call" in text

    catalog.write_text(catalog.read_text().replace("assert False, ", "assert True, "))
    check = gpucheck.check_mistakes(gpucheck.Context(dry_run=True, size_mib=1))
    assert (
        check.status == ("not run" if NO_GPU else "passed")
        and "2 of 2 tests passed" in check.summary
    )


def test_the_mistakes_check_says_so_when_pytest_ran_no_test(monkeypatch, tmp_path):
    monkeypatch.setattr(gpucheck, "MISTAKES_TESTS", tmp_path / "missing.py")
    check = gpucheck.check_mistakes(gpucheck.Context(dry_run=True, size_mib=1))
    assert check.status == "failed" and "0 of 0 tests passed" in check.summary
    assert "missing.py" in "\n".join(check.details)  # pytest's own words
