"""Run an exercise's check on every device the course grades on.

Exercises are graded on a *device matrix*: the CPU always, every CUDA device
when the machine has some, and, on a machine without a GPU, stand-ins for a
second device so that device logic is still checked:

* ``meta``: a real second device that holds shapes and dtypes but no values.
  Modules move to it and forward passes run, so it catches code that forgets
  to move a parameter, a buffer or a batch tensor. Mixing it with ``cpu`` in
  an elementwise op raises a real ``RuntimeError``.
* ``cuda:0`` and ``cuda:1`` under ``FakeTensorMode``: tensors that report a
  CUDA device on a machine without one. Mixing devices raises CUDA's own
  ``Expected all tensors to be on the same device`` message. They stand in
  for tensor-level code only: ``Module.to('cuda:...')`` fails inside the
  mode, and autograd on a fake CUDA tensor that requires grad kills the
  process, so module checks never use them.

Stand-ins carry no values: a check compares values only where
:func:`has_values` says there are some (see :func:`assert_tensor`).

Introduced in 01_device_placement.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, ContextManager, Iterator, Literal
from unittest import mock

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

Kind = Literal["tensor", "module"]

_KINDS = ("tensor", "module")


@dataclass(frozen=True)
class GradingDevice:
    """One entry of the device matrix.

    ``stand_in`` is ``""`` for a device this machine really has, ``"meta"``
    for the meta device and ``"fake"`` for a ``FakeTensorMode`` CUDA device.
    """

    device: torch.device
    stand_in: str = ""

    @property
    def real(self) -> bool:
        """True when tensors on this device hold real values on this machine."""
        return not self.stand_in

    def activate(self) -> ContextManager[object]:
        """The context a check must run in: ``FakeTensorMode`` for fake devices."""
        if self.stand_in == "fake":
            return FakeTensorMode(allow_non_fake_inputs=True)
        return contextlib.nullcontext()

    def __str__(self) -> str:
        if self.stand_in == "fake":
            return f"{self.device} (FakeTensorMode stand-in: no GPU on this machine)"
        if self.stand_in == "meta":
            return f"{self.device} (stand-in second device: no GPU on this machine)"
        return str(self.device)


def device_matrix(kind: Kind = "tensor") -> list[GradingDevice]:
    """The devices a check of this ``kind`` runs on, CPU first.

    ``kind="tensor"`` is for code that takes and returns tensors;
    ``kind="module"`` for code that moves or runs ``nn.Module`` objects.

    On a CPU-only machine: ``[cpu, meta, cuda:0 (fake), cuda:1 (fake)]`` for
    tensors and ``[cpu, meta]`` for modules. With CUDA: ``cpu`` and every
    ``cuda:N`` for both kinds, all real.
    """
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {_KINDS}, not {kind!r}")
    devices = [GradingDevice(torch.device("cpu"))]
    if torch.cuda.is_available():
        devices += [GradingDevice(torch.device("cuda", i)) for i in range(torch.cuda.device_count())]
        return devices
    devices.append(GradingDevice(torch.device("meta"), stand_in="meta"))
    if kind == "tensor":
        devices += [GradingDevice(torch.device("cuda", i), stand_in="fake") for i in (0, 1)]
    return devices


def check_on_devices(check: Callable[[torch.device], object], kind: Kind = "tensor") -> list[GradingDevice]:
    """Call ``check(device)`` once for each device of the matrix.

    The first failure is raised as an ``AssertionError`` whose message names
    the check and the device it failed on, with the original error chained.
    Returns the devices that were checked, so a caller can report them.
    On a CPU-only machine the stand-ins of :func:`device_matrix` are used.
    """
    checked = []
    for entry in device_matrix(kind):
        try:
            with entry.activate():
                check(entry.device)
        except Exception as exc:  # any failure of student code is a failed check
            name = getattr(check, "__name__", repr(check))
            raise AssertionError(f"{name} failed on {entry}: {type(exc).__name__}: {exc}") from exc
        checked.append(entry)
    return checked


def has_values(tensor: torch.Tensor) -> bool:
    """False for tensors on a stand-in device (meta or fake), True otherwise."""
    return not (tensor.is_meta or isinstance(tensor, FakeTensor))


def assert_tensor(actual: object, expected: torch.Tensor, device: torch.device | str | None = None) -> None:
    """Assert that ``actual`` is a tensor like ``expected`` on ``device``.

    Checks type, device (``expected.device`` when ``device`` is None), dtype
    and shape; values too, exactly, when both tensors have them (not on a
    stand-in device).
    """
    assert isinstance(actual, torch.Tensor), f"expected a tensor, got {type(actual).__name__}"
    want = torch.device(device) if device is not None else expected.device
    assert actual.device == want, f"tensor is on {actual.device}, expected {want}"
    assert actual.dtype == expected.dtype, f"tensor has dtype {actual.dtype}, expected {expected.dtype}"
    assert actual.shape == expected.shape, f"tensor has shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
    if has_values(actual) and has_values(expected):
        assert torch.equal(actual.cpu(), expected.cpu()), "tensor values differ from the expected ones"


@contextlib.contextmanager
def simulated_cuda(count: int, name: str = "Simulated GPU") -> Iterator[None]:
    """Make ``torch.cuda`` report ``count`` devices, for code that discovers devices.

    Inside the block ``torch.cuda.is_available()``, ``device_count()``,
    ``current_device()`` and ``get_device_name(i)`` answer as a machine with
    ``count`` GPUs named ``"{name} {i}"`` would. Nothing else is simulated:
    tensors cannot be created on these devices (use ``FakeTensorMode`` for
    that). Works the same on a CPU-only machine and on a GPU machine.

    Introduced in 00_environment.
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, not {count}")

    def device_name(device: object = None) -> str:
        index = _index_of(device)
        if not 0 <= index < count:
            raise RuntimeError(f"invalid device id {index}: {count} simulated CUDA devices")
        return f"{name} {index}"

    with contextlib.ExitStack() as stack:
        patch = stack.enter_context
        patch(mock.patch.object(torch.cuda, "is_available", lambda: count > 0))
        patch(mock.patch.object(torch.cuda, "device_count", lambda: count))
        patch(mock.patch.object(torch.cuda, "current_device", lambda: 0))
        patch(mock.patch.object(torch.cuda, "get_device_name", device_name))
        yield


