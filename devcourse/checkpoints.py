"""Checkpoints that look saved on a GPU, made on any machine; the loader that opens them is
re-exported here.

:func:`make_checkpoint` writes a seeded :class:`~devcourse.models.TinyNet`'s checkpoint as a plain,
DataParallel, DDP or compiled model saved it on ``cpu``, ``cuda:0`` or ``cuda:1``. The loader
(:func:`load_model`, :func:`read_state_dict`, :class:`CheckpointError`) lives in
:mod:`devcourse.loading`; notebooks, students' among them, import it from here. Introduced in
03_saving_and_loading; used in 04 to 09.
"""

from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Iterator

import torch
from torch import nn

from devcourse.loading import (
    PREFIXES,
    STATE_DICT_KEYS,
    CheckpointError,
    CheckpointNotFound,
    EmptyCheckpoint,
    KeyMismatch,
    NotACheckpoint,
    TruncatedCheckpoint,
    UnsafeCheckpoint,
    check_keys,
    find_state_dict,
    load_model,
    read_checkpoint,
    read_state_dict,
    strip_prefixes,
)
from devcourse.models import seeded_tinynet

__all__ = [
    "PREFIXES",
    "SAVED_ON",
    "STATE_DICT_KEYS",
    "WRAPPERS",
    "CheckpointError",
    "CheckpointNotFound",
    "EmptyCheckpoint",
    "KeyMismatch",
    "NotACheckpoint",
    "TruncatedCheckpoint",
    "UnsafeCheckpoint",
    "check_keys",
    "find_state_dict",
    "load_model",
    "make_checkpoint",
    "read_checkpoint",
    "read_state_dict",
    "single_process_group",
    "strip_prefixes",
    "tagged_save",
    "wrapped_state_dict",
]

SAVED_ON = ("cpu", "cuda:0", "cuda:1")
WRAPPERS = ("plain", "dataparallel", "ddp", "compiled", "compiled_ddp", "ddp_compiled")


# --------------------------------------------------------------------------- fixtures


@contextlib.contextmanager
def _storages_tagged_as(location: str) -> Iterator[None]:
    """While active, ``torch.save`` records every CPU storage as living on ``location``."""

    def tagger(storage: object) -> str | None:
        return location if getattr(storage, "device", torch.device("cpu")).type == "cpu" else None

    def deserializer(storage: object, tag: str) -> None:
        return None  # leave loading to PyTorch's own deserializers

    torch.serialization.register_package(-100, tagger, deserializer)
    entry = next(e for e in torch.serialization._package_registry if e[1] is tagger)
    try:
        yield
    finally:
        # PyTorch has no public way to unregister a package.
        torch.serialization._package_registry.remove(entry)


def tagged_save(obj: object, path: str | Path, saved_on: str = "cuda:1") -> Path:
    """``torch.save(obj, path)`` as if every tensor in ``obj`` had lived on ``saved_on``.

    Works on a CPU-only machine. ``obj``'s tensors must be on the CPU.
    """
    path = Path(path)
    torch.device(saved_on)  # a clear error for a bad device string
    if saved_on == "cpu":
        torch.save(obj, path)
    else:
        with _storages_tagged_as(saved_on):
            torch.save(obj, path)
    return path


# The groups single_process_group made that a model may still hold (see there).
_GROUPS: list = []


@contextlib.contextmanager
def single_process_group() -> Iterator[None]:
    """A one-process ``gloo`` group, so DDP can wrap a model in this process.

    Uses the group that already exists if there is one; otherwise creates one
    backed by an in-memory store (no ports, no files) and destroys it after.

    A DDP model made in the block holds the group after it. When such a model
    is deleted soon after it was made, PyTorch 2.13 can destroy the group from
    inside the model's teardown while holding the GIL, which one of the
    group's threads still needs to finish its last work: the process hangs for
    good (seen at random, more often on a busy machine; the class of deadlock
    of pytorch/pytorch#56297). So this helper holds each group it made too,
    and lets go of it at a later call once no model holds it any more
    (:func:`_let_go_of_unused`), where destroying it releases the GIL first.
    The same on every machine; it only changes when the group's threads end.
    """
    import torch.distributed as dist

    _let_go_of_unused()
    if dist.is_initialized():
        yield
        return
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    _GROUPS.append(dist.group.WORLD)
    try:
        yield
    finally:
        dist.destroy_process_group()
        _let_go_of_unused()


