"""Other machines as PyTorch reports them, for checks on any machine: their GPUs, a Mac's MPS, no
accelerator.

Each context manager here makes ``torch.cuda``, ``torch.mps``, ``torch.backends.mps`` and
``torch.accelerator`` answer as another machine would (:func:`simulated_cuda`,
:func:`simulated_mps`); :func:`simulated_devices` turns on the simulated accelerator that holds a
stand-in's values. :mod:`devcourse.machines` names the machines built from them. Introduced in
00_environment.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

import torch

import simdevice

SIMULATED_COUNT = 2
# PyTorch's words, without one
NO_ACCELERATOR = "Cannot access accelerator device when none is available."


def simulated_devices() -> list[torch.device]:
    """Two simulated devices, ``[sim:0, sim:1]``, turning the simulated accelerator on, hidden, if
    it is off.

    Hidden (:func:`simdevice.show`): ``torch.accelerator`` keeps answering as on this machine,
    except in a check that runs on a simulated device (:meth:`GradingDevice.activate`). So turning
    it on for the device matrix, as the grader does before a student's first cell, changes nothing
    an answer sees elsewhere: ``torch.accelerator.current_accelerator()`` is ``None`` on a CPU-only
    machine, as on the student's laptop. A notebook that turns it on itself (``simdevice.enable()``,
    :func:`devcourse.devices.accelerator_or_simulated`) shows it, in a grading kernel as in the
    student's. If the process already turned it on with another count, its first two devices (or its
    only one) are used.
    """
    if not simdevice.is_enabled():
        simdevice.enable(SIMULATED_COUNT, shown=False)
    return simdevice.devices()[:SIMULATED_COUNT]


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
    :mod:`simdevice`, holds tensors). Works the same on a CPU-only machine and on a GPU machine.

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
        patch(replaced(torch.cuda, is_available=lambda: count > 0))
        patch(replaced(torch.cuda, device_count=lambda: count))
        patch(replaced(torch.cuda, current_device=lambda: 0))
        patch(replaced(torch.cuda, get_device_name=device_name))
        patch(_cuda_generators(count))
        if count > 0:  # a machine with CUDA GPUs: its accelerator is CUDA, and it is no Mac
            patch(replaced(torch.backends.mps, is_available=lambda: False))
            patch(replaced(torch.backends.mps, is_built=lambda: False))
            patch(_accelerator_of_machine("cuda", count))
        elif _machine_accelerator_type() == "cuda":  # a CUDA build that sees no GPU
            patch(_accelerator_of_machine("cuda", 0))
        else:
            patch(_accelerator_of_machine(_machine_accelerator_type(), _machine_device_count()))
        yield


@contextlib.contextmanager
def _cuda_generators(count: int) -> Iterator[None]:
    """The random states of ``count`` simulated GPUs (see :func:`simulated_cuda`)."""
    # CUDA's Philox state: 16 bytes
    states = {index: torch.zeros(16, dtype=torch.uint8) for index in range(count)}

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
            for name, function in (
                ("get_rng_state", get_rng_state),
                ("set_rng_state", set_rng_state),
                ("get_rng_state_all", get_rng_state_all),
                ("set_rng_state_all", set_rng_state_all),
            ):
                if count > 0 or name != "get_rng_state":  # without a GPU, PyTorch's own refuses
                    stack.enter_context(replaced(module, **{name: function}))
        yield


@contextlib.contextmanager
def simulated_mps(available: bool = True, built: bool | None = None) -> Iterator[None]:
    """Make ``torch.backends.mps`` and ``torch.mps`` report an Apple-silicon GPU (or none), for code
    that discovers devices.

    Inside the block ``torch.backends.mps.is_available()``, ``torch.mps.is_available()`` and
    ``torch.mps.device_count()`` answer ``available`` (1 or 0), and
    ``torch.backends.mps.is_built()`` answers ``built`` (default: ``available``), as on a Mac with
    (or without) MPS; ``built=True, available=False`` is a Mac whose PyTorch has MPS and whose macOS
    cannot run it (CUDA absent too). With MPS, the rest of the machine is a Mac's too:
    ``torch.accelerator`` names ``mps`` with one device, ``torch.cuda`` sees no GPU, the simulated
    accelerator, if on, is hidden, and ``best_device()`` gives ``mps:0``. Nothing else is simulated:
    tensors cannot be created on ``mps`` outside a Mac. Works the same on a CPU-only machine, a GPU
    machine and a Mac.

    Introduced in 00_environment.
    """
    with contextlib.ExitStack() as stack:
        patch = stack.enter_context
        built = available if built is None else built
        patch(replaced(torch.backends.mps, is_available=lambda: available))
        patch(replaced(torch.backends.mps, is_built=lambda: built))
        # torch.mps answers from its own module (is_available calls its device_count), not
        # torch.backends.mps
        patch(
            replaced(torch.mps, is_available=lambda: available, device_count=lambda: int(available))
        )
        # a Mac: MPS is its accelerator (one device, or none it can use), and it has no CUDA
        if built:
            patch(replaced(torch.cuda, is_available=lambda: False))
            patch(replaced(torch.cuda, device_count=lambda: 0))
            patch(_accelerator_of_machine("mps", int(available)))
        elif _machine_accelerator_type() == "mps":
            # a Mac whose MPS is unavailable (a macOS too old, say)
            patch(_accelerator_of_machine("mps", 0))
        else:
            patch(_accelerator_of_machine(_machine_accelerator_type(), _machine_device_count()))
        yield


def _machine_accelerator_type() -> str | None:
    """The device type of this machine's own accelerator as its build names it (cuda, xpu, mps), or
    None."""
    from simdevice._accelerator import machine_accelerator

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
    """``torch.accelerator`` and ``torch.get_device_module()`` as on a machine whose accelerator is
    ``kind`` (None: none) with ``count`` usable devices; the simulated accelerator, if on, hidden,
    as the machine lacks it."""

    def current_accelerator(check_available: bool = False) -> torch.device | None:
        if kind is None or (check_available and count == 0):
            return None
        return torch.device(kind)

    def refuse_without_devices() -> None:
        if count == 0:
            raise RuntimeError(NO_ACCELERATOR)

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
        patch(replaced(torch.accelerator, current_accelerator=current_accelerator))
        patch(replaced(torch.accelerator, is_available=lambda: kind is not None and count > 0))
        patch(replaced(torch.accelerator, device_count=lambda: count if kind is not None else 0))
        patch(replaced(torch.accelerator, current_device_index=current_device_index))
        patch(replaced(torch, get_device_module=get_device_module))
        yield


@contextlib.contextmanager
def replaced(owner: object, **attributes) -> Iterator[None]:
    """``owner``'s ``attributes`` replaced for the block, then put back as they were. torch has no
    seam for reporting another machine's devices, so the simulated machines stand in for its
    functions, as a test double."""
    missing = object()
    saved = {name: vars(owner).get(name, missing) for name in attributes}
    for name, value in attributes.items():
        setattr(owner, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            # it was inherited: the owner's own goes, the inherited one shows again
            if value is missing:
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
