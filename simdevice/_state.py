"""What every part of the simulated device needs to know: its name, how many devices are on, valid
indices, and each thread's current device."""

from __future__ import annotations

import threading

import torch

NAME = "sim"
# cpu_only_runs: how many simdevice.runs_cpu_only_operators blocks are open
state: dict[str, object] = {"enabled": False, "count": 0, "shown": True, "cpu_only_runs": 0}
_current = threading.local()


def current_index() -> int:
    """This thread's current simulated device (0 until :func:`set_current_index`), as CUDA keeps one
    per thread."""
    return getattr(_current, "index", 0)


def set_current_index(index: int) -> int:
    """Make ``sim:index`` this thread's current device (an index past the count raises); return the
    previous one."""
    previous = current_index()
    _current.index = resolve(index).index
    return previous


def shown() -> bool:
    """Whether ``torch.accelerator`` names the simulated device in the calling thread (see
    ``simdevice.show``).

    A thread's override (``simdevice.shown_as_accelerator``) comes first, then the process's
    setting.
    """
    override = getattr(_current, "shown", None)
    return bool(state["shown"]) if override is None else override


def set_thread_shown(value: bool | None) -> bool | None:
    """Set (None: drop) the calling thread's override of :func:`shown`; return the previous
    override."""
    previous = getattr(_current, "shown", None)
    _current.shown = value
    return previous


def resolve(device: torch.device | str | int | None) -> torch.device:
    """``sim``, ``sim:N``, ``N`` or None as an indexed simulated device; an index past the count
    raises.

    ``sim`` and None name the calling thread's current device, as ``cuda`` does on a GPU machine.
    """
    if device is None:
        index = current_index()
    elif isinstance(device, int):
        index = device
    else:
        device = torch.device(device)
        if device.type != NAME:
            raise ValueError(f"expected a {NAME} device, got {device}")
        index = current_index() if device.index is None else device.index
    count = state["count"]
    if not 0 <= index < count:
        have = (
            "no simulated devices are turned on"
            if count == 0
            else (
                f"{count} simulated device{'s' if count != 1 else ''} turned on "
                f"({', '.join(f'{NAME}:{i}' for i in range(count))})"
            )
        )
        raise RuntimeError(
            f"{NAME.upper()} error: invalid device ordinal: {NAME}:{index} was asked for, but"
            f" {have}"
        )
    return torch.device(NAME, index)
