"""Device memory: what this process holds, out-of-memory errors, and a model that runs out on
purpose.

:func:`rss_mib` (the one number that shows CPU tensors come and go), :func:`is_out_of_memory` (an
allocation failure on any device), :class:`MemoryHungry`, and the profiler's timelines
(:func:`memory_profile`, :func:`plot_memory_timeline`). Introduced in 08_portable_models_and_memory.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
import weakref
from typing import Iterator

import torch
from torch import nn

from devcourse.measure import proc_status_mib

# 1 PiB: more than any GPU holds and more than a 64-bit CPU process can address.
IMPOSSIBLE_BYTES = 2**50

_CPU_OOM_TEXT = ("can't allocate memory", "out of memory")
# MPSHeapAllocatorImpl::alloc_buffer_block (aten/src/ATen/mps/MPSAllocator.mm) checks every request
# first: TORCH_CHECK(size < m_max_buffer_size, "Invalid buffer size: ", format_size(size)), where
# m_max_buffer_size is the device's maxBufferLength. IMPOSSIBLE_BYTES there gives "Invalid buffer
# size: 1048576.00 GiB".
_MPS_TOO_LARGE_PREFIX = "Invalid buffer size: "


def rss_mib() -> float:
    """This process's resident memory now, in MiB.

    Read from ``/proc/self/status`` on Linux, from ``psutil`` elsewhere when
    it is installed. It counts everything the process holds, CPU tensors
    included; GPU memory is not in it. Works the same with or without a GPU.
    """
    resident = proc_status_mib("VmRSS")
    if resident is not None:
        return resident
    import psutil  # not on Linux: psutil ships with the course's Jupyter stack

    return psutil.Process().memory_info().rss / 2**20


def is_out_of_memory(exc: BaseException) -> bool:
    """True when ``exc`` is a failed allocation, on any device.

    ``torch.OutOfMemoryError`` (raised by CUDA's allocator; also reachable as
    ``torch.cuda.OutOfMemoryError``) counts, and so does the ``RuntimeError``
    of PyTorch's CPU allocator (``DefaultCPUAllocator: can't allocate
    memory``), of MPS (``MPS backend out of memory ...``, and ``Invalid
    buffer size: ...`` for a request over Metal's largest buffer, which MPS
    refuses before allocating) or of another backend whose message says
    ``out of memory``. Any other error, a shape or device mismatch for
    instance, is not one. On a CPU-only machine only the first and the CPU
    allocator's can really occur; the MPS texts are matched as PyTorch's
    source writes them.
    """
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    if type(exc) is RuntimeError:
        text = str(exc)
        return text.startswith(_MPS_TOO_LARGE_PREFIX) or any(part in text for part in _CPU_OOM_TEXT)
    return False


def _size(nbytes: int) -> str:
    """A byte count as PyTorch's caching allocators write it (``format_size`` of ``c10/core``)."""
    for limit, unit, divisor in ((1024, "bytes", 1), (2**20, "KiB", 1024), (2**30, "MiB", 2**20)):
        if nbytes <= limit:
            return f"{nbytes} bytes" if unit == "bytes" else f"{nbytes / divisor:.2f} {unit}"
    return f"{nbytes / 2**30:.2f} GiB"


def out_of_memory_errors(nbytes: int = 2 * 2**30) -> dict[str, BaseException]:
    """Each backend's error for an allocation of ``nbytes`` that does not fit, as PyTorch raises it.

    Worded as PyTorch 2.13's source writes them (the numbers other than ``nbytes`` are made up):

    * ``"cuda"``: ``torch.OutOfMemoryError`` (``c10/cuda/CUDACachingAllocator.cpp``);
    * ``"xpu"``: ``torch.OutOfMemoryError`` (``c10/xpu/XPUCachingAllocator.cpp``);
    * ``"cpu"``: the CPU allocator's ``RuntimeError`` (``c10/core/impl/alloc_cpu.cpp``, also seen
      here);
    * ``"mps"``: MPS's ``RuntimeError`` for memory that is not there, and ``"mps_buffer"`` its
      ``RuntimeError`` for a request over Metal's largest buffer
      (``aten/src/ATen/mps/MPSAllocator.mm``).

    :func:`is_out_of_memory` says True of each. Tests of out-of-memory handling raise them through
    :class:`MemoryHungry`'s ``error``, so that an answer that knows only one backend's words loses.
    """
    size = _size(nbytes)
    return {
        "cuda": torch.OutOfMemoryError(
            f"CUDA out of memory. Tried to allocate {size}. GPU 0 has a total capacity of 79.19 GiB"
            " of which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.12 GiB"
            " memory in use. Of the allocated memory 77.50 GiB is allocated by PyTorch, and 120.00"
            " MiB is reserved by PyTorch but unallocated. If reserved but unallocated memory is"
            " large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid"
            " fragmentation.  See documentation for Memory Management "
            " (https://docs.pytorch.org/docs/stable/notes/cuda.html#environment-variables)"
        ),
        "xpu": torch.OutOfMemoryError(
            f"XPU out of memory. Tried to allocate {size}. GPU 0 has a total capacity of 15.11 GiB"
            " of which 1.02 GiB is free. Of the allocated memory 13.50 GiB is allocated by"
            " PyTorch, and 120.00 MiB is reserved by PyTorch but unallocated. Please use"
            " `empty_cache` to release all unoccupied cached memory."
        ),
        "cpu": RuntimeError(
            "[enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate"
            f" memory: you tried to allocate {nbytes} bytes. Error code 12 (Cannot allocate memory)"
        ),
        "mps": RuntimeError(
            "MPS backend out of memory (MPS allocated: 17.20 GiB, other allocations: 1.03 GiB, max"
            f" allowed: 18.13 GiB). Tried to allocate {size} on private pool. Use"
            " PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to disable upper limit for memory allocations"
            " (may cause system failure)."
        ),
        "mps_buffer": RuntimeError(f"{_MPS_TOO_LARGE_PREFIX}{size}"),
    }


