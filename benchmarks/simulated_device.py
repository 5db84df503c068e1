"""The simulated device's cost: turning it on, and a training step on sim:0 against the CPU.

    python benchmarks/simulated_device.py [--batch 64] [--steps 200]

Measures, in one run on this machine:

* registration: the time ``devcourse.simdevice.enable()`` takes in a fresh
  process that has already imported torch (target under 1 s);
* a training step of a small MLP (784-128-64-10, SGD, cross-entropy), the
  same data and seed on ``cpu`` and on ``sim:0``, interleaved in rounds so
  that both see the same machine load; the median step of each and their
  ratio (target at most 3x); the losses must be equal.

Exits 1 if a target is missed. Prints the machine, since the numbers are its own.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import time

import torch
import torch.nn.functional as F

import devcourse.simdevice as simdevice

REGISTRATION_TARGET_S = 1.0
STEP_TARGET_RATIO = 3.0

_REGISTER = """
import time, torch, devcourse.simdevice as s
t = time.perf_counter(); s.enable(2); print(time.perf_counter() - t)
"""


def registration_seconds(repeats: int = 3) -> float:
    """The fastest of ``repeats`` fresh processes' ``enable(2)`` time, torch already imported."""
    times = []
    for _ in range(repeats):
        done = subprocess.run([sys.executable, "-c", _REGISTER], capture_output=True, text=True, check=True)
        times.append(float(done.stdout.split()[-1]))
    return min(times)


def _setup(device: str, batch: int):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64),
                                torch.nn.ReLU(), torch.nn.Linear(64, 10)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 784, generator=g).to(device)
    y = torch.randint(0, 10, (batch,), generator=g).to(device)

    def step() -> torch.Tensor:
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss

    return step


def step_times(batch: int, steps: int, rounds: int = 5) -> dict[str, list[float]]:
    """Per-step seconds on cpu and sim:0, interleaved in ``rounds``; checks the losses agree."""
    runs = {device: _setup(device, batch) for device in ("cpu", "sim:0")}
    times: dict[str, list[float]] = {device: [] for device in runs}
    losses: dict[str, list[float]] = {device: [] for device in runs}
    for _ in range(rounds):
        for device, step in runs.items():
            for _ in range(steps // rounds):
                start = time.perf_counter()
                loss = step()
                times[device].append(time.perf_counter() - start)
                losses[device].append(loss.item())  # outside the timed part
    if losses["cpu"] != losses["sim:0"]:
        raise AssertionError("the losses on sim:0 differ from the CPU's")
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.system()}; torch {torch.__version__}")
    registration = registration_seconds()
    simdevice.enable(2)
    times = step_times(args.batch, args.steps)
    cpu, sim = statistics.median(times["cpu"]), statistics.median(times["sim:0"])
    ratio = sim / cpu
    print(f"registration (enable(2), torch imported): {registration * 1000:.1f} ms (target under "
          f"{REGISTRATION_TARGET_S:.0f} s)")
    print(f"MLP 784-128-64-10, batch {args.batch}, SGD, {args.steps} steps each, same losses: "
          f"cpu {cpu * 1e3:.2f} ms/step, sim:0 {sim * 1e3:.2f} ms/step")
    print(f"sim:0 / cpu: {ratio:.2f}x (target at most {STEP_TARGET_RATIO:.0f}x)")
    return 0 if registration < REGISTRATION_TARGET_S and ratio <= STEP_TARGET_RATIO else 1


if __name__ == "__main__":
    sys.exit(main())
