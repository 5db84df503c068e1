"""Storages on the simulated device: checkpoints saved on ``sim:N`` and loaded with any
``map_location`` (a serialization package registered on import), storages it refuses to make, and
pinned host memory. Installed by :func:`simdevice._backend.enable`."""

from __future__ import annotations

import re

import torch

from simdevice import _state as _state_module
from simdevice._state import NAME, current_index, resolve
from simdevice._state import state as _state
from simdevice._tensor import SimTensor

_LOCATION = re.compile(rf"^{NAME}(?::(\d+))?$")


def _tagger(storage) -> str | None:
    return getattr(storage, "_sim_location", None)


def _deserializer(storage, location: str):
    match = _LOCATION.match(location)
    if match is None:
        return None
    if not _state["enabled"]:
        raise RuntimeError(
            f"Attempting to deserialize object on a simulated {NAME!r} device, but it is not turned"
            " on in this process. Call simdevice.enable() first, or use torch.load with"
            " map_location=torch.device('cpu') to map your storages to the CPU."
        )
    index = current_index() if match.group(1) is None else int(match.group(1))
    # torch.serialization._validate_device's words, as CUDA's checkpoints meet them
    if index >= _state["count"]:
        raise RuntimeError(
            f"Attempting to deserialize object on {NAME.upper()} device {index} but"
            f" torch.{NAME}.device_count() is {_state['count']}. Please use torch.load with"
            " map_location to map your storages to an existing device."
        )
    storage._sim_target = resolve(location)
    return storage


def rebuild_tensor(storage, storage_offset, size, stride):
    tensor = _original_rebuild(storage, storage_offset, size, stride)
    target = getattr(storage._untyped_storage, "_sim_target", None)
    return tensor if target is None else SimTensor(tensor, target)


_original_rebuild = torch._utils._rebuild_tensor
_original_storage_new = torch.UntypedStorage.__new__


def storage_new(cls, *args, **kwargs):
    # A PrivateUse1 storage needs an allocator, which a Python backend cannot
    # register: PyTorch would crash the process. Refuse it instead.
    device = kwargs.get("device")
    if device is not None and torch.device(device).type == NAME:
        raise RuntimeError(
            "the simulated device holds no storages of its own: its tensors keep their values in"
            " CPU storages. Create a tensor instead, e.g. torch.empty(n, dtype=torch.uint8,"
            f" device={str(device)!r})"
        )
    return _original_storage_new(cls, *args, **kwargs)


# The serialization package is registered on import, before enable(): a
# checkpoint saved on sim:N then fails to load with a message that says what
# to do, like CUDA's on a machine without a GPU. Priority below the CPU's (10)
# so that storages tagged while saving are seen first.
torch.serialization.register_package(-5, _tagger, _deserializer)


_original_pin_memory = torch.Tensor.pin_memory
_original_is_pinned = torch.Tensor.is_pinned


def pin_memory(self, device=None):
    # Pinned memory needs an allocator from the backend, which a Python backend
    # cannot give. Host memory is all the simulated device has: a pinned tensor
    # is a CPU copy marked as pinned, so DataLoader(pin_memory=True), is_pinned()
    # and non_blocking copies behave as on a GPU machine. A registered PrivateUse1
    # backend becomes PyTorch's current accelerator, CUDA or not: where CUDA is
    # there, pinning still asks CUDA for page-locked memory.
    if torch.cuda.is_available():
        return _original_pin_memory(self, "cuda")
    # hidden: pinning answers as on this machine without the simulated device
    if not _state_module.shown():
        from simdevice._accelerator import _NONE_AVAILABLE, machine_accelerator

        machine = machine_accelerator(check_available=True)
        if machine is None:
            raise RuntimeError(_NONE_AVAILABLE)
        return _original_pin_memory(self, machine.type)
    if self.device.type != "cpu":
        raise RuntimeError(f"cannot pin '{self.type()}' only dense CPU tensors can be pinned")
    if is_pinned(self):
        return self
    pinned = self.clone()
    pinned.untyped_storage()._sim_pinned = True
    return pinned


def is_pinned(self, device=None):
    if torch.cuda.is_available():
        return _original_is_pinned(self, "cuda")
    return self.device.type == "cpu" and getattr(self.untyped_storage(), "_sim_pinned", False)
