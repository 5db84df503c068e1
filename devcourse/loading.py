"""Open a checkpoint on whatever this machine has, or say in one exception what is wrong with it.

:func:`load_model` and :func:`read_state_dict` read any file :mod:`devcourse.checkpoints` makes, or
a real one: onto the CPU with ``weights_only=True``, the ``module.``/``_orig_mod.`` prefixes
stripped, keys and shapes checked; each failure is a :class:`CheckpointError`. Re-exported by
:mod:`devcourse.checkpoints`; used from 04_map_location on.
"""

from __future__ import annotations

import pickle
import zipfile
from pathlib import Path
from typing import Callable

import torch
from torch import nn

from devcourse.devices import best_device

PREFIXES = ("module.", "_orig_mod.")
STATE_DICT_KEYS = ("model", "state_dict", "model_state_dict")


class CheckpointError(Exception):
    """A checkpoint that cannot be loaded, with a message that says why."""


class CheckpointNotFound(CheckpointError, FileNotFoundError):
    """There is no file at the given path."""


class EmptyCheckpoint(CheckpointError):
    """The file has no bytes at all."""


class TruncatedCheckpoint(CheckpointError):
    """The file starts like a checkpoint but is cut short or damaged."""


class NotACheckpoint(CheckpointError):
    """The file is not something ``torch.save`` wrote."""


class UnsafeCheckpoint(CheckpointError):
    """Loading needs globals that ``weights_only=True`` refuses to import."""

    def __init__(self, message: str, globals_needed: list[str]):
        super().__init__(message)
        self.globals_needed = globals_needed


class KeyMismatch(CheckpointError):
    """The checkpoint's keys or shapes do not match the model's."""

    def __init__(
        self, message: str, missing: list[str], unexpected: list[str], wrong_shape: list[str]
    ):
        super().__init__(message)
        self.missing, self.unexpected, self.wrong_shape = missing, unexpected, wrong_shape


_ZIP_MAGIC = b"PK\x03\x04"
_PICKLE_PROTO = 0x80


def read_checkpoint(path: str | Path, mmap: bool = False) -> object:
    """``torch.load`` a checkpoint onto the CPU with ``weights_only=True``, or explain why not.

    With ``mmap=True`` a zip-format file (every ``torch.save`` since 1.6) is
    memory-mapped: tensors are read from disk when touched and stay backed by
    the file, which must then not be overwritten while they are in use.
    Raises a :class:`CheckpointError` subclass for a missing, empty,
    truncated or foreign file, or one that needs unsafe globals.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointNotFound(
            f"no checkpoint at {path}" + (" (it is a directory)" if path.is_dir() else "")
        )
    size = path.stat().st_size
    if size == 0:
        raise EmptyCheckpoint(
            f"{path} is empty (0 bytes): the save was interrupted or never written"
        )
    with path.open("rb") as handle:
        head = handle.read(4)
    is_zip = head == _ZIP_MAGIC
    if is_zip:
        if not zipfile.is_zipfile(path):
            raise TruncatedCheckpoint(
                f"{path} is cut short or damaged ({size} bytes, no zip directory at its end): "
                "save it again or re-copy it"
            )
        with zipfile.ZipFile(path) as archive:
            if not any(name.endswith("data.pkl") for name in archive.namelist()):
                raise NotACheckpoint(
                    f"{path} is a zip archive but not one written by torch.save (no data.pkl"
                    " inside)"
                )
    elif head[:1] != bytes([_PICKLE_PROTO]):
        raise NotACheckpoint(f"{path} is not a PyTorch checkpoint: it starts with {head!r}")
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap and is_zip)
    except pickle.UnpicklingError as exc:
        if "Weights only load failed" not in str(exc):
            raise TruncatedCheckpoint(f"{path} is damaged: {exc}") from exc
        needed = _unsafe_globals(path) if is_zip else []
        listed = ", ".join(needed) if needed else "globals that are not tensors or plain containers"
        raise UnsafeCheckpoint(
            f"{path} needs {listed} to load. weights_only=True refuses them, because unpickling"
            " them can run any code. Save a state_dict instead; or, only if you trust the file,"
            " allow them with torch.serialization.safe_globals([...]).",
            needed,
        ) from exc
    except (EOFError, RuntimeError) as exc:
        raise TruncatedCheckpoint(
            f"{path} is cut short or damaged: {type(exc).__name__}: {exc}"
        ) from exc


def _unsafe_globals(path: Path) -> list[str]:
    """The globals that the zip checkpoint at ``path`` needs beyond ``weights_only``'s allowlist.

    torch lists them by reading the pickle without running it, and its reader
    knows only the opcodes of pickle protocol 2, which ``torch.save`` writes by
    default: a file saved with ``pickle_protocol=4`` or 5 stops it with
    ``UnpicklingError: Unsupported operand ...``. The list is then unknown and
    ``[]`` comes back; the refusal stands without it. Any other error goes up,
    with a note that it came from listing the globals of ``path``.
    """
    try:
        return list(torch.serialization.get_unsafe_globals_in_checkpoint(path))
    except pickle.UnpicklingError as exc:
        if str(exc).startswith("Unsupported operand"):
            return []
        _note(exc, f"while listing the globals that {path} needs")
        raise
    except BaseException as exc:  # not handled here: named, and raised again
        _note(exc, f"while listing the globals that {path} needs")
        raise


def _note(exc: BaseException, note: str) -> None:
    # Python 3.11+; on 3.10 the chained exception still shows the refusal
    if hasattr(exc, "add_note"):
        exc.add_note(note)


def strip_prefixes(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Remove wrapper prefixes (``module.``, ``_orig_mod.``) that every key shares, nested ones too.

    A prefix is removed only while *every* key starts with it, so a model
    that really has a submodule named ``module`` keeps its names.
    """
    keys = list(state_dict)
    changed = True
    while keys and changed:
        changed = False
        for prefix in PREFIXES:
            if all(key.startswith(prefix) for key in keys):
                keys = [key[len(prefix) :] for key in keys]
                changed = True
    return dict(zip(keys, state_dict.values()))


