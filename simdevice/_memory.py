"""Memory counters and an optional budget per simulated device.

The counters count each CPU storage of a simulated tensor once per device, from when a tensor on the
device first holds it until PyTorch frees it, like ``torch.cuda.memory_allocated`` without the
caching allocator's rounding. With a budget set, a storage that would take a device past it raises
``torch.OutOfMemoryError``, worded like CUDA's.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch

from simdevice._state import NAME, resolve


@dataclass
class _Device:
    allocated: int = 0
    peak: int = 0
    budget: int | None = None
    storages: dict[int, int] = field(default_factory=dict)  # data_ptr -> nbytes


_devices: dict[int, _Device] = {}


def reset(count: int) -> None:
    """Forget every counter and budget and track ``count`` devices."""
    _devices.clear()
    _devices.update({index: _Device() for index in range(count)})


def _fmt(nbytes: int) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= size:
            return f"{nbytes / size:.2f} {unit}"
    return f"{nbytes} bytes"


def hold(index: int, storage: torch.UntypedStorage) -> None:
    """Count ``storage`` on device ``index`` until PyTorch frees it.

    A storage is counted once, however many tensors (views) hold it: PyTorch
    keeps one Python object per storage alive as long as the storage, so a
    finalizer on that object runs when the last tensor holding it is freed.
    """
    device = _devices[index]
    key = storage.data_ptr()
    if key in device.storages:
        return
    nbytes = storage.nbytes()
    _check_new(index, nbytes)
    device.storages[key] = nbytes
    device.allocated += nbytes
    if device.allocated > device.peak:
        device.peak = device.allocated
    weakref.finalize(storage, _release, device, key)


def _release(device: _Device, key: int) -> None:
    nbytes = device.storages.pop(key, None)
    if nbytes is not None:  # None: the counters were reset since
        device.allocated -= nbytes


def _check_new(index: int, nbytes: int) -> None:
    """Raise ``torch.OutOfMemoryError`` if ``nbytes`` more would pass the budget."""
    device = _devices[index]
    if device.budget is not None and device.allocated + nbytes > device.budget:
        free = max(device.budget - device.allocated, 0)
        raise torch.OutOfMemoryError(
            f"{NAME.upper()} out of memory. Tried to allocate {_fmt(nbytes)}. "
            f"{NAME}:{index} has a total capacity of {_fmt(device.budget)} of which "
            f"{_fmt(free)} is free. Of the allocated memory {_fmt(device.allocated)} is "
            f"allocated by tensors on {NAME}:{index}."
        )


def of(device: torch.device | str | int | None) -> _Device:
    """The counters of a simulated device (``sim``, ``sim:N``, ``N``; None is ``sim:0``)."""
    return _devices[resolve(device).index]
