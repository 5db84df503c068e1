"""Where the device-semantics probes register (``probes_tensors.py``, ``probes_runtime.py``): one
table, in the order the modules define them, which ``device_probes.py`` runs."""

from __future__ import annotations

import torch

PROBES = {}


def probe(two: bool = False):
    """Register a probe; ``two``: it needs a second device (skipped on a machine with one)."""

    def add(fn):
        fn.needs_two = two
        PROBES[fn.__name__] = fn
        return fn

    return add


def where(t: torch.Tensor) -> str:
    return str(t.device)
