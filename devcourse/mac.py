"""A Mac for checks on any machine: MPS's device names, its one device, its float64 limit and its
error texts.

PyTorch's MPS backend runs on Apple silicon only, and the course's checks run on Linux: inside
:func:`simulated_mac` the code under test meets a Mac whose GPU is the simulated ``sim:0``
(:data:`devcourse.machines.MACHINES`' ``"mac"``). Introduced in 00_environment.
"""

from __future__ import annotations

import contextlib
import re
from typing import Iterator

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

import simdevice
from devcourse.stand_ins import replaced, simulated_devices, simulated_mps

MPS = torch.device("mps", 0)


def stand_in() -> torch.device:
    """The device that stands in for the Mac's GPU, ``sim:0`` (valid once the simulated device is
    on)."""
    return torch.device(simdevice.NAME, 0)


MPS_FLOAT64 = (
    "Cannot convert a MPS Tensor to float64 dtype as the MPS framework doesn't support float64. "
    "Please use float32 instead."
)
# Metal's largest buffer (MTLDevice.maxBufferLength) depends on the Mac; half of a 32 GiB Mac's
# memory here.
MAX_BUFFER_BYTES = 16 * 2**30
_CPU_ALLOCATION = re.compile(r"you tried to allocate (\d+) bytes")


def format_size(size: int) -> str:
    """A byte count as PyTorch's caching allocators write it
    (``c10/core/CachingDeviceAllocator.h``)."""
    if size <= 1024:
        return f"{size} bytes"
    if size <= 1048576:
        return f"{size / 1024.0:.2f} KiB"
    if size <= 1073741824:
        return f"{size / 1048576.0:.2f} MiB"
    return f"{size / 1073741824.0:.2f} GiB"


def invalid_buffer_size(nbytes: int) -> RuntimeError:
    """MPS's refusal of a request larger than Metal's largest buffer (made before allocating
    anything)."""
    return RuntimeError(f"Invalid buffer size: {format_size(nbytes)}")


def out_of_memory(
    requested: int | str, allocated: int = 0, max_allowed: int = 24 * 2**30
) -> RuntimeError:
    """MPS's out-of-memory error, as with the high watermark on (its default), for a request of
    ``requested`` bytes (or a size already written out)."""
    size = requested if isinstance(requested, str) else format_size(requested)
    return RuntimeError(
        f"MPS backend out of memory (MPS allocated: {format_size(allocated)}, other allocations:"
        f" {format_size(0)}, max allowed: {format_size(max_allowed)}). Tried to allocate {size} on"
        " private pool. Use PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable upper limit for memory"
        " allocations (may cause system failure)."
    )


def _names_mps(value: object) -> bool:
    if isinstance(value, torch.device):
        return value.type == "mps"
    return isinstance(value, str) and (value == "mps" or value.startswith("mps:"))


def to_stand_in(value: object) -> object:
    """``value`` with a device that names MPS replaced by :func:`stand_in`; anything else unchanged.

    ``mps:1`` raises: a Mac has one MPS device.
    """
    if not _names_mps(value):
        return value
    device = torch.device(value)
    if device.index not in (None, 0):
        raise RuntimeError(f"{device}: a Mac has one MPS device, mps:0 (simulated Mac)")
    return stand_in()


