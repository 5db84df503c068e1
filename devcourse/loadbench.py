"""Measure how loading a checkpoint costs time and memory, one strategy per process.

Each strategy (:data:`STRATEGIES`) loads the same file in a fresh Python process (:func:`measure`),
so one's memory cannot hide another's, and reports its wall time and how far resident and anonymous
memory rose. Runs on any machine, everything on the CPU. Introduced in 04_map_location;
``benchmarks/checkpoint_loading.py`` runs it.
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

from devcourse import progress
from devcourse.measure import AnonPeak, anon_rss_mib, peak_rss_mib, run_child

# plain: build the model, torch.load, load_state_dict; mmap: the same with torch.load(mmap=True);
# meta_assign: build on meta, torch.load(mmap=True), load_state_dict(assign=True); devcourse:
# devcourse.loading.load_model.
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
    device: str = "cpu"
    gpu_peak_mib: float | None = None  # torch.cuda.max_memory_allocated, when loading onto a GPU
    # peak anonymous memory above the level before loading (Linux)
    extra_anon_mib: float | None = None

    @property
    def ratio(self) -> float:
        """Extra peak memory as a multiple of the checkpoint's size."""
        return self.extra_peak_mib / self.checkpoint_mib

    @property
    def anon_ratio(self) -> float | None:
        """Extra peak anonymous memory as a multiple of the checkpoint's size (``None`` without
        ``/proc``)."""
        return None if self.extra_anon_mib is None else self.extra_anon_mib / self.checkpoint_mib


def _load(strategy: str, path: Path, layers: int, device: torch.device) -> nn.Module:
    if strategy == "plain":
        model = WideNet(layers).to(device)
        model.load_state_dict(torch.load(path, weights_only=True, map_location=device))
    elif strategy == "mmap":
        model = WideNet(layers).to(device)
        model.load_state_dict(torch.load(path, weights_only=True, mmap=True, map_location=device))
    elif strategy == "meta_assign":
        with torch.device("meta"):
            model = WideNet(layers)
        model.load_state_dict(torch.load(path, weights_only=True, mmap=True), assign=True)
        model.to(device)
    elif strategy == "devcourse":
        from devcourse.loading import load_model

        model = load_model(path, lambda: WideNet(layers), device=device)
    else:
        raise ValueError(f"strategy must be one of {STRATEGIES}, not {strategy!r}")
    return model


def _child(strategy: str, path: Path, layers: int, device: torch.device) -> dict:
    on_gpu = device.type == "cuda"
    if on_gpu:
        torch.cuda.init()
        torch.cuda.reset_peak_memory_stats(device)
    before, anon_before = peak_rss_mib(), anon_rss_mib()
    start = time.perf_counter()
    with AnonPeak() as anon:
        model = _load(strategy, path, layers, device)
        checksum = sum(float(p.detach().sum()) for p in model.parameters())  # touch every weight
    seconds = time.perf_counter() - start
    gpu_peak = torch.cuda.max_memory_allocated(device) / 2**20 if on_gpu else None
    extra_anon = None if anon.peak is None else anon.peak - anon_before
    return {
        "seconds": seconds,
        "extra_peak_mib": peak_rss_mib() - before,
        "extra_anon_mib": extra_anon,
        "gpu_peak_mib": gpu_peak,
        "checksum": checksum,
    }


def measure(
    strategy: str, path: Path, layers: int, device: str = "cpu", timeout_s: float = 600
) -> Measurement:
    """Run one strategy in a fresh process, loading onto ``device``, and return what it measured.

    The peaks are above what the process held after importing torch: resident memory (``VmHWM``),
    which counts the pages of a memory-mapped file too, and anonymous memory (``RssAnon``, sampled),
    which does not; mapped pages can be dropped and read again, so the anonymous peak is what a
    strategy really needs. Every strategy reads each weight once after loading (a checksum), so
    mapped pages are counted.
    """
    result = run_child(
        "devcourse.loadbench", [strategy, str(path), str(layers), str(device)], timeout_s
    )
    return Measurement(
        strategy,
        result["seconds"],
        result["extra_peak_mib"],
        path.stat().st_size / 2**20,
        str(device),
        result["gpu_peak_mib"],
        result["extra_anon_mib"],
    )


def compare_loading(
    size_mib: int = 64, strategies: tuple[str, ...] = STRATEGIES, device: str = "cpu"
) -> list[Measurement]:
    """Write a checkpoint of about ``size_mib`` MiB and measure each strategy loading it onto
    ``device``.

    Each strategy loads in a process of its own; a bar shows the strategies done.
    """
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "wide.pt"
        write_checkpoint(path, size_mib)
        return [
            measure(s, path, layers_for(size_mib), device)
            for s in progress.steps(strategies, f"loading {size_mib} MiB {len(strategies)} ways")
        ]


def format_table(measurements: list[Measurement]) -> str:
    """One row per strategy: wall time, extra peak memory and extra peak anonymous memory, each also
    over the checkpoint size.

    The anonymous columns are left out where it was not measured (no ``/proc``). When the loads
    went onto a GPU, a last column gives the GPU's peak allocated memory.
    """
    size = measurements[0].checkpoint_mib if measurements else 0.0
    gpu = any(m.gpu_peak_mib is not None for m in measurements)
    anon = any(m.extra_anon_mib is not None for m in measurements)
    where = f", loaded onto {measurements[0].device}" if gpu else ""
    header = (
        f"{'strategy':12} {'seconds':>8} {'peak MiB':>9} {'x size':>7}"
        + (f" {'anon MiB':>9} {'x size':>7}" if anon else "")
        + (f" {'GPU MiB':>8}" if gpu else "")
    )
    lines = [f"checkpoint: {size:.0f} MiB{where}", header]
    for m in measurements:
        row = f"{m.strategy:12} {m.seconds:8.2f} {m.extra_peak_mib:9.0f} {m.ratio:7.2f}"
        if anon:
            row += f" {m.extra_anon_mib or 0:9.0f} {m.anon_ratio or 0:7.2f}"
        lines.append(row + (f" {m.gpu_peak_mib or 0:8.0f}" if gpu else ""))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devcourse.loadbench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--size-mib", type=int, default=64, help="checkpoint size (default 64)")
    parser.add_argument("--device", default="cpu", help="where to load to (default cpu)")
    parser.add_argument(
        "--child", nargs=4, metavar=("STRATEGY", "PATH", "LAYERS", "DEVICE"), help=argparse.SUPPRESS
    )
    args = parser.parse_args(argv)
    if args.child:
        strategy, path, layers, device = args.child
        print(json.dumps(_child(strategy, Path(path), int(layers), torch.device(device))))
        return 0
    print(format_table(compare_loading(args.size_mib, device=args.device)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
