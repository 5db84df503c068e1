"""``torch.accelerator``'s device-wide calls, answered for the simulated device.

A Python PrivateUse1 backend has no device allocator and no way to synchronize, so
``torch.accelerator.synchronize()`` and the memory functions would raise where the same code runs on
CUDA. :func:`install` (from :func:`simdevice.enable`) puts wrappers in their place that answer while
the simulated device is the current accelerator, and call PyTorch's own functions otherwise.
"""

from __future__ import annotations

import os
from collections import OrderedDict

import torch
import torch.accelerator
import torch.accelerator.memory

from simdevice import _clock, _memory, _state, _streams
from simdevice._state import NAME

_originals: dict[str, object] = {}


def _registered() -> bool:
    """Whether PyTorch's own choice of accelerator is the simulated device (it is, once the device
    is on)."""
    current = torch._C._accelerator_getAccelerator()
    return current is not None and current.type == NAME


def _on_sim() -> bool:
    """Whether ``torch.accelerator`` answers for the simulated device in this thread: on, and
    shown."""
    return _registered() and _state.shown()


def _hidden() -> bool:
    """Whether the simulated device is on but hidden in this thread: ``torch.accelerator`` answers
    as without it."""
    return _registered() and not _state.shown()


# The accelerators a build of PyTorch can have besides an out-of-tree one, in the order PyTorch's
# ``at::getAccelerator`` (aten/src/ATen/DeviceAccelerator.cpp) checks them, each with "built in" and
# "available".
_MACHINE = (
    ("cuda", lambda: torch.backends.cuda.is_built(), lambda: torch.cuda.is_available()),
    ("xpu", lambda: torch.xpu._is_compiled(), lambda: torch.xpu.is_available()),
    ("mps", lambda: torch.backends.mps.is_built(), lambda: torch.backends.mps.is_available()),
)
# PyTorch's own words, CPU-only
_NONE_AVAILABLE = "Cannot access accelerator device when none is available."


def machine_accelerator(check_available: bool = False) -> torch.device | None:
    """The accelerator PyTorch would name without the simulated device: the build's (CUDA, XPU,
    MPS), or None."""
    for name, built, available in _MACHINE:
        if built():
            return None if check_available and not available() else torch.device(name)
    return None


def _refuse_when_hidden() -> None:
    """Raise what PyTorch raises on a machine without an accelerator, where the simulated device is
    hidden and the machine has none (a machine with one: PyTorch's own functions answer)."""
    if _hidden() and machine_accelerator() is None:
        raise RuntimeError(_NONE_AVAILABLE)


def current_accelerator(check_available: bool = False) -> torch.device | None:
    if _hidden():
        return machine_accelerator(check_available)
    return _originals["current_accelerator"](check_available)


def _device(device_index) -> torch.device:
    """The simulated device that a torch.accelerator ``device_index`` argument names (None: the
    current one)."""
    if device_index is None:
        return torch.device(NAME, torch.accelerator.current_device_index())
    if isinstance(device_index, int):
        return torch.device(NAME, device_index)
    device = torch.device(device_index)
    if device.type != NAME:
        raise ValueError(f"{device} is not the current accelerator, {NAME}")
    return torch.device(
        NAME, device.index if device.index is not None else torch.accelerator.current_device_index()
    )


def synchronize(device=None, /) -> None:
    _refuse_when_hidden()
    if not _on_sim():
        return _originals["synchronize"](device)
    index = _device(device).index
    _memory.of(index)  # an index the device lacks raises, as on CUDA
    _clock.wait(index)
    return None


def memory_stats(device_index=None, /) -> OrderedDict:
    _refuse_when_hidden()
    if not _on_sim():
        return _originals["memory_stats"](device_index)
    counters = _memory.of(_device(device_index))
    return OrderedDict(
        [
            ("allocated_bytes.all.current", counters.allocated),
            ("allocated_bytes.all.peak", counters.peak),
            ("reserved_bytes.all.current", counters.allocated),
            ("reserved_bytes.all.peak", counters.peak),
        ]
    )


def reset_peak_memory_stats(device_index=None, /) -> None:
    _refuse_when_hidden()
    if not _on_sim():
        return _originals["reset_peak_memory_stats"](device_index)
    counters = _memory.of(_device(device_index))
    counters.peak = counters.allocated
    return None


def reset_accumulated_memory_stats(device_index=None, /) -> None:
    _refuse_when_hidden()
    if not _on_sim():
        return _originals["reset_accumulated_memory_stats"](device_index)
    _memory.of(_device(device_index))
    return None