def _translated(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    args = tuple(to_stand_in(a) for a in args)
    kwargs = {
        key: to_stand_in(value) if key in ("device", "map_location") else value
        for key, value in kwargs.items()
    }
    if isinstance(kwargs.get("map_location"), dict):
        kwargs["map_location"] = {
            key: str(to_stand_in(value)) if _names_mps(value) else value
            for key, value in kwargs["map_location"].items()
        }
    return args, kwargs


def _on_the_mac(value: object) -> list[torch.Tensor]:
    """The tensors in ``value`` (a tensor, or lists, tuples and dicts of them) that are on the Mac's
    GPU."""
    found: list[torch.Tensor] = []
    pending, seen = [value], 0
    while pending and seen < 100_000:
        item = pending.pop()
        seen += 1
        if isinstance(item, torch.Tensor):
            if item.device == stand_in():
                found.append(item)
        elif isinstance(item, dict):
            pending.extend(item.values())
        elif isinstance(item, (list, tuple)):
            pending.extend(item)
    return found


def _refuse_float64(value: object) -> None:
    if any(t.dtype == torch.float64 for t in _on_the_mac(value)):
        raise TypeError(MPS_FLOAT64)


@contextlib.contextmanager
def _mps_memory_errors() -> Iterator[None]:
    """The errors of an allocation on the Mac's GPU, in MPS's forms."""
    try:
        yield
    except torch.OutOfMemoryError as err:  # the simulated device's budget: memory that is not there
        wanted = re.search(r"Tried to allocate (.+?)\. ", str(err))
        raise out_of_memory(wanted.group(1) if wanted else "?") from None
    except RuntimeError as err:  # the host's allocator, where the simulated device keeps its values
        asked = _CPU_ALLOCATION.search(str(err))
        if asked is None or type(err) is not RuntimeError:
            raise
        nbytes = int(asked.group(1))
        raise (
            invalid_buffer_size(nbytes) if nbytes >= MAX_BUFFER_BYTES else out_of_memory(nbytes)
        ) from None


class _MacMode(TorchFunctionMode):
    """Sends what names MPS to the stand-in, and gives the stand-in MPS's limits."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        # a name stays a name: torch.device("mps", 0) is mps:0 on a Mac too
        if func is torch.device:
            return func(*args, **(kwargs or {}))
        args, kwargs = _translated(args, dict(kwargs or {}))
        touches_the_mac = (
            kwargs.get("device") == stand_in()
            or _on_the_mac([args, kwargs])
            or any(isinstance(a, torch.device) and a == stand_in() for a in args)
        )
        if not touches_the_mac:
            return func(*args, **kwargs)
        with _mps_memory_errors():
            result = func(*args, **kwargs)
        _refuse_float64(result)
        return result


@contextlib.contextmanager
def simulated_mac() -> Iterator[torch.device]:
    """Run the block as on a Mac; yields the device a check on the Mac is handed.

    The machine (:func:`devcourse.stand_ins.simulated_mps`): ``torch.backends.mps`` is available,
    ``torch.cuda`` sees no GPU, ``torch.accelerator`` names ``mps`` with one device,
    ``best_device()`` gives ``mps:0``. A tensor, module or checkpoint sent to ``mps`` (with or
    without index) lands on ``sim:0`` (:func:`stand_in`). Its limits, as PyTorch's source writes
    them (not run on a Mac): a float64 tensor raises MPS's ``TypeError`` (:data:`MPS_FLOAT64`);
    ``mps:1`` does not exist; running out of memory raises MPS's plain ``RuntimeError`` forms
    (``Invalid buffer size: ...`` over Metal's largest buffer, else ``MPS backend out of memory
    ...``, from ``aten/src/ATen/mps/MPSAllocator.mm``). What it cannot show: tensors report
    ``sim:0``, not ``mps:0``; operators MPS lacks run anyway, and so do those CUDA lacks
    (:func:`simdevice.runs_cpu_only_operators`).

    Turns the simulated device on (hidden from ``torch.accelerator``) if it is off. Works on any
    machine where the simulated device can be turned on, that is one without CUDA.
    """

    simulated_devices()
    real_module_to, real_load = nn.Module.to, torch.load

    def module_to(self, *args, **kwargs):
        args, kwargs = _translated(args, kwargs)
        with _mps_memory_errors():
            moved = real_module_to(self, *args, **kwargs)
        _refuse_float64(list(self.parameters()) + list(self.buffers()))
        return moved

    def load(f, map_location=None, *args, **kwargs):
        _, translated = _translated((), {"map_location": map_location})
        loaded = real_load(f, translated["map_location"], *args, **kwargs)
        _refuse_float64(loaded)
        return loaded

    with contextlib.ExitStack() as stack:
        patch = stack.enter_context
        patch(simulated_mps())
        patch(simdevice.runs_cpu_only_operators())  # MPS has histogram, which CUDA lacks
        patch(replaced(nn.Module, to=module_to))
        patch(replaced(torch, load=load))
        patch(replaced(torch.accelerator, synchronize=lambda device=None, /: None))
        patch(replaced(torch.mps, synchronize=lambda: None))
        patch(replaced(torch.mps, empty_cache=lambda: None))
        patch(_MacMode())
        yield stand_in()
