"""``python -m autograder worker ADDRESS [--gpu K]``: this process becomes a Dask worker for the
grader."""

from __future__ import annotations

import argparse
import os
import sys

from autograder.run import bytecode


def main(argv: list[str] | None = None) -> int:
    worker = argparse.ArgumentParser(
        prog="python -m autograder worker",
        description=(
            "Start a Dask worker for the grader (one job at a time); this process becomes it."
        ),
    )
    worker.add_argument("address", help="the scheduler, tcp://HOST:PORT")
    worker.add_argument(
        "--gpu",
        type=int,
        metavar="K",
        help="this worker's GPU: CUDA_VISIBLE_DEVICES=K, resource GPU=1",
    )
    worker.add_argument("--nthreads", type=int, default=1, help="jobs at a time (default 1)")
    worker.add_argument("--name", help="the worker's name (default: Dask's)")
    worker.add_argument(
        "--no-nanny",
        action="store_true",
        help="no nanny process that restarts the worker when it dies",
    )
    args = worker.parse_args(argv)
    env = dict(os.environ)
    command = [
        sys.executable,
        "-m",
        "distributed.cli.dask_worker",
        args.address,
        "--nthreads",
        str(args.nthreads),
        "--nworkers",
        "1",
        "--no-dashboard",
    ] + (["--no-nanny"] if args.no_nanny else [])
    name = args.name
    if args.gpu is not None:
        # the runners it starts see this one GPU, as cuda:0
        env["CUDA_VISIBLE_DEVICES"] = str(args.gpu)
        command += ["--resources", "GPU=1"]
        name = name or f"gpu{args.gpu}-{os.uname().nodename}"
    if name:
        command += ["--name", name]
    # this machine's kernels would compile them every time
    for line in bytecode.advice(bytecode.uncompiled()):
        print(f"worker: {line.strip()}", file=sys.stderr)
    sys.stdout.flush()
    sys.stderr.flush()
    # the worker is this process: signals and a kill reach it
    os.execve(sys.executable, command, env)
