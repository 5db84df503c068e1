"""Measure how loading a checkpoint costs time and memory, one strategy per process.

Each strategy loads the same file into a fresh Python process and reports
its wall time and how far its peak resident memory rose above what the
process held before loading (after importing torch). A fresh process per
strategy keeps one strategy's memory from hiding another's.

Strategies:

* ``plain``: build the model, ``torch.load`` the file, ``load_state_dict``.
* ``mmap``: the same with ``torch.load(mmap=True)``.
* ``meta_assign``: build the model on ``meta`` (no memory), ``torch.load``
  with ``mmap=True``, ``load_state_dict(assign=True)``.
* ``devcourse``: the course's loader, :func:`devcourse.checkpoints.load_model`.

After loading, every strategy reads every weight once (a checksum), as any
real use would, so memory-mapped pages are counted too. Runs on any machine;
everything stays on the CPU.

Introduced in 04_map_location; ``benchmarks/checkpoint_loading.py`` runs it at 1 GB.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from devcourse.measure import peak_rss_mib, run_child

STRATEGIES = ("plain", "mmap", "meta_assign", "devcourse")
WIDTH = 1024  # one 1024 x 1024 float32 layer is 4 MiB


class WideNet(nn.Sequential):
    """``layers`` square Linear layers of width 1024 without bias: 4 MiB of float32 each."""

    def __init__(self, layers: int = 16):
        super().__init__(*(nn.Linear(WIDTH, WIDTH, bias=False) for _ in range(layers)))


def layers_for(size_mib: int) -> int:
    """How many WideNet layers make a checkpoint of about ``size_mib`` MiB (at least 1)."""
    return max(1, round(size_mib / 4))


def write_checkpoint(path: Path, size_mib: int) -> int:
    """Save a WideNet state dict of about ``size_mib`` MiB; return its size in bytes."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = WideNet(layers_for(size_mib))
    torch.save(model.state_dict(), path)
    return path.stat().st_size


@dataclass(frozen=True)
class Measurement:
    strategy: str
    seconds: float
    extra_peak_mib: float  # peak resident memory above the process's level before loading
    checkpoint_mib: float

    @property
    def ratio(self) -> float:
        """Extra peak memory as a multiple of the checkpoint's size."""
        return self.extra_peak_mib / self.checkpoint_mib


def _load(strategy: str, path: Path, layers: int) -> nn.Module:
    if strategy == "plain":
        model = WideNet(layers)
        model.load_state_dict(torch.load(path, weights_only=True))
    elif strategy == "mmap":
        model = WideNet(layers)
        model.load_state_dict(torch.load(path, weights_only=True, mmap=True))
    elif strategy == "meta_assign":
        with torch.device("meta"):
            model = WideNet(layers)
        model.load_state_dict(torch.load(path, weights_only=True, mmap=True), assign=True)
    elif strategy == "devcourse":
        from devcourse.checkpoints import load_model

        model = load_model(path, lambda: WideNet(layers), device="cpu")
    else:
        raise ValueError(f"strategy must be one of {STRATEGIES}, not {strategy!r}")
    return model


def _child(strategy: str, path: Path, layers: int) -> dict:
    before = peak_rss_mib()
    start = time.perf_counter()
    model = _load(strategy, path, layers)
    checksum = sum(float(p.detach().sum()) for p in model.parameters())  # touch every weight
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "extra_peak_mib": peak_rss_mib() - before, "checksum": checksum}


def measure(strategy: str, path: Path, layers: int, timeout_s: float = 600) -> Measurement:
    """Run one strategy in a fresh process and return what it measured."""
    result = run_child("devcourse.loadbench", [strategy, str(path), str(layers)], timeout_s)
    return Measurement(strategy, result["seconds"], result["extra_peak_mib"], path.stat().st_size / 2**20)


def compare_loading(size_mib: int = 64, strategies: tuple[str, ...] = STRATEGIES) -> list[Measurement]:
    """Write a checkpoint of about ``size_mib`` MiB and measure each strategy on it."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "wide.pt"
        write_checkpoint(path, size_mib)
        return [measure(s, path, layers_for(size_mib)) for s in strategies]


def format_table(measurements: list[Measurement]) -> str:
    """One row per strategy: wall time, extra peak memory, and that memory over the checkpoint size."""
    size = measurements[0].checkpoint_mib if measurements else 0.0
    lines = [f"checkpoint: {size:.0f} MiB", f"{'strategy':12} {'seconds':>8} {'peak MiB':>9} {'x size':>7}"]
    lines += [f"{m.strategy:12} {m.seconds:8.2f} {m.extra_peak_mib:9.0f} {m.ratio:7.2f}" for m in measurements]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devcourse.loadbench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=64, help="checkpoint size (default 64)")
    parser.add_argument("--child", nargs=3, metavar=("STRATEGY", "PATH", "LAYERS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        strategy, path, layers = args.child
        print(json.dumps(_child(strategy, Path(path), int(layers))))
        return 0
    print(format_table(compare_loading(args.size_mib)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
