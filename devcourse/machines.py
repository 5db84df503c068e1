"""The machines students run the course on, as data: what PyTorch reports there and how a check
stands for each.

The device matrix (:mod:`devcourse.grading`) runs a check on this machine's devices, and on the
machines of :data:`MACHINES` that an exercise's hidden checks name where its behaviour differs
between them: a laptop with no accelerator, a box with two GPUs whose generators have drawn apart, a
Mac, a Mac whose MPS cannot run. Each is stood for on any machine by :mod:`devcourse.stand_ins`;
:func:`Machine.can_stand_here` says where it cannot.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Callable, ContextManager, Iterator

import torch

import simdevice
from devcourse.stand_ins import (
    NO_ACCELERATOR,
    SIMULATED_COUNT,
    replaced,
    simulated_cuda,
    simulated_devices,
    simulated_mps,
)

# c10/core/GeneratorImpl.h's default_rng_seed_val, every CUDA generator's seed
CUDA_DEFAULT_SEED = 67280421310721


@dataclass(frozen=True)
class Machine:
    """One machine a check can run on.

    ``accelerator`` is the device type ``torch.accelerator`` names there (None: none), ``devices``
    how many of its devices are usable, ``float64`` whether they hold float64. ``values_on`` is
    where a check's tensors for it live on this machine: ``"cpu"``, or ``"sim"`` for the simulated
    device (its GPU's values). ``stand_in`` makes PyTorch answer as that machine for a block;
    ``needs_simulated_device`` says it needs the simulated device turned on, which is never done
    beside CUDA.
    """

    name: str
    title: str
    accelerator: str | None
    devices: int
    float64: bool = True
    values_on: str = "cpu"
    needs_simulated_device: bool = False
    stand_in: Callable[[], ContextManager[object]] = field(
        default=contextlib.nullcontext, compare=False, repr=False
    )
    label: str = "{device} of {title}"  # how feedback names a device of it

    def device(self) -> torch.device:
        """The device a check on this machine is handed: the CPU, or ``sim:0`` where its GPU's
        values live."""
        if self.values_on == "sim":
            return simulated_devices()[0]
        return torch.device("cpu")

    def can_stand_here(self) -> str:
        """ "" where this machine can be stood for here, else why not."""
        if self.needs_simulated_device and torch.cuda.is_available():
            return (
                f"{self.title}: stood for on the simulated device, which is not turned on beside"
                " CUDA"
            )
        return ""

    def describe(self, device: torch.device) -> str:
        """How feedback names ``device`` on this machine."""
        return self.label.format(device=device, title=self.title)


def _no_accelerator_to_pin(self, device=None):
    raise RuntimeError(NO_ACCELERATOR)


@contextlib.contextmanager
def _laptop() -> Iterator[None]:
    """No accelerator at all: the simulated device hidden, no CUDA, no MPS, nothing to pin memory
    for."""
    with contextlib.ExitStack() as stack:
        if simdevice.is_enabled():
            stack.enter_context(simdevice.shown_as_accelerator(False))
        stack.enter_context(simulated_cuda(0))
        stack.enter_context(simulated_mps(False))
        stack.enter_context(replaced(torch.Tensor, pin_memory=_no_accelerator_to_pin))
        yield


@contextlib.contextmanager
def _two_gpus() -> Iterator[None]:
    """Two CUDA GPUs whose generators have drawn different amounts (each GPU has one, seeded
    alike)."""
    with simulated_cuda(2):
        states = []
        # a Philox state: the seed, then the offset, both 64-bit little-endian
        for drawn in (4, 12):
            raw = CUDA_DEFAULT_SEED.to_bytes(8, "little") + drawn.to_bytes(8, "little")
            states.append(torch.tensor(list(raw), dtype=torch.uint8))
        torch.cuda.set_rng_state_all(states)
        yield


def _mac() -> ContextManager[object]:
    from devcourse.mac import simulated_mac

    return simulated_mac()


def _mac_without_mps() -> ContextManager[object]:
    return simulated_mps(available=False, built=True)


MACHINES: dict[str, Machine] = {
    m.name: m
    for m in (
        Machine("laptop", "a laptop without an accelerator", None, 0, stand_in=_laptop),
        Machine("two-gpus", "a machine with two CUDA GPUs", "cuda", 2, stand_in=_two_gpus),
        Machine(
            "mac",
            "a simulated Mac",
            "mps",
            1,
            float64=False,
            values_on="sim",
            needs_simulated_device=True,
            stand_in=_mac,
            label="mps:0 of {title} (its values on {device})",
        ),
        Machine(
            "mac-without-mps",
            "a Mac whose macOS cannot run MPS",
            "mps",
            0,
            stand_in=_mac_without_mps,
        ),
    )
}
# The simulated accelerator's devices in the matrix of a machine without CUDA: not named by checks,
# always there.
SIMULATED = Machine(
    "sim",
    "this machine with the simulated accelerator",
    simdevice.NAME,
    SIMULATED_COUNT,
    values_on="sim",
    needs_simulated_device=True,
    stand_in=lambda: simdevice.shown_as_accelerator(True),
    label="{device} (simulated device: real values in host memory)",
)


def machine(name: str) -> Machine:
    """The machine called ``name`` in :data:`MACHINES`; a clear error naming them all otherwise."""
    try:
        return MACHINES[name]
    except KeyError:
        raise ValueError(f"no machine {name!r}: the machines are {', '.join(MACHINES)}") from None
