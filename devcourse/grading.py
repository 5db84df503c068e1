"""Run an exercise's check on every device the course grades on.

Exercises are graded on a *device matrix*: the CPU always, then

* on a machine with CUDA: every ``cuda:N``. The simulated devices are not
  added there: a registered out-of-tree device becomes PyTorch's current
  accelerator (``torch.accelerator``), CUDA or not, which would change what
  student code on a GPU machine sees;
* on a machine without CUDA: ``sim:0`` and ``sim:1``, the simulated
  accelerator of :mod:`devcourse.simdevice`, which the matrix turns on
  (explicitly, the first time it is asked for). Its tensors hold real
  values, modules train on it, and mixing it with the CPU raises PyTorch's
  own same-device errors where CUDA raises them, so checks compare values
  on every device of the matrix.

``meta`` and ``FakeTensorMode`` CUDA devices are no longer in the matrix:
everything they caught, the simulated device catches with values, and they
rejected correct answers for reasons of their own (no values on ``meta``,
indexing and ``Module.to`` failing under ``FakeTensorMode``). The one thing
a device named ``cuda`` shows that ``sim`` cannot is code that branches on
``device.type == "cuda"``; such code is not what the course teaches (it asks
the device, see ``devcourse.devices``), and hard-coded ``"cuda"`` strings fail
on the simulated devices, as they should on a machine without CUDA. Lessons
still use ``meta`` where it is the lesson (building a model without memory).

Introduced in 01_device_placement.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, ContextManager, Iterator, Literal

import torch
from torch._subclasses.fake_tensor import FakeTensor

from devcourse import simdevice

Kind = Literal["tensor", "module"]

_KINDS = ("tensor", "module")
SIMULATED_COUNT = 2


@dataclass(frozen=True)
class GradingDevice:
    """One entry of the device matrix.

    ``stand_in`` is ``""`` for a device this machine really has and
    ``"sim"`` for a device of the simulated accelerator.
    """

    device: torch.device
    stand_in: str = ""

    @property
    def real(self) -> bool:
        """True when this machine really has the device (not simulated)."""
        return not self.stand_in

    def activate(self) -> ContextManager[object]:
        """The context a check runs in (nothing special on any device of today's matrix)."""
        return contextlib.nullcontext()

    def __str__(self) -> str:
        if self.stand_in == "sim":
            return f"{self.device} (simulated device: real values in host memory)"
        return str(self.device)


def simulated_devices() -> list[torch.device]:
    """Two simulated devices, ``[sim:0, sim:1]``, turning the simulated accelerator on if it is off.

    If the process already turned it on with another count, its first two
    devices (or its only one) are used.
    """
    if not simdevice.is_enabled():
        simdevice.enable(SIMULATED_COUNT)
    return simdevice.devices()[:SIMULATED_COUNT]


def device_matrix(kind: Kind = "tensor") -> list[GradingDevice]:
    """The devices a check of this ``kind`` runs on, CPU first.

    ``kind="tensor"`` is for code that takes and returns tensors;
    ``kind="module"`` for code that moves or runs ``nn.Module`` objects.
    Both kinds get the same devices since the simulated device holds
    modules too; the kind stays in every test, so a future matrix can tell
    them apart again.

    On a CPU-only machine: ``[cpu, sim:0, sim:1]``. With N GPUs: ``cpu`` and
    every ``cuda:N``.
    """
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {_KINDS}, not {kind!r}")
    devices = [GradingDevice(torch.device("cpu"))]
    if torch.cuda.is_available():
        return devices + [GradingDevice(torch.device("cuda", i)) for i in range(torch.cuda.device_count())]
    return devices + [GradingDevice(d, stand_in="sim") for d in simulated_devices()]


def check_on_devices(check: Callable[[torch.device], object], kind: Kind = "tensor") -> list[GradingDevice]:
    """Call ``check(device)`` once for each device of the matrix.

    The first failure is raised as an ``AssertionError`` whose message names
    the check and the device it failed on, with the original error chained.
    Returns the devices that were checked, so a caller can report them.
    On a CPU-only machine the simulated devices of :func:`device_matrix`
    are used.
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
    """False for tensors without values (on ``meta``, or fake under ``FakeTensorMode``), True otherwise.

    Tensors on the simulated device have values.
    """
    return not (tensor.is_meta or isinstance(tensor, FakeTensor))


def is_plain_tensor(value: object) -> bool:
    """True for a tensor of PyTorch's own types (``Tensor``, ``nn.Parameter``) or the simulated device's.

    A test that demands "a tensor, not a subclass" asks this instead of
    ``type(value) is torch.Tensor``, which a correct answer on ``sim:N``
    would fail (its tensors are :class:`devcourse.simdevice.SimTensor`).
    Any other subclass is refused: it can override what a comparison says.
    """
    return type(value) in (torch.Tensor, torch.nn.Parameter, simdevice.SimTensor)


def assert_tensor(actual: object, expected: torch.Tensor, device: torch.device | str | None = None) -> None:
    """Assert that ``actual`` is a tensor like ``expected`` on ``device``.

    Checks type, device (``expected.device`` when ``device`` is None), dtype
    and shape; values too, exactly, when both tensors have them (every
    device of the matrix has them; ``meta`` tensors do not). The type must be
    PyTorch's own (or the simulated device's, see :func:`is_plain_tensor`):
    a subclass could answer every question above as asked, so it is refused
    before any is asked, and values are compared with torch-function
    overrides switched off.
    """
    assert isinstance(actual, torch.Tensor), f"expected a tensor, got {type(actual).__name__}"
    assert is_plain_tensor(actual), f"expected a torch.Tensor, got a subclass: {type(actual).__name__}"
    with torch._C.DisableTorchFunction():
        want = torch.device(device) if device is not None else expected.device
        assert actual.device == want, f"tensor is on {actual.device}, expected {want}"
        assert actual.dtype == expected.dtype, f"tensor has dtype {actual.dtype}, expected {expected.dtype}"
        assert actual.shape == expected.shape, (f"tensor has shape {tuple(actual.shape)}, "
                                                f"expected {tuple(expected.shape)}")
        if has_values(actual) and has_values(expected):
            assert torch.equal(actual.cpu(), expected.cpu()), "tensor values differ from the expected ones"


@contextlib.contextmanager
def simulated_cuda(count: int, name: str = "Simulated GPU") -> Iterator[None]:
    """Make ``torch.cuda`` report ``count`` devices, for code that discovers devices.

    Inside the block ``torch.cuda.is_available()``, ``device_count()``,
    ``current_device()`` and ``get_device_name(i)`` answer as a machine with
    ``count`` GPUs named ``"{name} {i}"`` would. Nothing else is simulated:
    tensors cannot be created on these devices (the simulated accelerator,
    :mod:`devcourse.simdevice`, holds tensors). Works the same on a CPU-only machine and on a GPU machine.

    Introduced in 00_environment.
    """
    if count < 0:
        raise ValueError(f"count must be >= 0, not {count}")

    def device_name(device: object = None) -> str:
        index = _index_of(device)
        if not 0 <= index < count:
            raise RuntimeError(f"invalid device id {index}: {count} simulated CUDA devices")
        return f"{name} {index}"

    with _replaced(torch.cuda, is_available=lambda: count > 0, device_count=lambda: count,
                   current_device=lambda: 0, get_device_name=device_name):
        yield


@contextlib.contextmanager
def simulated_mps(available: bool = True) -> Iterator[None]:
    """Make ``torch.backends.mps`` report an Apple-silicon GPU (or none), for code that discovers devices.

    Inside the block ``torch.backends.mps.is_available()`` and ``is_built()``
    answer ``available``, as on a Mac with (or without) MPS; ``best_device()``
    then gives ``mps:0`` on a machine without CUDA. Nothing else is simulated:
    tensors cannot be created on ``mps`` outside a Mac. Works the same on a
    CPU-only machine, a GPU machine and a Mac.

    Introduced in 00_environment.
    """
    with _replaced(torch.backends.mps, is_available=lambda: available, is_built=lambda: available):
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

    with _replaced(cls, __init__=init, __enter__=enter, __exit__=exit_):
        yield calls


@contextlib.contextmanager
def _replaced(owner: object, **attributes) -> Iterator[None]:
    """``owner``'s ``attributes`` replaced for the block, then put back as they were. torch has no seam for
    reporting another machine's devices, so the simulated machines stand in for its functions, as a test double."""
    missing = object()
    saved = {name: vars(owner).get(name, missing) for name in attributes}
    for name, value in attributes.items():
        setattr(owner, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is missing:  # it was inherited: the owner's own goes, the inherited one shows again
                delattr(owner, name)
            else:
                setattr(owner, name, value)


def _index_of(device: object) -> int:
    if device is None:
        return 0
    if isinstance(device, int):
        return device
    parsed = torch.device(device)
    return 0 if parsed.index is None else parsed.index
