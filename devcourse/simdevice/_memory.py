"""Memory counters and an optional budget per simulated device.

Every simulated tensor keeps its values in a CPU storage. The counters count
each such storage once per device, from the moment a tensor on the device
first holds it until the last tensor on the device that holds it is freed,
like ``torch.cuda.memory_allocated`` (without the caching allocator's
rounding). With a budget set, a new storage that would take a device past
its budget raises ``torch.OutOfMemoryError``, worded like CUDA's.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch


@dataclass
class _Device:
    allocated: int = 0
    peak: int = 0
    budget: int | None = None
    storages: dict[int, list[int]] = field(default_factory=dict)  # data_ptr -> [nbytes, holders]


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


def hold(holder: object, index: int, storage: torch.UntypedStorage, backend: str) -> None:
    """Count ``storage`` on device ``index`` while ``holder`` (a tensor) lives."""
    device = _devices[index]
    key = storage.data_ptr()
    entry = device.storages.get(key)
    if entry is None:
        nbytes = storage.nbytes()
        check_new(index, nbytes, backend)
        entry = device.storages[key] = [nbytes, 0]
        device.allocated += nbytes
        device.peak = max(device.peak, device.allocated)
    entry[1] += 1
    weakref.finalize(holder, _release, device, key)


def _release(device: _Device, key: int) -> None:
    entry = device.storages.get(key)
    if entry is None:  # counters were reset since
        return
    entry[1] -= 1
    if entry[1] == 0:
        del device.storages[key]
        device.allocated -= entry[0]


def check_new(index: int, nbytes: int, backend: str) -> None:
    """Raise ``torch.OutOfMemoryError`` if ``nbytes`` more would pass the budget."""
    device = _devices[index]
    if device.budget is not None and device.allocated + nbytes > device.budget:
        free = max(device.budget - device.allocated, 0)
        raise torch.OutOfMemoryError(
            f"{backend.upper()} out of memory. Tried to allocate {_fmt(nbytes)}. "
            f"{backend}:{index} has a total capacity of {_fmt(device.budget)} of which "
            f"{_fmt(free)} is free. Of the allocated memory {_fmt(device.allocated)} is "
            f"allocated by tensors on {backend}:{index}."
        )


def device(index: int) -> _Device:
    return _devices[index]
