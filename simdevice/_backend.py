"""Turning the simulated device on: PyTorch's PrivateUse1 extension point.

:func:`enable` (called by :func:`simdevice.enable`) renames PrivateUse1 to ``sim`` and registers a
Python backend for it (``torch.utils.backend_registration``, private and experimental since 2.10,
hence the pinned torch and ``test_simdevice_seams``); every operator but the allocating ones reaches
``SimTensor.__torch_dispatch__``.
"""

from __future__ import annotations

import threading

import torch
from torch.utils import _device as _device_mode

from simdevice import _clock, _memory, _moves, _storage
from simdevice._state import NAME, current_index, resolve, set_current_index
from simdevice._state import state as _state
from simdevice._tensor import SimTensor

_lock = threading.Lock()


class SimDeviceError(RuntimeError):
    """The simulated device cannot be turned on, or was asked for something it cannot do."""


def enabled() -> bool:
    return bool(_state["enabled"])


def count() -> int:
    return int(_state["count"])


class _DeviceModule:
    """What ``torch.sim`` answers: the parts of ``torch.cuda`` that PyTorch's own code asks a
    backend."""

    @staticmethod
    def is_available() -> bool:
        return _state["enabled"]

    @staticmethod
    def is_initialized() -> bool:
        return _state["enabled"]

    @staticmethod
    def device_count() -> int:
        return _state["count"]

    @staticmethod
    def current_device() -> int:
        return current_index()

    @staticmethod
    def set_device(device: object) -> None:
        set_current_index(resolve(device).index)

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        return None  # random numbers come from the CPU generator

    @staticmethod
    def get_rng_state(device: object = None) -> torch.Tensor:
        """The CPU generator's state, where the device's random numbers come from (``fork_rng``
        saves it)."""
        return torch.get_rng_state()

    @staticmethod
    def set_rng_state(state: torch.Tensor, device: object = None) -> None:
        torch.set_rng_state(state)

    @staticmethod
    def get_amp_supported_dtype() -> list[torch.dtype]:
        return [torch.float16, torch.bfloat16]

    @staticmethod
    def memory_allocated(device: object = None) -> int:
        return _memory.of(device).allocated

    @staticmethod
    def max_memory_allocated(device: object = None) -> int:
        return _memory.of(device).peak

    @staticmethod
    def synchronize(device: object = None) -> None:
        _clock.wait(resolve(device).index)  # at once unless simdevice.asynchronous() is on


class _Hooks(torch._C._acc.PrivateUse1Hooks):
    def is_available(self) -> bool:
        return True

    def has_primary_context(self, dev_id) -> bool:
        return True

    def is_built(self) -> bool:
        return True


class _Guard(torch._C._acc.DeviceGuard):
    def type_(self):
        return torch._C._autograd.DeviceType.PrivateUse1


def _empty(size, *, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None):
    target = resolve(device)
    values = torch.empty(size, dtype=dtype, layout=layout, memory_format=memory_format)
    return SimTensor(values, target)


def _empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    target = resolve(device)
    values = torch.empty_strided(size, stride, dtype=dtype, layout=layout)
    return SimTensor(values, target)


# Factories that PyTorch builds as "an empty tensor, then the out= operator",
# which resizes the empty tensor in place (a wrapper's shape cannot change):
# on the simulated device they run on the CPU and are wrapped once.
_FACTORIES = (
    "arange range linspace logspace eye randperm tril_indices triu_indices "
    "bartlett_window blackman_window hamming_window hann_window kaiser_window"
).split()


def _factory(op):
    def kernel(*args, **kwargs):
        target = resolve(kwargs.get("device"))
        kwargs["device"] = torch.device("cpu")
        kwargs.pop("pin_memory", None)
        return SimTensor(op(*args, **kwargs), target)

    return kernel


