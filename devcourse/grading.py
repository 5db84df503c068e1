"""Run an exercise's check on every device the course grades on.

The *device matrix* (:func:`device_matrix`) is the CPU, then every ``cuda:N`` on a machine with
CUDA, else the simulated ``sim:0`` and ``sim:1`` (:mod:`simdevice`), which hold real values, so
checks compare values on every device; then the machines of :mod:`devcourse.machines` a check names.
The notebooks' checks call :func:`check_on_devices`. Introduced in 01_device_placement.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, ContextManager, Iterator, Literal, Sequence

import torch
from torch._subclasses.fake_tensor import FakeTensor

import simdevice
from devcourse.machines import SIMULATED, Machine, machine
from devcourse.stand_ins import (
    SIMULATED_COUNT,
    replaced,
    simulated_cuda,
    simulated_devices,
    simulated_mps,
)

__all__ = [
    "SIMULATED_COUNT",
    "GradingDevice",
    "assert_tensor",
    "check_on_a_mac",
    "check_on_devices",
    "check_on_machine",
    "describe_exception",
    "device_matrix",
    "has_values",
    "is_plain_tensor",
    "not_checked_here",
    "other_index",
    "recorded_autocast",
    "simulated_cuda",
    "simulated_devices",
    "simulated_mps",
]

Kind = Literal["tensor", "module"]

_KINDS = ("tensor", "module")
# checks that asked for a machine this one cannot stand for (check_on_devices)
NOT_CHECKED: list[str] = []


@dataclass(frozen=True)
class GradingDevice:
    """One entry of the device matrix: a device, and the machine it belongs to (None: this machine,
    as it is)."""

    device: torch.device
    machine: Machine | None = None

    @property
    def stand_in(self) -> str:
        """The name of the machine stood for (``"sim"``, ``"mac"``, ...), ``""`` for this machine's
        own device."""
        return "" if self.machine is None else self.machine.name

    @property
    def real(self) -> bool:
        """True when this machine really has the device (not simulated)."""
        return self.machine is None

    def activate(self) -> ContextManager[object]:
        """The machine a check on this device runs on, as PyTorch and the course's helpers describe
        it.

        A stood-for machine answers as itself (:class:`devcourse.machines.Machine`). On the CPU of a
        machine without CUDA, ``torch.accelerator`` names none, simulated device on or not (a
        CPU-only laptop). On a machine's own devices, nothing changes.
        """
        if self.machine is not None:
            return self.machine.stand_in()
        if self.device.type == "cpu" and simdevice.is_enabled() and not torch.cuda.is_available():
            return simdevice.shown_as_accelerator(False)
        return contextlib.nullcontext()

    def __str__(self) -> str:
        return str(self.device) if self.machine is None else self.machine.describe(self.device)


def _named(machines: Sequence[str]) -> list[Machine]:
    """The machines a check names, each once, in order."""
    return [machine(name) for name in dict.fromkeys(machines)]


def device_matrix(kind: Kind = "tensor", machines: Sequence[str] = ()) -> list[GradingDevice]:
    """The devices a check of this ``kind`` runs on, CPU first, then those of the ``machines`` it
    names.

    ``kind="tensor"`` is for code that takes and returns tensors;
    ``kind="module"`` for code that moves or runs ``nn.Module`` objects.
    Both kinds get the same devices since the simulated device holds
    modules too; the kind stays in every test, so a future matrix can tell
    them apart again.

    On a CPU-only machine: ``[cpu, sim:0, sim:1]``. With N GPUs: ``cpu`` and every ``cuda:N``.
    ``machines`` adds one entry per machine of :data:`devcourse.machines.MACHINES` (``"laptop"``,
    ``"two-gpus"``, ``"mac"``, ``"mac-without-mps"``), where this machine
    can stand for it: a simulated Mac (:mod:`devcourse.mac`: MPS's device names, one device, no
    float64, MPS's out-of-memory errors) is handed ``sim:0``, where its values live, the others the
    CPU. A machine with CUDA cannot stand for a Mac (the simulated device that holds its values is
    not turned on beside CUDA): there :func:`not_checked_here` names it. The simulated devices are
    never added beside CUDA: a registered out-of-tree device becomes PyTorch's current accelerator,
    which would change what student code on a GPU machine sees.
    """
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {_KINDS}, not {kind!r}")
    named = _named(machines)
    devices = [GradingDevice(torch.device("cpu"))]
    if torch.cuda.is_available():
        devices += [
            GradingDevice(torch.device("cuda", i)) for i in range(torch.cuda.device_count())
        ]
    else:
        devices += [GradingDevice(d, SIMULATED) for d in simulated_devices()]
    return devices + [GradingDevice(m.device(), m) for m in named if not m.can_stand_here()]


def not_checked_here(machines: Sequence[str] = ()) -> list[str]:
    """The machines a check names that this machine cannot stand for, each with why."""
    return [why for why in (m.can_stand_here() for m in _named(machines)) if why]


def check_on_devices(
    check: Callable[[torch.device], object],
    kind: Kind = "tensor",
    machines: Sequence[str] = (),
) -> list[GradingDevice]:
    """Call ``check(device)`` once for each device of the matrix, with the ``machines`` it names.

    The first failure is raised as an ``AssertionError`` whose message names
    the check and the device it failed on, with the original error chained.
    Returns the devices that were checked, so a caller can report them.
    On a CPU-only machine the simulated devices of :func:`device_matrix`
    are used. A machine the check asks for that this one cannot stand for is
    not passed over in silence: a line says so in the cell's output, and
    :data:`NOT_CHECKED` keeps it for whoever reports the grading.
    """
    checked = []
    name = getattr(check, "__name__", repr(check))
    _say_not_checked(name, not_checked_here(machines))
    for entry in device_matrix(kind, machines=machines):
        _run_check(check, name, entry)
        checked.append(entry)
    return checked


def _say_not_checked(name: str, missing: list[str]) -> None:
    for why in missing:
        NOT_CHECKED.append(f"{name}: not checked on {why}")
        print(f"{name}: not checked on {why}")


def _run_check(check: Callable[[torch.device], object], name: str, entry: GradingDevice) -> None:
    """``check(entry.device)`` on ``entry``'s machine; whatever the answer raises becomes an
    ``AssertionError`` that names the check, the device, and the exception's type and message.

    That includes exceptions that are not ``Exception``s (``SystemExit`` from a stray ``exit()``,
    ``GeneratorExit``, a class of the answer's own deriving from ``BaseException``) and messages
    that cannot be turned into text; only ``KeyboardInterrupt`` goes on as it is, since that is how
    a cell that runs too long is stopped.
    """
    try:
        with entry.activate():
            check(entry.device)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - any failure of student code is a failed check, never the grader's
        raise AssertionError(f"{name} failed on {entry}: {describe_exception(exc)}") from exc


def describe_exception(exc: BaseException) -> str:
    """``Type: message`` for feedback, also for an exception whose ``str()`` itself raises."""
    try:
        message = str(exc)
    except Exception as broken:  # noqa: BLE001 - an answer's exception class can break anything
        message = f"(its message could not be shown: {type(broken).__name__})"
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def check_on_machine(
    name: str, check: Callable[[torch.device], object], kind: Kind = "tensor"
) -> list[GradingDevice]:
    """Call ``check(device)`` on machine ``name`` of :data:`devcourse.machines.MACHINES` only.

    For hidden tests that add a machine to a check the visible test already ran on the rest of the
    matrix. Where this machine cannot stand for it (:func:`not_checked_here`), a line says so and
    nothing runs. Returns the devices checked.
    """
    label = getattr(check, "__name__", repr(check))
    missing = not_checked_here(machines=(name,))
    _say_not_checked(label, missing)
    if missing:
        return []
    entry = device_matrix(kind, machines=(name,))[-1]
    _run_check(check, label, entry)
    return [entry]


def check_on_a_mac(
    check: Callable[[torch.device], object], kind: Kind = "tensor"
) -> list[GradingDevice]:
    """Call ``check(device)`` as on a Mac only: :func:`check_on_machine` with ``"mac"``."""
    return check_on_machine("mac", check, kind)


def other_index(device: torch.device | str) -> torch.device | None:
    """Another device of ``device``'s type with another index, from the matrix (``sim:1`` for
    ``sim:0``, ``cuda:1`` for ``cuda:0`` on a machine with two GPUs), or None where the type has one
    device (the CPU).

    For checks of code that compares devices: ``sim:1`` is another device than ``sim:0``, though of
    the same type.
    """
    device = torch.device(device)
    same_type = [entry.device for entry in device_matrix() if entry.device.type == device.type]
    if len(same_type) < 2 or device not in same_type:
        return None
    return same_type[(same_type.index(device) + 1) % len(same_type)]


def has_values(tensor: torch.Tensor) -> bool:
    """False for tensors without values (on ``meta``, or fake under ``FakeTensorMode``), True
    otherwise.

    Tensors on the simulated device have values.
    """
    return not (tensor.is_meta or isinstance(tensor, FakeTensor))


def is_plain_tensor(value: object) -> bool:
    """True for a tensor of PyTorch's own types (``Tensor``, ``nn.Parameter``) or the simulated
    device's.

    A test that demands "a tensor, not a subclass" asks this instead of
    ``type(value) is torch.Tensor``, which a correct answer on ``sim:N``
    would fail (its tensors are :class:`simdevice.SimTensor`).
    Any other subclass is refused: it can override what a comparison says.
    """
    return type(value) in (torch.Tensor, torch.nn.Parameter, simdevice.SimTensor)


def assert_tensor(
    actual: object, expected: torch.Tensor, device: torch.device | str | None = None
) -> None:
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
    assert is_plain_tensor(actual), (
        f"expected a torch.Tensor, got a subclass: {type(actual).__name__}"
    )
    with torch._C.DisableTorchFunction():
        want = torch.device(device) if device is not None else expected.device
        assert actual.device == want, f"tensor is on {actual.device}, expected {want}"
        assert actual.dtype == expected.dtype, (
            f"tensor has dtype {actual.dtype}, expected {expected.dtype}"
        )
        assert actual.shape == expected.shape, (
            f"tensor has shape {tuple(actual.shape)}, expected {tuple(expected.shape)}"
        )
        if has_values(actual) and has_values(expected):
            assert torch.equal(actual.cpu(), expected.cpu()), (
                "tensor values differ from the expected ones"
            )


@contextlib.contextmanager
def recorded_autocast() -> Iterator[list[tuple[str, torch.dtype | None, bool]]]:
    """Record every ``torch.autocast(...)`` made in the block, and stand in for device types without
    autocast.

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

    with replaced(cls, __init__=init, __enter__=enter, __exit__=exit_):
        yield calls
