"""Checks that some operators make of their own on CUDA, which the simulated device makes the same
way.

:func:`simdevice._devicecheck.check_devices` calls :func:`own_checks` before its same-device rules;
each check names the PyTorch source it follows. On a CPU-only machine without the simulated device
nothing calls it.
"""

from __future__ import annotations

import functools

import torch

from simdevice._state import NAME

# The operators with checks here (the random ones take their generator by keyword, so never the fast
# path).
NAMES = frozenset(
    {"index", "_unsafe_index", "masked_fill", "masked_fill_", "_pack_padded_sequence"}
)


@functools.cache
def _generator_position(func) -> int | None:
    """Where an operator's schema takes ``generator``, or None: read once per operator."""
    return next(
        (i for i, argument in enumerate(func._schema.arguments) if argument.name == "generator"),
        None,
    )


def _generator(func, args: tuple, kwargs: dict):
    """The ``generator=`` a random operator was given, or None."""
    if "generator" in kwargs:
        return kwargs["generator"]
    position = _generator_position(func)
    return args[position] if position is not None and position < len(args) else None


def own_checks(name: str, func, args: tuple, kwargs: dict) -> None:
    """The checks of their own that some operators make on CUDA, before any same-device check."""
    # index's meta function, for every device type (CUDA's too)
    if name in ("index", "_unsafe_index"):
        self, indices = args[0], args[1]
        if any(
            i is not None and i.device.type != "cpu" and i.device != self.device for i in indices
        ):
            raise RuntimeError(
                "indices should be either on cpu or on the same device as the indexed tensor "
                f"({self.device})"
            )
    if name in ("masked_fill", "masked_fill_") and args[1].device != args[0].device:
        # masked_fill__cuda (aten/src/ATen/native/cuda/Indexing.cu): one device, a 0-dim CPU mask
        # included; it is the kernel a CPU self with a device mask dispatches to as well
        raise RuntimeError(
            f"expected self and mask to be on the same device, but got mask on {args[1].device} "
            f"and self on {args[0].device}"
        )
    # checkLongTensor (aten/src/ATen/native/PackedSequence.cpp), every device
    if name == "_pack_padded_sequence":
        lengths = args[1]
        if lengths.dim() != 1 or lengths.device.type != "cpu" or lengths.dtype != torch.int64:
            kind = (
                torch.empty(0, dtype=lengths.dtype)
                .type()
                .removeprefix("torch.")
                .removesuffix("Tensor")
            )
            raise RuntimeError(
                f"'lengths' argument should be a 1D CPU int64 tensor, but got {lengths.dim()}D "
                f"{lengths.device} {kind} tensor"
            )
    generator = _generator(func, args, kwargs)
    # check_generator, in DistributionsHelper.h
    if generator is not None and generator.device.type != NAME:
        raise RuntimeError(
            f"Expected a '{NAME}' device type for generator but found '{generator.device.type}'"
        )
