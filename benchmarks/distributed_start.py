"""What forking the ranks from a warm server saves a check of 07: fresh processes against forked
ones.

    python benchmarks/distributed_start.py [--rounds 5]

Runs the same two-rank check as 07's exercises do (``run_functions``: join
a gloo process group, wrap a ``TinyNet`` in DDP, one training step, return
the weights) in rounds, each round once with every rank a fresh Python
process (``DEVCOURSE_NO_WARMSTART=1``, as on macOS) and once with the ranks
forked from :mod:`devcourse.warmstart`'s server, so both see the same
machine load. Prints the median wall time of a run and the processor time
its ranks used (each rank's own, from its start to its return), the ratios
of the fresh runs' to the forked ones', and the one-off start of the server
(paid by the first run of a notebook's kernel). The results must agree.
Prints the machine, since the numbers are its own. Linux only (elsewhere
nothing is forked).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

from devcourse.instructor.build import machine
from devcourse import warmstart
from devcourse.distributed import _environment, run_functions
from page import WRITE_PAGE_HELP, write_row


def check(outdir):
    import time as _time

    from devcourse.models import TinyNet

    dist.init_process_group("gloo")  # noqa: F821 (the script's prelude imports it)
    torch.manual_seed(0)
    model = DDP(TinyNet())  # noqa: F821
    x = torch.randn(8, 8, generator=torch.Generator().manual_seed(dist.get_rank()))  # noqa: F821
    model(x).pow(2).mean().backward()
    torch.optim.SGD(model.parameters(), lr=0.1).step()
    return {
        "weights": [p.detach() for p in model.module.parameters()],
        "cpu_s": _time.process_time(),
    }


def one_run(fresh: bool) -> tuple[float, float, list]:
    if fresh:
        os.environ["DEVCOURSE_NO_WARMSTART"] = "1"
    try:
        start = time.perf_counter()
        results = run_functions([], check, timeout_s=120)
        return (
            time.perf_counter() - start,
            sum(r["cpu_s"] for r in results),
            [r["weights"] for r in results],
        )
    finally:
        os.environ.pop("DEVCOURSE_NO_WARMSTART", None)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--write-page", action="store_true", help=WRITE_PAGE_HELP)
    args = parser.parse_args(argv)
    if sys.platform != "linux":
        print("nothing is forked on", sys.platform, "- nothing to compare")
        return 0
    print(f"machine: {machine()}, torch {torch.__version__}")
    start = time.perf_counter()
    assert warmstart.starter(_environment()) is not None, "the server could not start"
    server_s = time.perf_counter() - start
    seen = {"fresh": [], "forked": []}
    weights = []
    for _ in range(args.rounds):
        for way in seen:
            wall, cpu, result = one_run(way == "fresh")
            seen[way].append((wall, cpu))
            weights.append(result)
    same = all(
        torch.equal(a, b)
        for run in weights
        for ranks in zip(run, weights[0])
        for a, b in zip(*ranks)
    )
    print(f"the server's start (once per kernel): {server_s:.2f} s")
    print(
        f"{'ranks':8} {'run (s)':>8} {'ranks CPU (s)':>14}   medians of {args.rounds} runs of 2"
        " ranks"
    )
    median = {
        way: [statistics.median(v[i] for v in runs) for i in (0, 1)] for way, runs in seen.items()
    }
    for way, (wall, cpu) in median.items():
        print(f"{way:8} {wall:8.2f} {cpu:14.2f}")
    result = (
        f"fresh / forked: {median['fresh'][0] / median['forked'][0]:.1f}x the wall time,"
        f" {median['fresh'][1] / median['forked'][1]:.1f}x the ranks' processor time; same weights:"
        f" {same}"
    )
    print(result)
    if args.write_page:
        write_row(__file__, result)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
