"""A simulated accelerator: a second (and third...) device with real values on any machine.

On a machine without a GPU, ``enable()`` adds a device type ``sim`` with
``count`` devices (``sim:0``, ``sim:1``, ...) that behaves, for the device
logic a course teaches, like CUDA devices: tensors and modules move to it
and back, train on any index, raise PyTorch's own "Expected all tensors to
be on the same device" error where CUDA would (with ``sim`` in place of
``cuda``), save checkpoints tagged ``sim:N`` that load with every form of
``map_location``, run under ``torch.autocast("sim")`` and
``torch.amp.GradScaler("sim")``, count memory per device (also through
``torch.accelerator``'s memory calls, and ``torch.accelerator.synchronize()``
returns) and, with a budget, run out of it with ``torch.OutOfMemoryError``.
Each thread has a current device (``torch.accelerator.set_device_index``,
``torch.accelerator.device_index``), which ``sim`` without an index names.
Values live in host memory,
so results can be compared with the CPU's exactly.

``torch.compile`` runs on the simulated device with every backend (``eager``,
``aot_eager``, ``inductor``) and gives the values eager code gives, which are
the CPU's. It does not give whole graphs: TorchDynamo cannot see through a
device written in Python (it would trace the device's own code) and breaks
the graph at each operator on a simulated tensor, so compiled code runs as
eager code does, operator by operator. That is a limit of the simulated
device; on CUDA the same call compiles whole graphs.

It is built on PyTorch's extension point for out-of-tree devices
(PrivateUse1, with the Python backend of
``torch.utils.backend_registration``) and a tensor subclass that holds a CPU
tensor. It is a teaching and grading device, not a fast one: each operator
costs tens of microseconds more than on the CPU.

Whether ``torch.accelerator`` names the device is a setting of its own
(:func:`show`, :func:`shown_as_accelerator`): a grader can turn the device
on before a student's code runs and still let ``torch.accelerator`` answer as
on the student's machine outside the checks that use the device.

Nothing happens on import. ``enable()`` is the one explicit switch; it
cannot be undone in a process (PyTorch allows one PrivateUse1 backend per
process), calling it again with the same count does nothing, and it refuses,
changing nothing, when another PrivateUse1 backend is registered.

Streams and events (``torch.Stream``, ``torch.Event(enable_timing=True)``,
``torch.accelerator.current_stream``) keep time on a simulated clock:
operators finish before they return, unless :func:`asynchronous` charges each
one device time on its stream, to be waited for. What it does not simulate:
speed, page-locked memory (``pin_memory()`` gives a CPU copy marked pinned), a
random generator of its own (random numbers on ``sim`` come from the CPU
generator), and several processes sharing one device. This package imports
nothing from the course around it.

On a machine with a real accelerator, ``enable()`` costs that accelerator
part of the process: PyTorch then names ``sim`` its accelerator
(``torch.accelerator.current_accelerator()``), refuses ``torch.accelerator``
calls that name the real device, and fails every backward pass through CUDA
tensors inside its autograd engine (``opt_ready_stream && opt_parent_stream
INTERNAL ASSERT FAILED``; measured on an NVIDIA H200 with PyTorch 2.11, see
``docs/gpu-report.md``, and pytorch/pytorch#161129). Nothing undoes it but a
new process. On a CPU-only machine nothing is lost.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from devcourse.simdevice import _backend, _clock, _memory, _state
from devcourse.simdevice._backend import SimDeviceError
from devcourse.simdevice._state import NAME
from devcourse.simdevice._tensor import SimTensor

__all__ = [
    "NAME", "SimDeviceError", "SimTensor", "asynchronous", "device_count", "devices", "enable", "is_enabled",
    "is_shown", "max_memory_allocated", "memory_allocated", "reset_peak_memory_stats", "set_memory_budget", "show",
    "shown_as_accelerator",
]


def enable(count: int = 2, memory_budget: int | None = None, shown: bool = True) -> list[torch.device]:
    """Turn on ``count`` simulated devices and return them (``[sim:0, sim:1, ...]``).

    ``memory_budget`` (bytes), if given, is set on every device (see
    :func:`set_memory_budget`). ``shown`` is :func:`show`'s setting from now
    on: by default ``torch.accelerator`` names the simulated device. Calling it
    again with the same count returns the same devices (and sets ``shown``);
    another count, or another PrivateUse1 backend already registered in the
    process, raises :class:`SimDeviceError` and changes nothing. Also switches
    off the autograd engine's device threads in the calling thread
    (PrivateUse1's device guard reports one device).
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
    """Whether ``torch.accelerator`` names the simulated device in the calling thread (see :func:`show`)."""
    return _state.shown()


@contextlib.contextmanager
def shown_as_accelerator(shown: bool = True) -> Iterator[None]:
    """In the calling thread, for the block: ``torch.accelerator`` names the simulated device (or not, with
    ``shown=False``), whatever :func:`show` says; nested blocks restore the outer one's setting."""
    previous = _state.set_thread_shown(bool(shown))
    try:
        yield
    finally:
        _state.set_thread_shown(previous)


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
    """Bytes held by tensors on ``device`` (default: the current one), like ``torch.cuda.memory_allocated``."""
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
    """A context manager under which the simulated devices run like a GPU: each operator takes device time.

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
    (computed at once). Leaving the block waits for every device. On any
    machine; nothing changes outside the block.
    """
    return _clock.running(kernel_s, first_call_s)
