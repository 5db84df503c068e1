"""Run DDP code in several processes from a notebook or a test, and clean up after it.

Workers cannot import a notebook's ``__main__``: :mod:`devcourse.rankscript` writes a script of
functions defined anywhere, which :func:`torchrun` starts; :func:`run_functions` (the exercises'
checks) starts the ranks itself (:func:`start_ranks`, forked through :mod:`devcourse.warmstart` on
Linux). On a CPU-only machine all of it runs on the CPU with gloo, or on simulated devices.
Introduced in 07_multi_device_training.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Callable, Sequence

import torch

from devcourse import warmstart
from devcourse.rankscript import write_script

__all__ = [
    "DistributedRunError",
    "RunResult",
    "free_port",
    "rank_errors",
    "run_functions",
    "start_ranks",
    "torchrun",
    "write_script",
]


class DistributedRunError(RuntimeError):
    """A multi-process run that failed or ran out of time; the message holds the end of its output.

    Every run has a wall-time limit; when it is exceeded or a rank dies, every process the run
    started is killed (each run has a process group of its own), so no orphan is left. Which device
    and backend a worker uses is its own code's choice; with ``simulated_devices=N`` a worker that
    finds no accelerator gets N simulated ones.
    """


@dataclass(frozen=True)
class RunResult:
    returncode: int
    output: str  # stdout and stderr of every launcher, interleaved as they came
    seconds: float


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(
    script: str | Path,
    nproc_per_node: int = 2,
    nnodes: int = 1,
    args: Sequence[str] = (),
    timeout_s: float = 120,
    cwd: str | Path | None = None,
) -> RunResult:
    """Run ``script`` with torchrun: ``nnodes`` launchers on this machine, ``nproc_per_node`` ranks
    each.

    With ``nnodes > 1`` each node is a separate torchrun launcher meeting the
    others through the c10d rendezvous on a free port of 127.0.0.1, as
    separate machines would. On Linux each launcher (``python -m
    torch.distributed.run``) is forked from the server that has imported torch
    (:mod:`devcourse.warmstart`; a second less per run on two cores); the
    ranks are the launcher's own processes, started fresh by it, as torchrun
    starts them anywhere. Raises :class:`DistributedRunError` when a
    launcher exits non-zero or the run takes longer than ``timeout_s``; in
    both cases every process of the run has been ended.
    """
    port = free_port()
    # torchrun's agents keep their logs in a new folder of the temporary folder unless told where:
    # one left behind for every run; here the run's logs go into a folder removed after it.
    with tempfile.TemporaryDirectory(prefix="torchrun-logs-", ignore_cleanup_errors=True) as logs:
        command = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            f"--nnodes={nnodes}",
            f"--nproc-per-node={nproc_per_node}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{port}",
            f"--rdzv-id=course-{port}",
            "--max-restarts=0",
            "--monitor-interval=0.5",
            f"--log-dir={logs}",
            str(script),
            *args,
        ]
        env = _environment()
        return _run(
            [(command, env)] * nnodes,
            lambda _: "a launcher",
            timeout_s,
            cwd,
            warmstart.starter(env),
        )


def start_ranks(
    script: str | Path,
    nproc_per_node: int = 2,
    nnodes: int = 1,
    args: Sequence[str] = (),
    timeout_s: float = 120,
    cwd: str | Path | None = None,
) -> RunResult:
    """Run ``script`` in ``nnodes * nproc_per_node`` processes, each with the variables torchrun
    would give it.

    ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` (the node),
    ``MASTER_ADDR``/``MASTER_PORT`` and the rest of torchrun's set, but no torchrun agent: it
    saves the agent's start (a second and a half on two cores) and its polling, which the
    exercises' checks pay on every run. The run's store (``TCPStore``) is held by this process
    for the whole run, as torchrun's agent holds its own (``TORCHELASTIC_USE_AGENT_STORE``), so
    a rank that ends first cannot take it from the others; every rank's ``init_process_group``
    is a client of it. On Linux each process is forked from a server that has imported torch
    (:mod:`devcourse.warmstart`; it looks to the script like ``python SCRIPT ARGS`` started
    fresh), which saves each process its own import of torch (1.4 s of processor time on two
    cores); elsewhere, or when that server cannot start, each is a new Python process. The ranks
    of several nodes run on this machine. As under torchrun, the first rank to fail ends the
    run: the others are killed and :class:`DistributedRunError` says which rank exited with
    which code, then the end of the run's output; so does a run past ``timeout_s``.
    """
    import torch.distributed  # here: a notebook that never starts ranks does not import it

    world_size = nproc_per_node * nnodes
    # a port the operating system picks; the server closes with the store's last reference
    store = torch.distributed.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=timeout_s)
    )
    port = store.port
    base = _environment(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        TORCHELASTIC_USE_AGENT_STORE="True",
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(nproc_per_node),
        GROUP_WORLD_SIZE=str(nnodes),
        ROLE_WORLD_SIZE=str(world_size),
        ROLE_NAME="default",
        TORCHELASTIC_RUN_ID=f"course-{port}",
        TORCHELASTIC_RESTART_COUNT="0",
        TORCHELASTIC_MAX_RESTARTS="0",
    )
    ranks = []
    for rank in range(world_size):
        node, local = divmod(rank, nproc_per_node)
        ranks.append(
            (
                [sys.executable, str(script), *args],
                dict(
                    base,
                    RANK=str(rank),
                    ROLE_RANK=str(rank),
                    LOCAL_RANK=str(local),
                    GROUP_RANK=str(node),
                ),
            )
        )
    try:
        return _run(
            ranks, lambda rank: f"rank {rank}", timeout_s, cwd, warmstart.starter(_environment())
        )
    finally:
        del store


def _environment(**variables: str) -> dict[str, str]:
    """This process's environment for the processes of a run: output unbuffered, one thread per
    process unless ``OMP_NUM_THREADS`` says otherwise, and ``variables``."""
    return dict(
        os.environ,
        PYTHONUNBUFFERED="1",
        OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"),
        **variables,
    )


def _run(
    processes: list[tuple[list[str], dict]],
    name: Callable[[int], str],
    timeout_s: float,
    cwd: str | Path | None,
    warm: "warmstart.WarmStarter | None" = None,
) -> RunResult:
    """Start each ``(command, env)`` in a session of its own, all writing to one log, and wait for
    them all.

    With ``warm``, each is forked from that server (:mod:`devcourse.warmstart`); should the server
    fail to start one, all of them start the ordinary way instead. The first to exit non-zero ends
    the run: the others have :data:`FAILURE_GRACE_S` to end by themselves (a rank left waiting for
    the one that is gone usually fails at once, and records what it raised), then are killed, and
    :class:`DistributedRunError` says ``name(index)`` exited with which code, then the end of the
    log. A run past ``timeout_s`` is killed the same way. Nothing of a run is left running, however
    it ends.
    """
    import time

    with tempfile.NamedTemporaryFile(mode="w+", prefix="ddp-log-") as log:
        start = time.monotonic()
        failed_at = None
        started: list = []
        try:
            if warm is not None:
                try:
                    for command, env in processes:
                        started.append(warm.start(command, env, cwd, log.name))
                except RuntimeError:
                    _end(started)
                    started = []
            if not started:
                for command, env in processes:
                    started.append(
                        subprocess.Popen(
                            command,
                            stdout=log,
                            stderr=subprocess.STDOUT,
                            cwd=cwd,
                            env=env,
                            start_new_session=True,
                        )
                    )
            while True:
                codes = [process.poll() for process in started]
                failed = next(
                    (index for index, code in enumerate(codes) if code not in (None, 0)), None
                )
                if all(code == 0 for code in codes):
                    break
                if failed is not None:
                    # The others usually fail right after, waiting for a rank that is gone: a moment
                    # for them to end on their own, so that what they raised is recorded too
                    # (rank_errors), then they are killed.
                    if failed_at is None:
                        failed_at, first_failed = time.monotonic(), failed
                    if None not in codes or time.monotonic() - failed_at > FAILURE_GRACE_S:
                        failed = first_failed
                        break
                if time.monotonic() - start > timeout_s:
                    _end(started)
                    log.seek(0)
                    raise DistributedRunError(
                        f"the run did not finish within {timeout_s:g} s and was stopped (all its"
                        f" processes killed); output so far:\n{_tail(log.read())}"
                    )
                time.sleep(0.02)
        finally:
            _end(started)
        log.seek(0)
        output = log.read()
    if failed is not None:
        raise DistributedRunError(
            f"{name(failed)} exited with code {codes[failed]}; output:\n{_tail(output)}"
        )
    return RunResult(0, output, time.monotonic() - start)


FAILURE_GRACE_S = 1.0  # how long the other processes of a failed run have to end by themselves


def _end(launchers: list[subprocess.Popen]) -> None:
    """Kill each launcher's whole process group (the launcher and its ranks)."""
    for launcher in launchers:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(launcher.pid, sig)
            except (ProcessLookupError, PermissionError):
                break
            try:
                launcher.wait(timeout=3)
            except subprocess.TimeoutExpired:
                continue
        try:  # ranks may outlive a launcher that was killed first
            os.killpg(launcher.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def rank_errors(folder: str | Path) -> str:
    """What the ranks of a failed run raised, the first one first with its traceback; "" if none
    raised.

    The first exception is the cause: the other ranks usually fail after it, waiting for a rank that
    is gone. Each rank of :func:`write_script`'s harness records its exception in
    ``rank{RANK}.error``.
    """
    import json

    errors = sorted(
        (json.loads(path.read_text()) for path in Path(folder).glob("rank*.error")),
        key=lambda error: error["time"],
    )
    if not errors:
        return ""
    first, *later = errors
    lines = [f"rank {first['rank']} raised {first['error']}", "", first["traceback"].rstrip()]
    if later:
        lines += [
            "",
            "then " + "; ".join(f"rank {error['rank']} raised {error['error']}" for error in later),
        ]
    return "\n".join(lines) + "\n\nthe run: "


# Runs of run_functions when gloo's ranks could not connect: on a loaded 2-core machine a second run
# failed the same way once in many (a grading's canary stopped on it).
GLOO_RUNS = 3


def _gloo_did_not_connect(errors: str) -> bool:
    """Whether a run failed because gloo's processes could not connect to each other while the
    process group was made: a rare failure of gloo itself on one machine (PyTorch's own tests meet
    it, pytorch#53270), which :func:`run_functions` meets with a second run, not any code of the
    run's own."""
    first = errors.split("\n\nthen ", 1)[0]
    return "Gloo connectFullMesh failed" in first and "init_process_group" in first


def _tail(text: str, lines: int = 40) -> str:
    return "\n".join(text.strip().splitlines()[-lines:])


def run_functions(
    functions: Sequence[Callable],
    main: Callable,
    nproc_per_node: int = 2,
    nnodes: int = 1,
    timeout_s: float = 120,
    simulated_devices: int = 0,
    outdir: str | Path | None = None,
) -> list[object]:
    """Run ``main(outdir)`` on every rank (:func:`start_ranks`); return each rank's result, rank 0
    first.

    ``functions`` are the helpers ``main`` calls (a student's answers, say).
    See :func:`write_script` (``simulated_devices`` included) and
    :func:`start_ranks`. Results are loaded with ``weights_only=True``: return
    tensors, numbers, strings and containers; tensors on a simulated device
    come back on the CPU. ``outdir`` is an existing folder the ranks run in
    and may write to, kept afterwards; by default a temporary folder is used
    and removed. A run whose processes could not connect while making the
    process group (gloo's rare failure, :func:`_gloo_did_not_connect`) runs
    again, after a pause, up to :data:`GLOO_RUNS` runs in all.
    """
    with contextlib.ExitStack() as stack:
        folder = (
            Path(outdir)
            if outdir is not None
            else Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ddp-run-")))
        )
        script = write_script(folder / "run.py", functions, main, folder, simulated_devices)
        for attempt in range(1, GLOO_RUNS + 1):
            try:
                run = start_ranks(
                    script,
                    nproc_per_node=nproc_per_node,
                    nnodes=nnodes,
                    timeout_s=timeout_s,
                    cwd=folder,
                )
                break
            except DistributedRunError as failure:
                errors = rank_errors(folder)
                if attempt < GLOO_RUNS and _gloo_did_not_connect(errors):
                    for stale in folder.glob("rank*.*"):
                        stale.unlink()
                    time.sleep(0.5 * attempt)
                    continue
                raise DistributedRunError(errors + str(failure)) from None
        world_size = nproc_per_node * nnodes
        missing = [r for r in range(world_size) if not (folder / f"rank{r}.pt").exists()]
        if missing:
            raise DistributedRunError(
                f"ranks {missing} returned no result; output:\n{_tail(run.output)}"
            )
        return [
            torch.load(folder / f"rank{r}.pt", map_location="cpu", weights_only=True)
            for r in range(world_size)
        ]
