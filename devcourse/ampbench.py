"""Time and memory of training steps in float32 against mixed precision, one mode per process.

:func:`compare_precision` trains the same seeded MLP on the same data in each mode (:data:`MODES`:
fp32, bf16 autocast, fp16 autocast with GradScaler) in a fresh process, on any machine; on a CPU
mixed precision is often slower than float32, and the numbers say what this machine does, nothing
more. Introduced in 06_mixed_precision.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass

import torch
from torch import nn

from devcourse.devices import best_device
from devcourse.measure import peak_rss_mib, run_child, synchronize
from devcourse import progress

MODES = ("fp32", "bf16", "fp16")


def make_mlp(width: int = 512, depth: int = 4) -> nn.Sequential:
    """``depth`` Linear+ReLU blocks of ``width`` units, then a 10-way head."""
    layers: list[nn.Module] = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers, nn.Linear(width, 10))


@dataclass(frozen=True)
class PrecisionResult:
    mode: str
    device: str
    ms_per_step: float
    peak_mib: float
    last_loss: float


def _train(mode: str, device: torch.device, steps: int, width: int, batch: int) -> dict:
    before = peak_rss_mib()
    torch.manual_seed(0)
    model = make_mlp(width).to(device)
    data = torch.randn(batch, width, device=device)
    target = torch.randint(0, 10, (batch,), device=device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    amp_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mode)
    scaler = torch.amp.GradScaler(device.type, enabled=(mode == "fp16"))

    def step() -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=amp_dtype, enabled=amp_dtype is not None):
            loss = nn.functional.cross_entropy(model(data), target)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss.detach()  # not float(loss): that would wait for the GPU at every step

    for _ in range(3):
        step()
    synchronize(device)  # MPS and XPU run asynchronously too, not only CUDA
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    start = time.perf_counter()
    for _ in range(steps):
        loss = step()
    synchronize(device)
    seconds = time.perf_counter() - start
    peak = (
        torch.cuda.max_memory_allocated(device) / 2**20
        if device.type == "cuda"
        else peak_rss_mib() - before
    )
    return {"ms_per_step": 1000 * seconds / steps, "peak_mib": peak, "last_loss": float(loss)}


def compare_precision(
    device: torch.device | str | None = None,
    steps: int = 20,
    width: int = 512,
    batch: int = 256,
    modes: tuple[str, ...] = MODES,
) -> list[PrecisionResult]:
    """Train in each mode in its own process and return what each measured; a bar shows the modes
    done.

    Each result has milliseconds per step (after warm-up steps, the device synchronised), the peak
    memory (``torch.cuda.max_memory_allocated`` on CUDA; on the CPU how far peak resident memory
    rose from before the model was built) and the last loss. ``device`` defaults to
    :func:`~devcourse.devices.best_device`.
    """
    device = str(torch.device(device) if device is not None else best_device())
    results = []
    for mode in progress.steps(modes, f"training in {', '.join(modes)} on {device}"):
        out = run_child("devcourse.ampbench", [mode, device, str(steps), str(width), str(batch)])
        results.append(
            PrecisionResult(mode, device, out["ms_per_step"], out["peak_mib"], out["last_loss"])
        )
    return results


def format_table(results: list[PrecisionResult]) -> str:
    """One row per mode, with its speed relative to fp32 run in the same call."""
    base = next((r for r in results if r.mode == "fp32"), results[0])
    lines = [
        f"device: {base.device}",
        f"{'mode':6} {'ms/step':>8} {'vs fp32':>8} {'peak MiB':>9} {'last loss':>10}",
    ]
    for r in results:
        lines.append(
            f"{r.mode:6} {r.ms_per_step:8.2f} {base.ms_per_step / r.ms_per_step:7.2f}x "
            f"{r.peak_mib:9.1f} {r.last_loss:10.4f}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m devcourse.ampbench", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--device", default=None, help="default: best_device()")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        mode, device, steps, width, batch = args.child
        if mode not in MODES:
            raise SystemExit(f"mode must be one of {MODES}")
        print(json.dumps(_train(mode, torch.device(device), int(steps), int(width), int(batch))))
        return 0
    print(format_table(compare_precision(args.device, args.steps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
