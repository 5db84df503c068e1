"""make gpu-check: run the course and its grader on a real GPU, and write what happened.

``python -m autograder gpu-check`` runs the checks of :data:`CHECKS` in order (``--only`` picks
some) and writes ``docs/gpu-log.md``; without CUDA it stops and says so. ``--dry-run`` rehearses on
the CPU: what needs no GPU runs, the rest is marked not run, and the report goes to
``build/gpu-report-dry-run.md``.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Callable

import torch

from autograder.course.config import tool_env
from devcourse.instructor.gpucluster import check_cluster
from devcourse.instructor.gpureport import (
    DRY_RUN_REPORT,
    GPU_REPORT,
    WORKDIR,
    Check,
    Context,
    render,
)
from devcourse.instructor.paths import ROOT

__all__ = ["CHECKS", "DRY_RUN_REPORT", "GPU_REPORT", "STEPS", "Check", "Context", "render", "run"]

STEPS = ("environment", "notebooks", "grading", "ddp", "amp", "loading", "cluster", "mistakes")
MISTAKES_TESTS = ROOT / "tests" / "mistakes" / "test_mistakes.py"


def check_environment(ctx: Context) -> Check:
    """GPU names and memory, driver, torch, CUDA and cuDNN versions."""
    from autograder.run.bytecode import advice, uncompiled

    missing = uncompiled()
    rows = [
        ("python", platform.python_version()),
        ("torch", torch.__version__),
        ("CUDA (torch build)", str(torch.version.cuda)),
        ("cuDNN", str(torch.backends.cudnn.version()) if ctx.cuda else "n/a"),
        ("driver", _driver_version()),
        ("GPUs", str(torch.cuda.device_count() if ctx.cuda else 0)),
        ("bytecode", f"none for {', '.join(missing)}" if missing else "compiled"),
    ]
    for i in range(torch.cuda.device_count() if ctx.cuda else 0):
        props = torch.cuda.get_device_properties(i)
        rows.append(
            (
                f"cuda:{i}",
                (
                    f"{props.name}, {props.total_memory / 2**30:.1f} GiB, "
                    f"compute capability {props.major}.{props.minor}"
                ),
            )
        )
    table = ["| what | value |", "|---|---|", *(f"| {k} | {v} |" for k, v in rows)]
    if missing:
        table += ["", *advice(missing)]
    pinned = pinned_torch()
    if pinned and torch.__version__.split("+")[0] != pinned:
        table += [
            "",
            (
                f"The course pins torch {pinned} (requirements.txt); this machine's"
                f" {torch.__version__} is used as it is, so a cell that shows something that"
                " changed between the two versions can differ from its stored output here."
            ),
        ]
    if ctx.cuda:
        return Check(
            "environment",
            "passed",
            f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}",
            table,
        )
    return Check("environment", "not run", "no CUDA device: this is not a GPU machine", table)


def pinned_torch() -> str | None:
    """The torch version requirements.txt pins (``torch==X``), or None."""
    for line in (ROOT / "requirements.txt").read_text().splitlines():
        if line.startswith("torch=="):
            return line.split("==", 1)[1].strip()
    return None


def _driver_version() -> str:
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown (no nvidia-smi)"
    return (
        done.stdout.strip().splitlines()[0]
        if done.returncode == 0 and done.stdout.strip()
        else "unknown"
    )


def _junit_cases(junit: Path) -> list[tuple[str, str, str | None]]:
    """Each test case of a pytest JUnit XML file: (class name, test name, None if it passed else its
    message)."""
    import xml.etree.ElementTree as ET

    cases = []
    if junit.exists():
        for case in ET.parse(junit).getroot().iter("testcase"):
            problem = case.find("failure")
            problem = case.find("error") if problem is None else problem
            message = (
                None
                if problem is None
                else (problem.get("message") or problem.text or "failed").strip()
            )
            cases.append((case.get("classname", "?"), case.get("name", "?"), message))
    return cases


def check_notebooks(ctx: Context) -> Check:
    """Every solution notebook run by nbval against its stored outputs, through the CPU's sanitize
    file."""
    junit = WORKDIR / "nbval.xml"
    junit.unlink(missing_ok=True)  # what an earlier run found is not this run's
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-q",
        "solutions",
        f"--junitxml={junit}",
    ]
    processes = min(8, (os.cpu_count() or 1) // 2)
    # a notebook per process, as make test runs them (pytest-xdist, one file per process)
    if processes >= 2:
        command += ["-n", str(processes), "--dist", "loadfile"]
    done = subprocess.run(command, cwd=ROOT, env=tool_env(), capture_output=True, text=True)
    per_notebook: dict[str, list[int]] = {}
    failures = []
    for classname, name, message in _junit_cases(junit):
        # nbval's class name is the notebook's path with dots: solutions.NN_topic.NN_topic.ipynb
        notebook = classname.removesuffix(".ipynb").split(".")[-1]
        counts = per_notebook.setdefault(notebook, [0, 0])
        counts[0 if message is None else 1] += 1
        if message is not None:
            failures.append(f"{notebook} :: {name}")
    table = ["| notebook | cells passed | cells failed |", "|---|---|---|"]
    table += [f"| {nb} | {ok} | {bad} |" for nb, (ok, bad) in sorted(per_notebook.items())]
    if failures:
        table += ["", "Failed cells:", *(f"- {f}" for f in failures)]
    where = "on the GPU" if ctx.cuda else "on the CPU (dry run)"
    status = "passed" if done.returncode == 0 else "failed"
    return Check(
        "notebooks",
        status,
        f"nbval over {len(per_notebook)} notebooks {where}: exit code {done.returncode}",
        table,
    )


def check_mistakes(ctx: Context) -> Check:
    """The mistakes catalog's every round (``make mistakes``), graded by the real grader with this
    machine's device matrix: every mistake must lose points on its exercise and every correct fix
    keep them all."""
    from devcourse.grading import device_matrix

    junit = WORKDIR / "mistakes.xml"
    junit.unlink(missing_ok=True)
    command = [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-q",
        str(MISTAKES_TESTS),
        f"--junitxml={junit}",
    ]
    done = subprocess.run(
        command,
        cwd=ROOT,
        env=dict(tool_env(), COURSE_MISTAKE_ROUNDS="all"),
        capture_output=True,
        text=True,
    )
    cases = _junit_cases(junit)
    devices = ", ".join(str(d) for d in device_matrix("tensor"))
    body = [
        f"Device matrix: {devices}; `COURSE_MISTAKE_ROUNDS=all` (what `make mistakes` runs)",
        "",
        "| test | outcome |",
        "|---|---|",
    ]
    body += [
        f"| {name} | {'passed' if message is None else 'failed'} |" for _, name, message in cases
    ]
    for _, name, message in cases:
        if message is not None:
            body += ["", f"{name}:", "```", message[-3000:], "```"]
    if not cases:  # pytest did not get as far as the tests: its own words say why
        body += ["", "```", (done.stdout + done.stderr)[-3000:], "```"]
    failed = sum(message is not None for _, _, message in cases)
    good = done.returncode == 0 and cases and not failed
    summary = (
        f"{len(cases) - failed} of {len(cases)} tests passed on {devices}: exit code"
        f" {done.returncode}"
    )
    if not ctx.cuda:
        return Check(
            "mistakes", "not run" if good else "failed", "rehearsed on the CPU: " + summary, body
        )
    return Check("mistakes", "passed" if good else "failed", summary, body)


def check_grading(ctx: Context) -> Check:
    """The demo class graded with CUDA in the device matrix, scores compared with
    ``expected_scores.csv``."""
    from autograder import batch
    from autograder.record.report import format_table
    from devcourse.grading import device_matrix
    from devcourse.instructor.demo import unexpected_scores
    from devcourse.instructor.paths import DEMO_CLASS

    results = batch.grade(DEMO_CLASS, WORKDIR / "grade")
    wrong = unexpected_scores(results)
    devices = ", ".join(str(d) for d in device_matrix("tensor"))
    body = [f"Device matrix: {devices}", "", "```", format_table(results), "```"]
    if wrong:
        body += ["", "Scores that differ from expected_scores.csv:", *(f"- {w}" for w in wrong)]
    return Check(
        "grading",
        "failed" if wrong else "passed",
        f"demo class graded on {devices}; {len(wrong)} unexpected scores",
        body,
    )


def _ddp_check(outdir):
    """One DDP run: NCCL with one process per GPU, gloo otherwise; returns what this rank saw.

    Runs inside a worker script written by devcourse.distributed.run_functions, whose
    prelude imports os, torch, dist, nn and DDP; it is never called in this module.
    """
    local = int(os.environ["LOCAL_RANK"])
    use_gpus = torch.cuda.is_available() and torch.cuda.device_count() >= int(
        os.environ["LOCAL_WORLD_SIZE"]
    )
    device = torch.device("cuda", local) if use_gpus else torch.device("cpu")
    if use_gpus:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if use_gpus else "gloo")  # noqa: F821 (the script's prelude imports dist, nn and DDP)
    torch.manual_seed(dist.get_rank())  # noqa: F821
    model = DDP(nn.Linear(64, 8).to(device), device_ids=[local] if use_gpus else None)  # noqa: F821
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(5):
        loss = model(torch.randn(32, 64, device=device)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    everyone = [torch.empty_like(flat) for _ in range(dist.get_world_size())]  # noqa: F821
    dist.all_gather(everyone, flat)  # noqa: F821
    same = all(torch.equal(other, flat) for other in everyone)
    return {
        "rank": dist.get_rank(),  # noqa: F821
        "world": dist.get_world_size(),  # noqa: F821
        "backend": dist.get_backend(),  # noqa: F821
        "device": str(device),
        "same": same,
    }


def check_ddp(ctx: Context) -> Check:
    """A DDP training run with one process per GPU (NCCL), parameters compared across ranks
    afterwards."""
    from devcourse.distributed import run_functions

    gpus = torch.cuda.device_count() if ctx.cuda else 0
    ranks = run_functions([], _ddp_check, nproc_per_node=gpus or 2, timeout_s=300)
    same = all(r["same"] for r in ranks)
    backend = ranks[0]["backend"]
    body = [
        f"- rank {r['rank']} of {r['world']}: {r['backend']} on {r['device']}, "
        f"parameters equal on all ranks: {r['same']}"
        for r in ranks
    ]
    if gpus == 1:
        body.append(
            "- One GPU: world size 1, so NCCL ran but exchanged nothing. A second GPU would"
            " exercise the all-reduce between GPUs and a DistributedSampler split over two devices."
        )
    if not ctx.cuda:
        return Check(
            "ddp",
            "not run" if same else "failed",
            f"rehearsed with {backend} on the CPU, world size {len(ranks)}: NCCL needs GPUs",
            body,
        )
    return Check(
        "ddp",
        "passed" if same and backend == "nccl" else "failed",
        f"{backend}, world size {len(ranks)}, parameters equal across ranks: {same}",
        body,
    )


def check_amp(ctx: Context) -> Check:
    """Training steps in fp32, bf16 autocast and fp16 autocast with GradScaler, on the GPU."""
    from devcourse.ampbench import compare_precision, format_table

    if not ctx.cuda:
        return Check("amp", "not run", "fp16 and bf16 on a GPU need a GPU", [])
    results = compare_precision(ctx.device, steps=50)
    return Check(
        "amp",
        "passed",
        "fp32 against bf16 and fp16 with GradScaler, measured on the GPU",
        ["```", format_table(results), "```"],
    )


def check_loading(ctx: Context) -> Check:
    """The large-checkpoint benchmark, loading straight onto the GPU."""
    from devcourse.loadbench import compare_loading, format_table

    if not ctx.cuda:
        return Check("loading", "not run", "loading onto a GPU needs a GPU", [])
    results = compare_loading(ctx.size_mib, device=str(ctx.device))
    return Check(
        "loading",
        "passed",
        f"{ctx.size_mib} MiB checkpoint loaded onto {ctx.device} four ways",
        ["```", format_table(results), "```"],
    )


CHECKS: dict[str, Callable[[Context], Check]] = {
    "environment": check_environment,
    "notebooks": check_notebooks,
    "grading": check_grading,
    "ddp": check_ddp,
    "amp": check_amp,
    "loading": check_loading,
    "cluster": check_cluster,
    "mistakes": check_mistakes,
}


def run(
    steps: list[str], ctx: Context, after_each: Callable[[list[Check]], None] | None = None
) -> list[Check]:
    """Run each named check; a check that raises is recorded as failed and the rest still run.

    ``after_each`` gets the checks so far after each one (the report is rewritten then, so a run
    stopped half-way keeps what it measured).
    """
    checks = []
    for step in steps:
        print(f"[gpu-check] {step} ...", flush=True)
        started = time.monotonic()
        try:
            check = CHECKS[step](ctx)
        except Exception as exc:  # noqa: BLE001 - a broken check is reported, not fatal
            check = Check(
                step,
                "failed",
                f"{type(exc).__name__}: {exc}".splitlines()[0],
                ["```", traceback.format_exc()[-3000:], "```"],
            )
        check.seconds = time.monotonic() - started
        print(
            f"[gpu-check] {step}: {check.status} in {check.seconds:.0f} s: {check.summary}",
            flush=True,
        )
        checks.append(check)
        if after_each is not None:
            after_each(checks)
    return checks