def _register_factories(library: torch.library.Library) -> None:
    for name in _FACTORIES:
        packet = getattr(torch.ops.aten, name)
        for overload in packet.overloads():
            op = getattr(packet, overload)
            arguments = op._schema.arguments
            if any(a.name == "device" for a in arguments) and not any(
                a.name == "out" for a in arguments
            ):
                library.impl(
                    name if overload == "default" else f"{name}.{overload}",
                    _factory(op),
                    "PrivateUse1",
                )


def _copy_from(source, destination, non_blocking=False):
    # Reached only where PyTorch excludes Python dispatch (``torch.tensor(..., device=...)``).
    values = source._values if isinstance(source, SimTensor) else source
    destination._values.copy_(values)
    return destination


def _local_scalar_dense(tensor):
    # Reached only where PyTorch excludes Python dispatch: torch.tensor([...]) of 0-dim tensors on
    # the device reads each one's value, as CUDA does by a copy to the host.
    return tensor._values.item()


# PyTorch gives ``sim`` with no index the index of the device guard's current
# device, which a guard written in Python cannot change (it stays 0), in
# ``Tensor.to``, ``Tensor.new_tensor`` and the ``torch.tensor`` family. These
# calls give it the calling thread's current device instead, as CUDA's guard
# does for ``cuda``.
def _indexed(device):
    if (
        device == NAME
        if type(device) is str
        else type(device) is torch.device and device.type == NAME and device.index is None
    ):
        return torch.device(NAME, current_index())
    return device


def _default_device():
    """The device of ``with torch.device(...)`` or ``torch.set_default_device``, index as given;
    None without one.

    ``torch.get_default_device()`` cannot be asked: it fills a missing index by calling
    ``torch.tensor``.
    """
    from torch.overrides import _get_current_function_mode_stack

    for mode in reversed(_get_current_function_mode_stack()):
        if isinstance(mode, _device_mode.DeviceContext):
            return mode.device
    context = getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None)
    return None if context is None else context.device


def _with_current_index(original, follows_default: bool):
    """``original`` with a bare ``sim`` in ``device=`` indexed; ``follows_default``: a factory of
    the ``torch.tensor`` family, which without ``device=`` takes the default device
    (``Tensor.new_tensor`` takes its tensor's)."""

    def call(*args, **kwargs):
        if follows_default and kwargs.get("device") is None:
            default = _default_device()
            if default is not None and default.type == NAME:
                kwargs["device"] = default
        if "device" in kwargs:
            kwargs["device"] = _indexed(kwargs["device"])
        return original(*args, **kwargs)

    call.__doc__, call.__wrapped__ = original.__doc__, original
    return call


def _on_its_own_index(original):
    """``Tensor.new_tensor`` or ``Tensor.new``, giving a tensor on a simulated device without
    ``device=`` its own index, as CUDA's does (PyTorch builds it from the device type alone, and the
    device guard of a Python backend says index 0)."""

    def call(self, *args, **kwargs):
        # (``t.new(tensor)`` takes no device: it is that tensor's)
        aliased = original is _original_new and args and isinstance(args[0], torch.Tensor)
        if kwargs.get("device") is None and type(self) is SimTensor and not aliased:
            kwargs["device"] = self.device
        return original(self, *args, **kwargs)

    call.__doc__, call.__wrapped__ = original.__doc__, original
    return call


_original_to = torch.Tensor.to
_original_new_tensor = torch.Tensor.new_tensor
_original_new = torch.Tensor.new
_original_factories = {name: getattr(torch, name) for name in ("tensor", "as_tensor")}


def _to(self, *args, **kwargs):
    if args and type(args[0]) is not torch.dtype:
        args = (_indexed(args[0]), *args[1:])
    if "device" in kwargs:
        kwargs["device"] = _indexed(kwargs["device"])
    return _original_to(self, *args, **kwargs)


_to.__doc__ = _original_to.__doc__


