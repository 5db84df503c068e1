"""Asynchronous execution, simulated: operators return before the device has run them.

A GPU runs operators queued per stream while Python goes on; the program waits only where it must
(synchronize, reading values on the host). While :func:`running` is on, :func:`account` charges each
operator device time on its stream and the waiting calls sleep until their streams are done. Values
are computed at once, but a ``non_blocking`` copy to pinned host memory arrives only when the
program waits for its stream (:func:`late_copy`)."""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from typing import Iterator

import torch

from simdevice._state import NAME

_lock = threading.Lock()
_kernel_s: list[float] = []  # [] while off; [kernel_s, first_call_s] while on
# (device index, stream id) -> when it will have run its queue
_busy_until: dict[tuple[int, int], float] = {}
_seen: set[tuple[int, object]] = set()  # (device index, operator) launched since running() began
_stream_ids = itertools.count(1)  # 0 is each device's default stream
_current = threading.local()  # .streams: {device index: stream id}, per thread as on CUDA
# Copies to pinned host memory not arrived yet: (device index, stream id, when it will have run,
# destination, values).
_late: list[tuple[int, int, float, torch.Tensor, torch.Tensor]] = []

_aten = torch.ops.aten
# Operators that hand a value to the host, and so wait for the device first.
_TO_HOST = {_aten._local_scalar_dense.default, _aten.equal.default, _aten.is_nonzero.default}


def on() -> bool:
    return bool(_kernel_s)


@contextlib.contextmanager
def running(kernel_s: float, first_call_s: float | None = None) -> Iterator[None]:
    """For the block, each operator costs ``kernel_s`` seconds of device time on the calling
    thread's current stream of its device, the first launch of each operator on a device
    ``first_call_s`` more (a GPU's one-off costs); a stream works off its operators one after the
    other, the streams of a device side by side."""
    if not kernel_s > 0:
        raise ValueError(f"kernel_s must be a positive number of seconds, not {kernel_s!r}")
    first_call_s = 10 * kernel_s if first_call_s is None else first_call_s
    if not first_call_s >= 0:
        raise ValueError(f"first_call_s must be a number of seconds >= 0, not {first_call_s!r}")
    with _lock:
        if _kernel_s:
            raise RuntimeError("the simulated device is already running asynchronously")
        _kernel_s.extend((float(kernel_s), float(first_call_s)))
    try:
        yield
    finally:
        wait_all()
        with _lock:
            _late.clear()
            _kernel_s.clear()
            _busy_until.clear()
            _seen.clear()


def new_stream_id() -> int:
    return next(_stream_ids)


def current_stream(index: int) -> int:
    """The calling thread's current stream on simulated device ``index`` (0, the default stream,
    until set)."""
    return getattr(_current, "streams", {}).get(index, 0)


def set_current_stream(index: int, stream: int) -> int:
    """Make ``stream`` the calling thread's current stream on device ``index``; return the previous
    one."""
    streams = _current.__dict__.setdefault("streams", {})
    previous = streams.get(index, 0)
    streams[index] = stream
    return previous


def reached(index: int, stream: int | None = None) -> float:
    """When device ``index`` will have run what was launched so far on ``stream`` (None: on every
    stream)."""
    now = time.perf_counter()
    if stream is not None:
        return max(now, _busy_until.get((index, stream), 0.0))
    return max([now, *(until for (i, _), until in list(_busy_until.items()) if i == index)])


def hold(index: int, stream: int, until: float) -> None:
    """Let work launched from now on on ``stream`` start no earlier than ``until`` (a wait on an
    event)."""
    with _lock:
        if _kernel_s:
            _busy_until[(index, stream)] = max(_busy_until.get((index, stream), 0.0), until)


def sleep_until(moment: float) -> None:
    delay = moment - time.perf_counter()
    if delay > 0:
        time.sleep(delay)


def wait(index: int, stream: int | None = None) -> None:
    """Sleep until simulated device ``index`` has run every operator launched on ``stream`` (None:
    on all)."""
    sleep_until(reached(index, stream))
    _arrive(index, stream)


def wait_until(index: int, moment: float) -> None:
    """Sleep until ``moment`` (an event's), when device ``index`` has run what was launched before
    it."""
    sleep_until(moment)
    _arrive(index, None, moment)


def _arrive(index: int, stream: int | None, moment: float | None = None) -> None:
    """Let the late copies of device ``index`` on ``stream`` (None: any) that run by ``moment``
    arrive."""
    arriving, staying = [], []
    with _lock:
        for copy in _late:
            due = (
                copy[0] == index
                and stream in (None, copy[1])
                and (moment is None or copy[2] <= moment)
            )
            (arriving if due else staying).append(copy)
        _late[:] = staying
    with torch.no_grad():
        for _, _, _, destination, values in arriving:
            destination.copy_(values)


def late_copy(func, args: tuple, copy):
    """Run ``copy()``, a ``non_blocking`` copy from a simulated device to pinned host memory, as a
    GPU runs it.

    It returns at once and the values arrive when the device gets to it on the current stream: until
    the program waits for that stream (a synchronize, an event recorded after it, a blocking copy on
    it), the destination holds what it held before; a new tensor's memory (pinned, as CUDA's
    ``_to_copy`` makes it) holds zeros.
    """
    source = args[1] if func is _aten.copy_.default else args[0]
    index = source.device.index
    _launch(index, func)
    before = args[0].detach().clone() if func is _aten.copy_.default else None
    out = copy()
    destination = out.detach()
    values = destination.clone()
    with torch.no_grad():
        if before is None:
            destination.untyped_storage()._sim_pinned = True
            destination.zero_()
        else:
            destination.copy_(before)
    with _lock:
        stream = current_stream(index)
        _late.append((index, stream, _busy_until.get((index, stream), 0.0), destination, values))
    return out


def wait_all() -> None:
    for index in {i for i, _ in list(_busy_until)}:
        wait(index)


def _launch(index: int, func) -> None:
    with _lock:
        if not _kernel_s:
            return
        cost = _kernel_s[0]
        if (index, func) not in _seen:
            _seen.add((index, func))
            cost += _kernel_s[1]
        key = (index, current_stream(index))
        _busy_until[key] = max(time.perf_counter(), _busy_until.get(key, 0.0)) + cost


def account(func, args: tuple, kwargs: dict) -> bool:
    """Called for each operator on a simulated device, before it runs: wait for it, or queue it.
    True for a ``non_blocking`` copy to pinned host memory, which the caller runs through
    :func:`late_copy`."""
    values = [
        item
        for value in (*args, *kwargs.values())
        # torch.cat([...]) too
        for item in (value if isinstance(value, (list, tuple)) else (value,))
    ]
    devices = {
        value.device.index
        for value in values
        if isinstance(value, torch.Tensor) and value.device.type == NAME
    }
    target = kwargs.get("device")
    to_host = (
        func in _TO_HOST
        or (
            func is _aten._to_copy.default
            and target is not None
            and torch.device(target).type != NAME
        )
        or (func is _aten.copy_.default and args[0].device.type != NAME)
    )
    if to_host:
        if not kwargs.get("non_blocking") and not (len(args) > 2 and args[2]):
            for index in devices:
                wait(index, current_stream(index))  # a copy to the host runs on the current stream
            return False
        # a copy into pageable memory completes before it returns (CUDA's cudaMemcpyAsync to
        # pageable memory)
        return func is _aten._to_copy.default or (
            func is _aten.copy_.default and args[0].is_pinned()
        )
    for index in devices:
        _launch(index, func)
    return False
