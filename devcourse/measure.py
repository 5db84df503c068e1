"""Measure in a fresh process: peak memory, waiting for a device, and a JSON result back to the
caller.

Shared by the course's benchmarks (:mod:`devcourse.loadbench`,
:mod:`devcourse.ampbench`). Works on any machine; on Linux the peak is read
from ``/proc``, elsewhere from ``getrusage``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Sequence

import torch


def proc_status_mib(field: str) -> float | None:
    """A memory field of ``/proc/self/status`` (``VmRSS``, ``VmHWM``, ``RssAnon`` ...) in MiB;
    ``None`` without ``/proc``."""
    status = Path("/proc/self/status")
    if not status.exists():
        return None
    for line in status.read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 2**10  # kB
    return None


def peak_rss_mib() -> float:
    """This process's peak resident memory so far, in MiB.

    On Linux it reads ``VmHWM``, which starts afresh when a program starts;
    ``getrusage``'s ``ru_maxrss`` would carry over the peak of the parent
    that started this process.
    """
    peak = proc_status_mib("VmHWM")
    if peak is not None:
        return peak
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # bytes on macOS, KiB elsewhere
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def anon_rss_mib() -> float | None:
    """This process's resident *anonymous* memory now, in MiB; ``None`` where ``/proc`` is missing.

    ``RssAnon`` in ``/proc/self/status``: the memory the process holds that
    no file backs (its heap, tensors it allocated). Pages of a memory-mapped
    file (``torch.load(mmap=True)``) are counted in ``VmRSS`` and so in
    :func:`peak_rss_mib`, but not here: the kernel can drop them under
    pressure and read them again from the file.
    """
    return proc_status_mib("RssAnon")


class AnonPeak:
    """The peak of :func:`anon_rss_mib` over a ``with`` block, sampled every ``interval_s`` by a
    thread.

    ``peak`` is ``None`` where ``/proc`` is missing (macOS, Windows). The
    kernel keeps no peak of anonymous memory, so a short spike between two
    samples can be missed; every sample and the block's end are counted.
    """

    def __init__(self, interval_s: float = 0.0005):
        self.interval_s = interval_s
        self.peak: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _take(self) -> None:
        value = anon_rss_mib()
        if value is not None and (self.peak is None or value > self.peak):
            self.peak = value

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._take()

    def __enter__(self) -> "AnonPeak":
        self._take()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._take()


def synchronize(device: torch.device | str) -> None:
    """Wait until ``device`` has run every operator launched on it so far (then a clock read means
    something).

    CUDA, XPU and MPS run operators asynchronously; this waits through
    ``torch.accelerator.synchronize`` when the device is of the current
    accelerator's type, else through the device type's own module
    (``torch.cuda.synchronize`` on a CUDA machine where the simulated device
    was turned on). On the CPU and on ``meta`` there is nothing to wait for: it
    returns at once. On the simulated device it returns at once, or waits for
    the work of :func:`simdevice.asynchronous` while that is on.

    Introduced in 06_mixed_precision.
    """
    device = torch.device(device)
    if device.type in ("cpu", "meta"):
        return
    current = torch.accelerator.current_accelerator()
    if current is not None and current.type == device.type:
        torch.accelerator.synchronize(device)
    else:
        torch.get_device_module(device.type).synchronize(device)


def run_child(module: str, args: Sequence[str], timeout_s: float = 600) -> dict:
    """Run ``python -m module --child *args`` and return the JSON object it printed last.

    Raises ``RuntimeError`` with the end of its error output when it fails.
    """
    done = subprocess.run(
        [sys.executable, "-m", module, "--child", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{' '.join(args[:1])} failed (exit {done.returncode}):\n{done.stderr[-2000:]}"
        )
    return json.loads(done.stdout.strip().splitlines()[-1])