def find_state_dict(obj: object) -> dict[str, torch.Tensor]:
    """The model's state dict inside a loaded checkpoint.

    Accepts a state dict itself, or a training checkpoint that keeps it under
    ``"model"``, ``"state_dict"`` or ``"model_state_dict"``.
    """
    if isinstance(obj, dict) and obj and all(isinstance(v, torch.Tensor) for v in obj.values()):
        return dict(obj)
    if isinstance(obj, dict):
        for key in STATE_DICT_KEYS:
            if key in obj and isinstance(obj[key], dict):
                return find_state_dict(obj[key])
    kind = (
        f"dict with keys {sorted(map(str, obj))[:8]}"
        if isinstance(obj, dict)
        else type(obj).__name__
    )
    raise NotACheckpoint(f"found no model state dict in the checkpoint (it holds a {kind})")


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """The model state dict in the file at ``path``: on the CPU, prefixes stripped.

    Combines :func:`read_checkpoint`, :func:`find_state_dict` and
    :func:`strip_prefixes`; raises :class:`CheckpointError` on bad input.
    """
    return strip_prefixes(find_state_dict(read_checkpoint(path)))


def check_keys(model: nn.Module, state_dict: dict[str, torch.Tensor]) -> None:
    """Raise :class:`KeyMismatch`, listing every difference, unless keys and shapes match
    ``model``."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]
    wrong_shape = [
        f"{k}: checkpoint {tuple(state_dict[k].shape)}, model {tuple(expected[k].shape)}"
        for k in expected
        if k in state_dict and state_dict[k].shape != expected[k].shape
    ]
    if missing or unexpected or wrong_shape:
        parts = []
        for label, items in (
            ("missing from the checkpoint", missing),
            ("not in the model", unexpected),
            ("of the wrong shape", wrong_shape),
        ):
            if items:
                parts.append(f"{len(items)} {label}: {', '.join(items)}")
        raise KeyMismatch(
            "the checkpoint does not fit the model; " + "; ".join(parts),
            missing,
            unexpected,
            wrong_shape,
        )


def load_model(
    path: str | Path,
    model_factory: Callable[[], nn.Module],
    device: torch.device | str | None = None,
) -> nn.Module:
    """Build a model with ``model_factory`` and load the checkpoint at ``path`` into it, on
    ``device``.

    ``device`` defaults to :func:`~devcourse.devices.best_device` (the CPU on
    a CPU-only machine). Whatever device the file was saved on, whichever
    wrapper prefixes it carries, and whatever its float dtype, the model
    comes back with the factory's dtypes on ``device``.

    To keep memory near one copy of the weights, the model is built on the
    ``meta`` device (no memory) and the tensors read from the file become the
    model's own (``load_state_dict(assign=True)``) before one move to
    ``device``; loading into an already built model would hold two copies.
    Models with non-persistent buffers, whose values a checkpoint does not
    hold, are built normally instead.

    Raises :class:`CheckpointError` for a bad file or a mismatch; the model
    is only returned when every tensor has loaded.
    """
    device = torch.device(device) if device is not None else best_device()
    state = read_state_dict(path)
    with torch.device("meta"):
        skeleton = model_factory()
    check_keys(skeleton, state)
    if _has_non_persistent_buffers(skeleton):
        model = model_factory()
        model.load_state_dict(state)
        return model.to(device)
    expected = skeleton.state_dict()
    state = {
        k: v.to(expected[k].dtype) if v.dtype != expected[k].dtype else v for k, v in state.items()
    }
    skeleton.load_state_dict(state, assign=True)
    return skeleton.to(device)


def _has_non_persistent_buffers(model: nn.Module) -> bool:
    return any(module._non_persistent_buffers_set for module in model.modules())