def _let_go_of_unused() -> None:
    """Drop the groups :func:`single_process_group` made that nothing else refers to (a DDP model
    keeps its group as ``process_group``); destroyed here, from Python, a group releases the GIL
    before it waits for its threads."""
    kept = []
    while _GROUPS:
        group = _GROUPS.pop()
        if sys.getrefcount(group) > 2:  # more than this name and getrefcount's own argument
            kept.append(group)
        del group
    _GROUPS.extend(kept)


def wrapped_state_dict(model: nn.Module, wrapper: str = "plain") -> dict[str, torch.Tensor]:
    """``model``'s state dict as the given wrapper really writes it.

    ``dataparallel`` and ``ddp`` add ``module.``, ``compiled`` adds
    ``_orig_mod.``; ``compiled_ddp`` is ``torch.compile(DDP(model))``
    (``_orig_mod.module.``) and ``ddp_compiled`` is ``DDP(torch.compile(model))``
    (``module._orig_mod.``). The wrappers are real; nothing is compiled,
    because compilation waits for a first forward pass.
    """
    from torch.nn.parallel import DistributedDataParallel

    if wrapper not in WRAPPERS:
        raise ValueError(f"wrapper must be one of {WRAPPERS}, not {wrapper!r}")
    if wrapper == "plain":
        return model.state_dict()
    if wrapper == "dataparallel":
        return nn.DataParallel(model).state_dict()
    if wrapper == "compiled":
        return torch.compile(model).state_dict()
    with single_process_group():
        if wrapper == "ddp":
            return DistributedDataParallel(model).state_dict()
        if wrapper == "compiled_ddp":
            return torch.compile(DistributedDataParallel(model)).state_dict()
        return DistributedDataParallel(torch.compile(model)).state_dict()


def make_checkpoint(
    path: str | Path,
    saved_on: str = "cuda:1",
    wrapper: str = "plain",
    dtype: torch.dtype = torch.float32,
    seed: int = 0,
    training: bool = False,
    amp: bool = False,
) -> dict[str, torch.Tensor]:
    """Write a TinyNet checkpoint to ``path``; return its state dict as a plain model has it.

    ``saved_on`` is the device the file claims its tensors were saved on,
    ``wrapper`` the wrapper whose key prefixes it carries (see
    :func:`wrapped_state_dict`), ``dtype`` the dtype of its floating-point
    tensors (integer buffers stay integers). With ``training=True`` the file
    is a training checkpoint: ``{"model", "optimizer", "epoch", "rng_state"}``;
    ``amp=True`` adds the state of the ``torch.amp.GradScaler`` of a
    mixed-precision run under ``"scaler"`` (it implies ``training=True``).

    The returned dict (CPU tensors, no prefixes, the requested dtype) is what
    a correct loader must produce. Works on a CPU-only machine; the same
    arguments always write the same bytes.
    """
    model = seeded_tinynet(seed)
    reference = {key: _cast(value, dtype) for key, value in model.state_dict().items()}
    state = {key: _cast(value, dtype) for key, value in wrapped_state_dict(model, wrapper).items()}
    obj: object = state
    if training or amp:
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model(torch.randn(4, model.encoder[0].in_features)).sum().backward()
            optimizer.step()
            rng_state = torch.get_rng_state()
        obj = {
            "model": state,
            "optimizer": optimizer.state_dict(),
            "epoch": 3,
            "rng_state": rng_state,
        }
        if amp:
            # A GradScaler's state is plain Python numbers: scale, growth settings, tracker.
            obj["scaler"] = torch.amp.GradScaler("cpu").state_dict()
    tagged_save(obj, path, saved_on)
    return reference


def _cast(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return tensor.to(dtype) if tensor.is_floating_point() else tensor