def not_memory_errors() -> dict[str, BaseException]:
    """Errors that running on less memory does not fix, though their words say CUDA, memory or
    allocator.

    * ``"illegal_address"``: a kernel that read outside its tensor, CUDA's
      ``torch.AcceleratorError`` (``c10/cuda/CUDAException.cpp`` and ``cudaGetErrorString``); the
      CUDA context is lost after it;
    * ``"pin_memory"``: ``torch.empty(4, pin_memory=True)`` on a machine without an accelerator
      (PyTorch 2.13, seen here);
    * ``"cuda_checkpoint"``: ``torch.load`` of a checkpoint saved on a GPU, on a machine without
      CUDA (``torch/serialization.py``, seen here);
    * ``"device_mismatch"``: two devices in one operation (``TensorIteratorBase::compute_types``).

    :func:`is_out_of_memory` says False of each.
    """
    return {
        "illegal_address": torch.AcceleratorError(
            "CUDA error: an illegal memory access was encountered\nSearch for"
            " `cudaErrorIllegalAddress' in"
            " https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html for more"
            " information.\nCUDA kernel errors might be asynchronously reported at some other API"
            " call, so the stacktrace below might be incorrect.\nFor debugging consider passing"
            " CUDA_LAUNCH_BLOCKING=1\nCompile with `TORCH_USE_CUDA_DSA` to enable device-side"
            " assertions.\n"
        ),
        "pin_memory": RuntimeError(
            "pin_memory=True requires a CUDA or other accelerator backend; no pinned memory "
            "allocator is available on this system."
        ),
        "cuda_checkpoint": RuntimeError(
            "Attempting to deserialize object on a CUDA device but torch.cuda.is_available() is"
            " False. If you are running on a CPU-only machine, please use torch.load with"
            " map_location=torch.device('cpu') to map your storages to the CPU."
        ),
        "device_mismatch": RuntimeError(
            "Expected all tensors to be on the same device, but found at least two devices, cuda:0"
            " and cpu!"
        ),
    }


class MemoryHungry(nn.Module):
    """A linear model that runs out of memory for batches larger than ``limit``.

    For such a batch, after computing a first activation, the forward pass
    asks its device's allocator for an impossible block
    (:data:`IMPOSSIBLE_BYTES`), so the error is the device's own:
    ``torch.OutOfMemoryError`` on a CUDA GPU, the CPU allocator's
    ``RuntimeError`` on the CPU, and on a Mac the MPS allocator's
    ``RuntimeError: Invalid buffer size: ...`` (1 PiB is more than Metal's
    largest buffer; from PyTorch's source). The ``meta`` device allocates nothing and so
    cannot run out; there the model raises ``torch.OutOfMemoryError`` itself,
    which is the one error that is made up rather than real.

    It also keeps the record a test needs:

    * ``calls``: the batch size of every forward call, in order;
    * ``alive_at_retry``: for each call, how many activations of earlier
      *failed* calls were still alive when it started. Code that leaves the
      failed attempt behind (``except`` block left, exception not kept)
      gives all zeros.

    Outputs equal ``nn.Linear``'s with the same weights. Works on any device.

    ``error``, if given, is raised instead of asking the allocator: an exception (raised as it is)
    or a callable that makes one. Tests use it to raise every backend's out-of-memory error on any
    machine (:func:`out_of_memory_errors`), and errors that are not about memory
    (:func:`not_memory_errors`).
    """

    def __init__(
        self, limit: int, in_features: int = 8, out_features: int = 4, seed: int = 0, error=None
    ):
        super().__init__()
        self.error = error
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.linear = nn.Linear(in_features, out_features)
        self.limit = limit
        self.calls: list[int] = []
        self.alive_at_retry: list[int] = []
        self._failed: list[weakref.ref] = []

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.alive_at_retry.append(sum(ref() is not None for ref in self._failed))
        self.calls.append(x.shape[0])
        hidden = self.linear(x)
        if x.shape[0] > self.limit:
            self._failed.append(weakref.ref(hidden))
            if self.error is not None:
                raise self.error if isinstance(self.error, BaseException) else self.error()
            if x.device.type == "meta":
                raise torch.OutOfMemoryError(
                    f"meta stand-in: a batch of {x.shape[0]} is over this model's limit of"
                    f" {self.limit}"
                )
            torch.empty(IMPOSSIBLE_BYTES, dtype=torch.uint8, device=x.device)
        return hidden