def enable(count: int = 2) -> None:
    """Register the device type with ``count`` devices; idempotent for one count, and never undone
    (PyTorch allows one PrivateUse1 name per process).

    It registers a device module ``torch.sim`` (``device_count``, ``is_available``,
    ``current_device``, AMP dtypes) that ``torch.accelerator``, ``torch.load`` and autocast consult;
    kernels for ``empty.memory_format``, ``empty_strided`` (they hand out :class:`SimTensor`
    objects) and ``_copy_from`` (reached with Python dispatch off); a serialization package that
    tags storages ``sim:N``, so every ``map_location`` works as for CUDA; autocast kernels
    (``_autocast``) and whole recurrent layers on the CPU values (``_oncpu``); pinned memory as CPU
    copies marked pinned (a Python backend cannot register a pinned allocator); ``gloo`` as the
    default ``torch.distributed`` backend; and ``Module.to`` / ``.sim()`` / ``.half()`` keeping each
    ``Parameter`` object where a simulated device is involved, so weight ties survive a move and an
    optimizer built before it still trains.
    """
    if not isinstance(count, int) or count < 1:
        raise SimDeviceError(f"count must be a positive int, not {count!r}")
    with _lock:
        if _state["enabled"]:
            if count != _state["count"]:
                raise SimDeviceError(
                    f"the simulated device is already on with {_state['count']} devices; "
                    f"it cannot be turned on again with {count} (restart the kernel to change it)"
                )
            # the first call may have come from another thread: this one's backward runs here too
            torch.autograd.set_multithreading_enabled(False)
            return
        current = torch._C._get_privateuse1_backend_name()
        if current != "privateuseone":
            raise SimDeviceError(
                "cannot turn on the simulated device: PyTorch's one out-of-tree device type"
                f" (PrivateUse1) is already registered as {current!r} in this process; nothing was"
                " changed"
            )
        torch.utils.backend_registration._setup_privateuseone_for_python_backend(
            NAME, backend_module=_DeviceModule(), hook=_Hooks(), device_guard=_Guard()
        )
        library = torch.library.Library("aten", "IMPL")
        library.impl("empty.memory_format", _empty, "PrivateUse1")
        library.impl("empty_strided", _empty_strided, "PrivateUse1")
        library.impl("_copy_from", _copy_from, "PrivateUse1")
        library.impl("_local_scalar_dense", _local_scalar_dense, "PrivateUse1")
        _register_factories(library)
        _state["library"] = library
        from simdevice import _accelerator, _autocast, _oncpu, _streams

        _state["autocast"] = _autocast.register(NAME)
        _state["recurrent"] = _oncpu.register()
        _accelerator.install()
        _streams.install()
        torch._utils._rebuild_tensor = _storage.rebuild_tensor
        torch.UntypedStorage.__new__ = _storage.storage_new
        torch.Tensor.pin_memory = _storage.pin_memory
        torch.Tensor.is_pinned = _storage.is_pinned
        torch.Tensor.to = _to
        torch.Tensor.new_tensor = _on_its_own_index(
            _with_current_index(_original_new_tensor, follows_default=False)
        )
        torch.Tensor.new = _on_its_own_index(_original_new)
        # ``with torch.device(...)`` and set_default_device give a device to the
        # functions of one set, which holds the originals: add the wrappers too.
        constructors = _device_mode._device_constructors()
        for name, original in _original_factories.items():
            wrapper = _with_current_index(original, follows_default=True)
            setattr(torch, name, wrapper)
            constructors.add(wrapper)
        _memory.reset(count)
        if torch.distributed.is_available():
            # Collectives on simulated tensors run in gloo on their CPU values
            # (see _tensor._collective): gloo is the device's default backend,
            # as nccl is CUDA's (dist.get_default_backend_for_device).
            torch.distributed.Backend.default_device_backend_map.setdefault(NAME, "gloo")
        torch.nn.Module._apply = _moves.apply_keeping_parameters
        _state.update(enabled=True, count=count)
    # PrivateUse1's device guard reports a single device: the autograd engine's
    # worker threads assert on any other index. Backward runs in the calling
    # thread instead (a thread-local switch: this thread, the kernel's).
    torch.autograd.set_multithreading_enabled(False)
