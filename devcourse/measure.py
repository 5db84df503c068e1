"""Measure in a fresh process: peak memory, and a JSON result back to the caller.

Shared by the course's benchmarks (:mod:`devcourse.loadbench`,
:mod:`devcourse.ampbench`). Works on any machine; on Linux the peak is read
from ``/proc``, elsewhere from ``getrusage``.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Sequence


def peak_rss_mib() -> float:
    """This process's peak resident memory so far, in MiB.

    On Linux it reads ``VmHWM``, which starts afresh when a program starts;
    ``getrusage``'s ``ru_maxrss`` would carry over the peak of the parent
    that started this process.
    """
    status = Path("/proc/self/status")
    if status.exists():
        for line in status.read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 2**10  # kB
    import resource

    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10  # bytes on macOS, KiB elsewhere


def run_child(module: str, args: Sequence[str], timeout_s: float = 600) -> dict:
    """Run ``python -m module --child *args`` and return the JSON object it printed last.

    Raises ``RuntimeError`` with the end of its error output when it fails.
    """
    done = subprocess.run([sys.executable, "-m", module, "--child", *args], capture_output=True, text=True, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(args[:1])} failed (exit {done.returncode}):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])