@contextlib.contextmanager
def _error_stream_silenced() -> Iterator[None]:
    """File descriptor 2 goes to the null device for the block (what C++ code writes there is
    dropped)."""
    sys.stderr.flush()
    saved = os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(null)
        os.close(saved)


@contextlib.contextmanager
def memory_profile() -> Iterator[torch.profiler.profile]:
    """``torch.profiler.profile`` recording the CPU's allocations with their stacks; yields the
    profile.

    The same as ``profile(activities=[ProfilerActivity.CPU], profile_memory=True,
    record_shapes=True, with_stack=True)`` (its memory timeline needs all three), except that the
    two lines the profiler's C++ side (kineto) logs when it starts and stops, with a time stamp and
    process ids, are dropped: only the starting and stopping run with the error stream silenced,
    never the code in the block. Starting and stopping also drop the ``UserWarning`` "Profiler
    clears events at the end of each cycle", which older PyTorch releases give for a profile without
    cycles (seen with 2.11 on a GPU machine; pytorch/pytorch#180387 stopped it).
    ``torch.cuda._memory_viz._profile_to_snapshot(prof)`` turns the result into the snapshot format
    of the viewer at pytorch.org/memory_viz, ``profile_plot(prof)`` into a page of it. Works on any
    machine: on a CPU-only one it records the CPU's allocator.
    """
    from torch.profiler import ProfilerActivity, profile

    prof = profile(
        activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True, with_stack=True
    )
    with _profiler_quiet():
        prof.__enter__()
    try:
        yield prof
    finally:
        with _profiler_quiet():
            prof.__exit__(*sys.exc_info())


@contextlib.contextmanager
def _profiler_quiet() -> Iterator[None]:
    """The profiler's start or stop without its log lines and its warning about cycles (see
    memory_profile)."""
    with _error_stream_silenced(), warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore",
            message="Warning: Profiler clears events at the end of each cycle",
            category=UserWarning,
        )
        yield


def held_over_time(trace: list[dict]) -> list[int]:
    """The bytes a snapshot trace holds after each of its entries, oldest first.

    ``trace`` is one device's list of entries (``snapshot["device_traces"][-1]``
    of ``torch.cuda._memory_viz._profile_to_snapshot(prof)`` is the CPU's: that
    list holds one trace per CUDA device first, then the CPU's): an ``"alloc"``
    adds its ``"size"``, a ``"free_completed"`` takes it away; other actions
    (``"free_requested"``, ``"segment_alloc"`` ...) change nothing. The same on
    any machine; on a CPU-only one the CPU's trace is the only one.
    """
    held, total = [], 0
    for entry in trace:
        if entry["action"] == "alloc":
            total += entry["size"]
        elif entry["action"] == "free_completed":
            total -= entry["size"]
        held.append(total)
    return held


def plot_memory_timeline(traces: dict[str, list[dict]], path: str | os.PathLike) -> os.PathLike:
    """Draw each trace's :func:`held_over_time`, in MiB, as one line of a PNG picture at ``path``;
    return the path.

    ``traces`` maps a label to a trace. The x axis counts the trace's
    allocation events (the profile records their order, not a clock that
    means the same on every machine). Uses matplotlib without pyplot, so it
    touches no global figure state and needs no display: the same on a
    CPU-only machine, a GPU box or CI. The picture is small (640 x 280 pixels).
    """
    from pathlib import Path

    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 3.5), dpi=80)
    axes = figure.subplots()
    for label, trace in traces.items():
        held = [0] + held_over_time(trace)
        axes.step(range(len(held)), [value / 2**20 for value in held], where="post", label=label)
    axes.set_xlabel("allocation events, in order")
    axes.set_ylabel("MiB held")
    axes.set_title("memory held during the profile")
    axes.legend()
    figure.tight_layout()
    path = Path(path)
    figure.savefig(path)
    return path
