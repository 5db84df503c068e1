"""Asynchronous execution, simulated: operators return before the device has run them.

A GPU runs operators in the order they were launched, while the Python
program goes on: ``y = x @ x`` returns as soon as the matrix product is
queued. The program waits for the device only where it must: at
``torch.accelerator.synchronize()``, and where it reads values on the host
(``.item()``, ``.tolist()``, ``print``, a copy to the CPU without
``non_blocking=True``). A clock read around launches alone measures the
launches, not the work.

The simulated device computes every value at once, so by default it has no
queue. While :func:`running` is on, each operator on a simulated device is
also charged ``kernel_s`` seconds of device time: the device is busy until
it has worked off every operator launched so far, one after the other, and
the calls above wait until it is done (they sleep). Values are unchanged;
only when the program waits changes.
"""

from __future__ import annotations

import contextlib
import threading
import time
from typing import Iterator

import torch

from devcourse.simdevice._state import NAME

_lock = threading.Lock()
_kernel_s: list[float] = []  # [] while off; one entry while on
_busy_until: dict[int, float] = {}  # device index -> when it will have run everything launched

_aten = torch.ops.aten
# Operators that hand a value to the host, and so wait for the device first.
_TO_HOST = {_aten._local_scalar_dense.default, _aten.equal.default, _aten.is_nonzero.default}


def on() -> bool:
    return bool(_kernel_s)


@contextlib.contextmanager
def running(kernel_s: float) -> Iterator[None]:
    if not kernel_s > 0:
        raise ValueError(f"kernel_s must be a positive number of seconds, not {kernel_s!r}")
    with _lock:
        if _kernel_s:
            raise RuntimeError("the simulated device is already running asynchronously")
        _kernel_s.append(float(kernel_s))
    try:
        yield
    finally:
        wait_all()
        with _lock:
            _kernel_s.clear()
            _busy_until.clear()


def wait(index: int) -> None:
    """Sleep until simulated device ``index`` has run every operator launched on it."""
    delay = _busy_until.get(index, 0.0) - time.perf_counter()
    if delay > 0:
        time.sleep(delay)


def wait_all() -> None:
    for index in list(_busy_until):
        wait(index)


def _launch(index: int) -> None:
    with _lock:
        if not _kernel_s:
            return
        start = max(time.perf_counter(), _busy_until.get(index, 0.0))
        _busy_until[index] = start + _kernel_s[0]


def account(func, args: tuple, kwargs: dict) -> None:
    """Called for each operator on a simulated device, before it runs: wait for it, or queue it."""
    values = [item for value in (*args, *kwargs.values())
              for item in (value if isinstance(value, (list, tuple)) else (value,))]  # torch.cat([...]) too
    devices = {value.device.index for value in values if isinstance(value, torch.Tensor) and value.device.type == NAME}
    target = kwargs.get("device")
    to_host = func in _TO_HOST or (
        func is _aten._to_copy.default and target is not None and torch.device(target).type != NAME
    ) or (func is _aten.copy_.default and args[0].device.type != NAME)
    if to_host:
        if not kwargs.get("non_blocking") and not (len(args) > 2 and args[2]):
            for index in devices:
                wait(index)
        return
    for index in devices:
        _launch(index)
