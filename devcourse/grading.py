"""Run an exercise's check on every device the course grades on.

The *device matrix* (:func:`device_matrix`) is the CPU, then every ``cuda:N`` on a machine with CUDA, else the
simulated ``sim:0`` and ``sim:1`` (:mod:`devcourse.simdevice`), which hold real values, so checks compare values
on every device. The notebooks' checks call :func:`check_on_devices`.
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
NOT_CHECKED: list[str] = []  # checks that asked for a machine this one cannot stand for (check_on_devices)


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
        """The machine a check on this device runs on, as PyTorch and the course's helpers describe it.

        On a simulated device, ``torch.accelerator`` names the simulated accelerator (a machine that has it).
        On the CPU of a machine without CUDA, it names none, simulated device on or not (a CPU-only laptop).
        On a machine's own devices, nothing changes.
        """
        if self.stand_in == "sim":
            return simdevice.shown_as_accelerator(True)
        if self.stand_in == "mac":
            from devcourse.mac import simulated_mac

            return simulated_mac()
        if self.real and self.device.type == "cpu" and simdevice.is_enabled() and not torch.cuda.is_available():
            return simdevice.shown_as_accelerator(False)
        return contextlib.nullcontext()

    def __str__(self) -> str:
        if self.stand_in == "sim":
            return f"{self.device} (simulated device: real values in host memory)"
        if self.stand_in == "mac":
            return f"mps:0 of a simulated Mac (its values on {self.device})"
        return str(self.device)


def simulated_devices() -> list[torch.device]:
    """Two simulated devices, ``[sim:0, sim:1]``, turning the simulated accelerator on, hidden, if it is off.

    Hidden (:func:`devcourse.simdevice.show`): ``torch.accelerator`` keeps answering as on this machine,
    except in a check that runs on a simulated device (:meth:`GradingDevice.activate`). So turning it on
    for the device matrix, as the grader does before a student's first cell, changes nothing an answer
    sees elsewhere: ``torch.accelerator.current_accelerator()`` is ``None`` on a CPU-only machine, as on
    the student's laptop. A notebook that turns it on itself (``simdevice.enable()``,
    :func:`devcourse.devices.accelerator_or_simulated`) shows it, in a grading kernel as in the
    student's. If the process already turned it on with another count, its first two devices (or its
    only one) are used.
    """
    if not simdevice.is_enabled():
        simdevice.enable(SIMULATED_COUNT, shown=False)
    return simdevice.devices()[:SIMULATED_COUNT]


def device_matrix(kind: Kind = "tensor", mac: bool = False) -> list[GradingDevice]:
    """The devices a check of this ``kind`` runs on, CPU first; with ``mac=True``, a Mac's GPU last.

    ``kind="tensor"`` is for code that takes and returns tensors;
    ``kind="module"`` for code that moves or runs ``nn.Module`` objects.
    Both kinds get the same devices since the simulated device holds
    modules too; the kind stays in every test, so a future matrix can tell
    them apart again.

    On a CPU-only machine: ``[cpu, sim:0, sim:1]``. With N GPUs: ``cpu`` and
    every ``cuda:N``. ``mac=True`` adds, on a machine without CUDA, the GPU of
    a simulated Mac (:mod:`devcourse.mac`: MPS's device names, one device, no
    float64, MPS's out-of-memory errors; the check is handed ``sim:0``, where
    the Mac's values live): for exercises that resolve a device, load a
    checkpoint or handle running out of memory. A machine with CUDA cannot
    stand for a Mac (the simulated device that holds its values is not turned
    on beside CUDA): there :func:`not_checked_here` names it. The simulated devices are never added beside
    CUDA: a registered out-of-tree device becomes PyTorch's current accelerator, which would change what
    student code on a GPU machine sees.
    """
    if kind not in _KINDS:
        raise ValueError(f"kind must be one of {_KINDS}, not {kind!r}")
    devices = [GradingDevice(torch.device("cpu"))]
    if torch.cuda.is_available():
        return devices + [GradingDevice(torch.device("cuda", i)) for i in range(torch.cuda.device_count())]
    devices += [GradingDevice(d, stand_in="sim") for d in simulated_devices()]
    if mac:
        devices.append(GradingDevice(simulated_devices()[0], stand_in="mac"))
    return devices


def not_checked_here(mac: bool = False) -> list[str]:
    """The machines a check asks for (``mac=True``: a Mac) that this machine cannot stand for, each with why."""
    if mac and torch.cuda.is_available():
        return ["a Mac (MPS): its GPU is simulated on the simulated device, which is not turned on beside CUDA"]
    return []


def check_on_devices(check: Callable[[torch.device], object], kind: Kind = "tensor",
                     mac: bool = False) -> list[GradingDevice]:
    """Call ``check(device)`` once for each device of the matrix (``mac=True``: a simulated Mac's GPU too).

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
    for missing in not_checked_here(mac):
        NOT_CHECKED.append(f"{name}: not checked on {missing}")
        print(f"{name}: not checked on {missing}")
    for entry in device_matrix(kind, mac=mac):
        _run_check(check, name, entry)
        checked.append(entry)
    return checked


def _run_check(check: Callable[[torch.device], object], name: str, entry: GradingDevice) -> None:
    """``check(entry.device)`` on ``entry``'s machine; whatever the answer raises becomes an ``AssertionError`` that
    names the check, the device, and the exception's type and message.

    That includes exceptions that are not ``Exception``s (``SystemExit`` from a stray ``exit()``,
    ``GeneratorExit``, a class of the answer's own deriving from ``BaseException``) and messages that
    cannot be turned into text; only ``KeyboardInterrupt`` goes on as it is, since that is how a cell
    that runs too long is stopped.
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


def check_on_a_mac(check: Callable[[torch.device], object], kind: Kind = "tensor") -> list[GradingDevice]:
    """Call ``check(device)`` as on a Mac only: the last entry of ``device_matrix(kind, mac=True)``.

    For hidden tests that add a Mac to a check the visible test already ran on the rest of the matrix.
    Where this machine cannot stand for a Mac (:func:`not_checked_here`), a line says so and nothing
    runs. Returns the devices checked.
    """
    name = getattr(check, "__name__", repr(check))
    for missing in not_checked_here(mac=True):
        NOT_CHECKED.append(f"{name}: not checked on {missing}")
        print(f"{name}: not checked on {missing}")
        return []
    entry = device_matrix(kind, mac=True)[-1]
    _run_check(check, name, entry)
    return [entry]


def other_index(device: torch.device | str) -> torch.device | None:
    """Another device of ``device``'s type with another index, from the matrix (``sim:1`` for ``sim:0``,
    ``cuda:1`` for ``cuda:0`` on a machine with two GPUs), or None where the type has one device (the CPU).

    For checks of code that compares devices: ``sim:1`` is another device than ``sim:0``, though of
    the same type.
    """
    device = torch.device(device)
    same_type = [entry.device for entry in device_matrix() if entry.device.type == device.type]
    if len(same_type) < 2 or device not in same_type:
        return None
    return same_type[(same_type.index(device) + 1) % len(same_type)]


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
    ``count`` GPUs named ``"{name} {i}"`` would, and so do
    ``torch.accelerator`` (``current_accelerator()`` is ``cuda``,
    ``device_count()`` is ``count``), ``torch.get_device_module()`` and
    ``torch.backends.mps`` (no MPS beside CUDA GPUs); the simulated
    accelerator, if on, is hidden. With ``count=0``, ``torch.cuda`` says no
    GPU and the rest stays this machine's. The GPUs' random generators are
    simulated too (``get_rng_state``/``set_rng_state`` and their ``_all``
    forms: one state per GPU; an index past the last GPU raises
    ``IndexError``, as CUDA's tuple of generators does), so restoring the
    states of more GPUs than the machine has fails as on a real one; with
    no GPU, setting a state does nothing, as PyTorch queues it until CUDA
    starts. Nothing else is simulated:
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

    with contextlib.ExitStack() as stack:
        patch = stack.enter_context
        patch(_replaced(torch.cuda, is_available=lambda: count > 0))
        patch(_replaced(torch.cuda, device_count=lambda: count))
        patch(_replaced(torch.cuda, current_device=lambda: 0))
        patch(_replaced(torch.cuda, get_device_name=device_name))
        patch(_cuda_generators(count))
        if count > 0:  # a machine with CUDA GPUs: its accelerator is CUDA, and it is no Mac
            patch(_replaced(torch.backends.mps, is_available=lambda: False))
            patch(_replaced(torch.backends.mps, is_built=lambda: False))
            patch(_accelerator_of_machine("cuda", count))
        elif _machine_accelerator_type() == "cuda":  # a CUDA build that sees no GPU
            patch(_accelerator_of_machine("cuda", 0))
        else:
            patch(_accelerator_of_machine(_machine_accelerator_type(), _machine_device_count()))
        yield


@contextlib.contextmanager
def _cuda_generators(count: int) -> Iterator[None]:
    """The random states of ``count`` simulated GPUs (see :func:`simulated_cuda`)."""
    states = {index: torch.zeros(16, dtype=torch.uint8) for index in range(count)}  # CUDA's Philox state: 16 bytes

    def generator_index(device: object = "cuda") -> int:
        index = _index_of(device if not isinstance(device, str) or device != "cuda" else None)
        if not 0 <= index < count:  # torch.cuda.default_generators[index], a tuple of one per GPU
            raise IndexError("tuple index out of range")
        return index

    def get_rng_state(device: object = "cuda") -> torch.Tensor:
        return states[generator_index(device)].clone()

    def set_rng_state(new_state: torch.Tensor, device: object = "cuda") -> None:
        if count == 0:
            return  # PyTorch queues the call until CUDA starts, which it never does without a GPU
        states[generator_index(device)] = new_state.clone()

    def get_rng_state_all() -> list[torch.Tensor]:
        return [get_rng_state(index) for index in range(count)]

    def set_rng_state_all(new_states) -> None:
        for index, state in enumerate(new_states):
            set_rng_state(state, index)

    with contextlib.ExitStack() as stack:
        for module in (torch.cuda, torch.cuda.random):
            for name, function in (("get_rng_state", get_rng_state), ("set_rng_state", set_rng_state),
                                   ("get_rng_state_all", get_rng_state_all), ("set_rng_state_all", set_rng_state_all)):
                if count > 0 or name != "get_rng_state":  # without a GPU, PyTorch's own refuses
                    stack.enter_context(_replaced(module, **{name: function}))
        yield


@contextlib.contextmanager
def simulated_mps(available: bool = True, built: bool | None = None) -> Iterator[None]:
    """Make ``torch.backends.mps`` and ``torch.mps`` report an Apple-silicon GPU (or none), for code that discovers
    devices.

    Inside the block ``torch.backends.mps.is_available()``, ``torch.mps.is_available()`` and
    ``torch.mps.device_count()`` answer ``available`` (1 or 0), and ``torch.backends.mps.is_built()`` answers
    ``built`` (default: ``available``), as on a Mac with (or without) MPS; ``built=True, available=False`` is a Mac
    whose PyTorch has MPS and whose macOS cannot run it (CUDA absent too). With MPS, the
    rest of the machine is a Mac's too: ``torch.accelerator`` names ``mps``
    with one device, ``torch.cuda`` sees no GPU, the simulated accelerator,
    if on, is hidden, and ``best_device()`` gives ``mps:0``. Nothing else is simulated:
    tensors cannot be created on ``mps`` outside a Mac. Works the same on a
    CPU-only machine, a GPU machine and a Mac.

    Introduced in 00_environment.
    """
    with contextlib.ExitStack() as stack:
        patch = stack.enter_context
        built = available if built is None else built
        patch(_replaced(torch.backends.mps, is_available=lambda: available))
        patch(_replaced(torch.backends.mps, is_built=lambda: built))
        # torch.mps answers from its own module (is_available calls its device_count), not torch.backends.mps
        patch(_replaced(torch.mps, is_available=lambda: available, device_count=lambda: int(available)))
        if built:  # a Mac: MPS is its accelerator (one device, or none it can use), and it has no CUDA
            patch(_replaced(torch.cuda, is_available=lambda: False))
            patch(_replaced(torch.cuda, device_count=lambda: 0))
            patch(_accelerator_of_machine("mps", int(available)))
        elif _machine_accelerator_type() == "mps":  # a Mac whose MPS is unavailable (a macOS too old, say)
            patch(_accelerator_of_machine("mps", 0))
        else:
            patch(_accelerator_of_machine(_machine_accelerator_type(), _machine_device_count()))
        yield


def _machine_accelerator_type() -> str | None:
    """The device type of this machine's own accelerator as its build names it (cuda, xpu, mps), or None."""
    from devcourse.simdevice._accelerator import machine_accelerator

    found = machine_accelerator()
    return None if found is None else found.type


def _machine_device_count() -> int:
    kind = _machine_accelerator_type()
    if kind is None:
        return 0
    if kind == "mps":
        return int(torch.backends.mps.is_available())
    return getattr(torch, kind).device_count()


@contextlib.contextmanager
def _accelerator_of_machine(kind: str | None, count: int) -> Iterator[None]:
    """``torch.accelerator`` and ``torch.get_device_module()`` as on a machine whose accelerator is ``kind`` (None:
    none) with ``count`` usable devices; the simulated accelerator, if on, hidden, as the machine lacks it."""

    def current_accelerator(check_available: bool = False) -> torch.device | None:
        if kind is None or (check_available and count == 0):
            return None
        return torch.device(kind)

    def refuse_without_devices() -> None:
        if count == 0:
            raise RuntimeError("Cannot access accelerator device when none is available.")

    def current_device_index() -> int:
        refuse_without_devices()
        return 0

    real_module = torch.get_device_module

    def get_device_module(device=None):
        return real_module(device if device is not None else (kind or "cpu"))

    with contextlib.ExitStack() as stack:
        patch = stack.enter_context
        if simdevice.is_enabled():
            patch(simdevice.shown_as_accelerator(False))
        patch(_replaced(torch.accelerator, current_accelerator=current_accelerator))
        patch(_replaced(torch.accelerator, is_available=lambda: kind is not None and count > 0))
        patch(_replaced(torch.accelerator, device_count=lambda: count if kind is not None else 0))
        patch(_replaced(torch.accelerator, current_device_index=current_device_index))
        patch(_replaced(torch, get_device_module=get_device_module))
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