def empty_cache() -> None:
    _refuse_when_hidden()
    if not _on_sim():
        return _originals["empty_cache"]()
    return None


def get_memory_info(device_index=None, /) -> tuple[int, int]:
    _refuse_when_hidden()
    if not _on_sim():
        return _originals["get_memory_info"](device_index)
    counters = _memory.of(_device(device_index))
    if counters.budget is not None:
        return max(0, counters.budget - counters.allocated), counters.budget
    page = os.sysconf("SC_PAGE_SIZE")
    return os.sysconf("SC_AVPHYS_PAGES") * page, os.sysconf("SC_PHYS_PAGES") * page


def current_stream(device=None, /) -> torch.Stream:
    _refuse_when_hidden()
    if not _on_sim():
        return _originals["current_stream"](device)
    index = _device(device).index
    _memory.of(index)  # an index the device lacks raises, as on CUDA
    return _streams.current_stream(index)


def set_stream(stream, /) -> None:
    _refuse_when_hidden()
    if not _on_sim() or stream.device.type != NAME:
        return _originals["set_stream"](stream)
    _streams.set_stream(stream)
    return None


def current_device_index() -> int:
    _refuse_when_hidden()
    if not _on_sim():
        return _originals["current_device_index"]()
    return _state.current_index()


def set_device_index(device, /) -> None:
    _refuse_when_hidden()
    if not _on_sim() or device is None:
        # None raises there, as it does on every accelerator
        return _originals["set_device_index"](device)
    if isinstance(device, int) and device < 0:
        return None  # PyTorch's documented no-op
    _state.set_current_index(_device(device).index)
    return None


class device_index(torch.accelerator.device_index):
    """``torch.accelerator.device_index``: on the simulated device it changes this thread's current
    device."""

    def __enter__(self) -> None:
        if self.idx is not None:
            _refuse_when_hidden()
        if not _on_sim():
            return super().__enter__()
        if self.idx is not None:
            self.prev_idx = _state.set_current_index(self.idx)

    def __exit__(self, *exc_info: object) -> None:
        if not _on_sim():
            return super().__exit__(*exc_info)
        if self.idx is not None and self.prev_idx >= 0:
            _state.set_current_index(self.prev_idx)


def get_device_module(device=None):
    """``torch.get_device_module``: with no device, the module of the accelerator
    ``torch.accelerator`` names."""
    if device is None and _hidden():
        machine = machine_accelerator()
        return _originals["get_device_module"](machine.type if machine is not None else "cpu")
    return _originals["get_device_module"](device)


_WRAPPERS = {
    "current_accelerator": current_accelerator,
    "current_device_index": current_device_index,
    "set_device_index": set_device_index,
    "device_index": device_index,
    "synchronize": synchronize,
    "current_stream": current_stream,
    "set_stream": set_stream,
    "memory_stats": memory_stats,
    "reset_peak_memory_stats": reset_peak_memory_stats,
    "reset_accumulated_memory_stats": reset_accumulated_memory_stats,
    "empty_cache": empty_cache,
    "get_memory_info": get_memory_info,
}


def install() -> None:
    """Put the wrappers in ``torch.accelerator`` (and its ``memory`` module, whose other functions
    call them), and ``torch.get_device_module``'s in ``torch``.

    On the simulated device: ``synchronize`` returns once the device has run everything launched on
    it (at once unless :func:`simdevice.asynchronous` is on); ``current_stream``/``set_stream`` use
    the calling thread's stream of the simulated clock; the memory counters are the device's,
    reserved memory being the allocated memory (no caching allocator, so ``empty_cache`` releases
    nothing); ``get_memory_info`` is ``(free, total)`` of the device's budget, else of the host's
    memory; and ``current_device_index``, ``set_device_index`` and ``device_index`` keep a current
    device per thread, as CUDA does (PrivateUse1's Python device guard knows one device), which
    ``sim`` without an index means.
    """
    if _originals:
        return
    _originals["get_device_module"] = torch.get_device_module
    get_device_module.__doc__ = torch.get_device_module.__doc__
    get_device_module.__wrapped__ = torch.get_device_module
    torch.get_device_module = get_device_module
    for name, wrapper in _WRAPPERS.items():
        _originals[name] = getattr(torch.accelerator, name)
        if not isinstance(wrapper, type):
            wrapper.__doc__ = _originals[name].__doc__
            wrapper.__wrapped__ = _originals[name]
        setattr(torch.accelerator, name, wrapper)
        if hasattr(torch.accelerator.memory, name):
            setattr(torch.accelerator.memory, name, wrapper)