@contextlib.contextmanager
def recorded_autocast() -> Iterator[list[tuple[str, torch.dtype | None, bool]]]:
    """Record every ``torch.autocast(...)`` made in the block, and stand in for device types without autocast.

    Yields a list that fills with ``(device_type, dtype, enabled)`` for each
    autocast the code under test asks for. For a device type that has
    autocast (``cpu``, ``cuda``) the real autocast runs as usual; for one that
    has none, such as ``meta`` (where ``torch.autocast`` raises even with
    ``enabled=False``), nothing is cast and nothing raises, so a check can
    still see which device type and dtype the code asked for. Works the same
    on a CPU-only machine and on a GPU machine.

    Introduced in 06_mixed_precision.
    """
    calls: list[tuple[str, torch.dtype | None, bool]] = []
    cls = torch.amp.autocast_mode.autocast
    real_init, real_enter, real_exit = cls.__init__, cls.__enter__, cls.__exit__

    def init(self, device_type, dtype=None, enabled=True, cache_enabled=None):
        calls.append((device_type, dtype, enabled))
        self.recorded_only = not torch.amp.is_autocast_available(device_type)
        if not self.recorded_only:
            real_init(self, device_type, dtype, enabled, cache_enabled)

    def enter(self):
        return None if self.recorded_only else real_enter(self)

    def exit_(self, *exc):
        return False if self.recorded_only else real_exit(self, *exc)

    with mock.patch.multiple(cls, __init__=init, __enter__=enter, __exit__=exit_):
        yield calls


def _index_of(device: object) -> int:
    if device is None:
        return 0
    if isinstance(device, int):
        return device
    parsed = torch.device(device)
    return 0 if parsed.index is None else parsed.index
