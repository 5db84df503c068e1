"""A simulated accelerator: a second (and third...) device with real values on any machine.

:func:`enable` adds a device type ``sim`` (``sim:0``, ``sim:1``, ...) that behaves like CUDA for the
device logic the course teaches; values live in host memory, so results equal the CPU's. It stands
on PyTorch's extension point for out-of-tree devices (PrivateUse1) and a tensor subclass that holds
a CPU tensor. Nothing happens on import, and the package imports nothing from the course around it.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from simdevice import _backend, _clock, _memory, _state
from simdevice._backend import SimDeviceError
from simdevice._state import NAME
from simdevice._tensor import SimTensor

__all__ = [
    "NAME",
    "SimDeviceError",
    "SimTensor",
    "asynchronous",
    "device_count",
    "devices",
    "enable",
    "is_enabled",
    "is_shown",
    "max_memory_allocated",
    "memory_allocated",
    "reset_peak_memory_stats",
    "runs_cpu_only_operators",
    "set_memory_budget",
    "show",
    "shown_as_accelerator",
]


def enable(
    count: int = 2, memory_budget: int | None = None, shown: bool = True
) -> list[torch.device]:
    """Turn on ``count`` simulated devices and return them (``[sim:0, sim:1, ...]``).

    ``memory_budget`` (bytes), if given, is set on every device (see
    :func:`set_memory_budget`). ``shown`` is :func:`show`'s setting from now
    on: by default ``torch.accelerator`` names the simulated device. Calling it
    again with the same count returns the same devices (and sets ``shown``);
    another count, or another PrivateUse1 backend already registered in the
    process, raises :class:`SimDeviceError` and changes nothing. It cannot be
    undone in a process (PyTorch allows one PrivateUse1 backend per process).
    Also switches off the autograd engine's device threads in the calling
    thread (PrivateUse1's device guard reports one device).

    On the devices, tensors and modules move there and back, train on any
    index, raise PyTorch's own "Expected all tensors to be on the same device"
    error where CUDA would, save checkpoints tagged ``sim:N`` that load with
    every ``map_location``, run under ``torch.autocast("sim")`` and
    ``torch.amp.GradScaler("sim")``, count memory per device and, with a
    budget, run out of it with ``torch.OutOfMemoryError``. Each thread has a
    current device (``torch.accelerator.set_device_index``). Streams and
    events keep time on a simulated clock (see :func:`asynchronous`).
    ``torch.compile`` runs with every backend and gives eager code's values, but
    breaks the graph at each operator (TorchDynamo cannot see through a device
    written in Python). Not simulated: speed (each operator costs more than on
    the CPU), page-locked memory (``pin_memory()`` gives a CPU copy marked
    pinned), a random generator of its own (the CPU's is used), and several
    processes sharing one device.

    On a CPU-only machine nothing is lost. On a machine with a real
    accelerator PyTorch then names ``sim`` its accelerator, refuses
    ``torch.accelerator`` calls that name the real device, and fails every
    backward pass through CUDA tensors inside its autograd engine (see
    ``docs/gpu-report.md`` and pytorch/pytorch#161129); only a new process
    undoes it.
    """
    _backend.enable(count)
    show(shown)
    if memory_budget is not None:
        for index in range(count):
            set_memory_budget(index, memory_budget)
    return devices()


def show(shown: bool = True) -> None:
    """Whether ``torch.accelerator`` names the simulated device from now on, in every thread.

    Once on, the simulated device is PyTorch's accelerator. Hidden (``show(False)``),
    ``torch.accelerator`` (``current_accelerator``, ``is_available``,
    ``device_count``, the device-wide calls) and ``torch.get_device_module()``
    answer as they would on this machine without it: on a machine without an
    accelerator, ``None``, ``False``, 0, and the device-wide calls raise
    PyTorch's "Cannot access accelerator device when none is available.".
    Tensors and modules on ``sim:N`` work either way. A thread can override
    the setting for a block with :func:`shown_as_accelerator`.
    """
    _state.state["shown"] = bool(shown)


def is_shown() -> bool:
    """Whether ``torch.accelerator`` names the simulated device in the calling thread (see
    :func:`show`)."""
    return _state.shown()


@contextlib.contextmanager
def shown_as_accelerator(shown: bool = True) -> Iterator[None]:
    """In the calling thread, for the block: ``torch.accelerator`` names the simulated device (or
    not, with ``shown=False``), whatever :func:`show` says; nested blocks restore the outer one's
    setting."""
    previous = _state.set_thread_shown(bool(shown))
    try:
        yield
    finally:
        _state.set_thread_shown(previous)


@contextlib.contextmanager
def runs_cpu_only_operators() -> Iterator[None]:
    """For the block, in every thread: the device runs the operators CUDA has no kernel for
    (``torch.histogram``, ``torch.histogramdd``) with the CPU's kernel, as a device that has some of
    them does (MPS has ``histogram``); outside it, it refuses them in CUDA's words. Nested blocks
    keep it on until the outermost ends."""
    _state.state["cpu_only_runs"] = int(_state.state.get("cpu_only_runs", 0)) + 1
    try:
        yield
    finally:
        _state.state["cpu_only_runs"] = int(_state.state["cpu_only_runs"]) - 1


def is_enabled() -> bool:
    """True once :func:`enable` has run in this process."""
    return _backend.enabled()


def device_count() -> int:
    """How many simulated devices are on (0 before :func:`enable`)."""
    return _backend.count()


def devices() -> list[torch.device]:
    """The simulated devices, indexed: ``[sim:0, sim:1, ...]``; empty before :func:`enable`."""
    return [torch.device(NAME, i) for i in range(_backend.count())]


def memory_allocated(device: torch.device | str | int | None = None) -> int:
    """Bytes held by tensors on ``device`` (default: the current one), like
    ``torch.cuda.memory_allocated``."""
    return _memory.of(device).allocated


def max_memory_allocated(device: torch.device | str | int | None = None) -> int:
    """The peak of :func:`memory_allocated` since enabling or the last reset."""
    return _memory.of(device).peak


def reset_peak_memory_stats(device: torch.device | str | int | None = None) -> None:
    """Start the peak of ``device`` again from what it holds now."""
    entry = _memory.of(device)
    entry.peak = entry.allocated


def set_memory_budget(device: torch.device | str | int | None, nbytes: int | None) -> None:
    """Let ``device`` hold at most ``nbytes`` (None: no limit).

    An allocation past it raises ``torch.OutOfMemoryError`` (a
    ``RuntimeError``), worded like CUDA's, and allocates nothing.
    """
    if nbytes is not None and nbytes < 0:
        raise ValueError(f"nbytes must be >= 0 or None, not {nbytes}")
    _memory.of(device).budget = nbytes


def asynchronous(kernel_s: float, first_call_s: float | None = None):
    """A context manager under which the simulated devices run like a GPU: each operator takes
    device time.

    Inside the ``with`` block each operator on a simulated device returns at
    once, as a GPU's launch does, and the device needs ``kernel_s`` seconds to
    run it, one operator after the other on each stream; the first launch of
    each operator on a device in the block takes ``first_call_s`` more
    (default ``10 * kernel_s``), as a GPU's first call pays one-off costs, so
    timing that counts the warm-up shows it. ``torch.accelerator.synchronize()``
    waits until the device has run everything launched on it; an event's or a
    stream's ``synchronize()``, ``.item()``, ``.tolist()``, printing and copies
    to the CPU (unless ``non_blocking=True``) until the stream they concern
    has; all by sleeping. So a clock read around launches without a
    synchronize measures only the launches, as on a GPU, and events recorded
    around them measure the device's time. Values are what they always are
    (computed at once), except that a ``non_blocking`` copy into pinned host
    memory (``.to("cpu", non_blocking=True)`` makes its result pinned, as on
    CUDA) arrives only when the program waits for the stream that copies:
    read earlier, it holds what the memory held (zeros for a new tensor).
    Leaving the block waits for every device. On any machine; nothing changes
    outside the block.
    """
    return _clock.running(kernel_s, first_call_s)
