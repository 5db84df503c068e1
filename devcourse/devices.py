"""Which device a lesson runs on.

Notebooks never write a bare ``"cuda"``: they ask :func:`best_device`, so the
same cell runs on a laptop, a CUDA box and CI.
"""

from __future__ import annotations

import torch


def best_device() -> torch.device:
    """Return the fastest device this machine has.

    ``cuda:0`` when CUDA is available, else ``mps`` on Apple silicon, else
    ``cpu``. On a CPU-only machine it returns ``torch.device('cpu')``; it never
    returns a device that cannot hold a tensor here.

    Introduced in 00_environment.
    """
    if torch.cuda.is_available():
        return torch.device("cuda", 0)
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")
