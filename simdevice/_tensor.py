"""The tensor type of the simulated device, and what happens to each operator.

A tensor on ``sim:N`` is a :class:`SimTensor`, a wrapper subclass whose values live in a plain CPU
tensor. Every operator on one comes to ``SimTensor.__torch_dispatch__`` (:func:`run`), which checks
devices as CUDA would (:mod:`simdevice._devicecheck`: PyTorch's own message, ``cuda`` read as
``sim``), runs it on the CPU values and puts the results where the operator would. Random numbers
come from the CPU generator (``torch.manual_seed``).
"""

from __future__ import annotations

import sys

import torch
import torch.utils._pytree as pytree

from simdevice import _bits, _clock, _cudaforms, _cudaonly, _memory, _opchecks
from simdevice._cudaforms import CONVOLUTIONS
from simdevice._devicecheck import _plan, _plans, check_devices
from simdevice._state import NAME, resolve


class SimTensor(_bits.Marked, torch.Tensor):
    """A tensor on a simulated device; its values are the CPU tensor ``_values``."""

    _values: torch.Tensor
    __torch_function__ = torch._C._disabled_torch_function_impl

    @staticmethod
    def __new__(cls, values: torch.Tensor, device: torch.device, requires_grad: bool = False):
        if values.layout != torch.strided or values.is_nested:
            raise _NotStrided("nested" if values.is_nested else values.layout)
        storage = values.untyped_storage()
        tensor = torch.Tensor._make_wrapper_subclass(
            cls,
            values.size(),
            strides=values.stride(),
            storage_offset=values.storage_offset(),
            dtype=values.dtype,
            layout=values.layout,
            device=device,
            requires_grad=requires_grad,
            storage_size=storage.nbytes(),  # a view's storage is its base's, as on CUDA
        )
        tensor._values = values
        _memory.hold(device.index, storage)
        return tensor

    def data_ptr(self) -> int:
        # PyTorch's own code reads 0 as "a tensor without storage" (Tensor.__deepcopy__ does); other
        # callers would take 0 for an address that every simulated tensor shares.
        if sys._getframe(1).f_globals.get("__name__", "").startswith("torch."):
            return 0
        raise RuntimeError(
            f"data_ptr() of a tensor on {self.device}: the simulated device keeps its values in"
            " host memory and has no device pointer to give (a limit of the simulated device)."
            " Compare values with torch.equal, or move the tensor with .cpu() first"
        )

    @property
    def data(self):
        return torch._C.TensorBase.data.__get__(self)

    @data.setter
    def data(self, new):
        # ``param.data = other`` swaps the tensor's metadata in C++; the values
        # are ours to swap along with it.
        torch._C.TensorBase.data.__set__(self, new)
        if type(new) is SimTensor:
            self._values = new._values

    def __repr__(self, *, tensor_contents=None):
        if _clock._kernel_s:
            # printing reads the values
            _clock.wait(self.device.index, _clock.current_stream(self.device.index))
        # PyTorch's own printer, fed the values (it cannot read them through a subclass).
        contents = torch._tensor_str._tensor_str(self._values.detach(), len("tensor("))
        text = torch._tensor_str._str(self, tensor_contents=contents)
        # Printed as CUDA tensors are: tensor(..., device='sim:0'), and a parameter as
        # "Parameter containing:" above that, where PyTorch writes Parameter(SimTensor(...)).
        heading = ""
        if text.startswith("Parameter("):
            heading, text = "Parameter containing:\n", text[len("Parameter(") : -1]
        return heading + "tensor(" + text[len(type(self).__name__) + 1 :]

    def tolist(self):
        if _clock._kernel_s:
            _clock.wait(self.device.index, _clock.current_stream(self.device.index))
        return self._values.tolist()

    def numpy(self, *, force: bool = False):
        # as PyTorch's: a copy on the host, detached, its conjugate and negative bits resolved
        if force:
            return self.detach().cpu().resolve_conj().resolve_neg().numpy()
        raise TypeError(
            f"can't convert {self.device} device type tensor to numpy. "
            "Use Tensor.cpu() to copy the tensor to host memory first."
        )

    def __format__(self, spec):
        # torch.Tensor formats 0-dim tensors by value only when its type is exactly Tensor.
        if self.dim() == 0:
            return self.item().__format__(spec)
        return object.__format__(self, spec)

    def __reduce_ex__(self, protocol):
        # Pickle exactly as a CPU tensor would, from the CPU values, so that
        # torch.save writes a normal checkpoint; the storage is tagged with
        # this tensor's device by the serialization hooks (see _backend).
        # PyTorch keeps one Python object per storage, so the mark stays with it;
        # only simulated tensors' own storages are ever marked.
        self._values.untyped_storage()._sim_location = str(self.device)
        rebuild, args = self._values.__reduce_ex__(protocol)
        args = list(args)
        # _rebuild_tensor_v2(storage, offset, size, stride, requires_grad, ...)
        args[4] = self.requires_grad
        return rebuild, tuple(args)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if _clock._kernel_s and _clock.account(func, args, kwargs or {}):
            return _clock.late_copy(func, args, lambda: _dispatch(func, args, kwargs))
        return _dispatch(func, args, kwargs)


def _dispatch(func, args: tuple, kwargs: dict | None):
    """Every operator on a simulated tensor: the fast path, collectives, device checks, then the
    CPU's kernel."""
    try:
        if not kwargs:
            out = _fast(func, args)
            if out is not _SLOW:
                return out
        kwargs = kwargs or {}
        if func.namespace == "c10d":
            return _collective(func, args, kwargs)
        composite = check_devices(func, args, kwargs)
        if composite is not None:
            return _decompose(func, composite, args, kwargs)
        return run(func, args, kwargs)
    except _NotStrided as exc:
        raise NotImplementedError(
            f"the simulated device cannot run {func}: its result would be a {exc.args[0]} tensor,"
            " and the simulated device holds dense (strided) tensors only (a limit of the"
            " simulated device)"
        ) from None


class _NotStrided(Exception):
    """A result the simulated device cannot hold (sparse, mkldnn ...); the dispatcher names the
    operator."""


def _decompose(func, key, args: tuple, kwargs: dict):
    """Run ``func``'s composite kernel: its parts come back here, each checked as CUDA checks it."""
    try:
        return func._op_dk(key, *args, **kwargs)
    except RuntimeError as exc:
        message = str(exc)
        translated = _cudaforms.translate(message)
        if translated == message:
            raise
        raise type(exc)(translated) from None


_SLOW = object()


def _fast(func, args: tuple):
    """The common case, in one pass: positional arguments whose tensors are all on one simulated
    device.

    Then no check can fail, so the operator runs at once. Returns ``_SLOW``
    for anything else (a CPU tensor, tensors in lists, two devices) before
    running anything: the general path checks and runs those.
    """
    device = None
    inner = []
    for value in args:
        kind = type(value)
        if kind is SimTensor:
            if device is None:
                device = value.device
            elif value.device != device:
                return _SLOW
            if _bits.marked(value._values):  # a conjugate or negative view: the general path
                return _SLOW
            inner.append(value._values)
        elif kind is list or kind is tuple:
            # nested: collectives
            if any(isinstance(v, (torch.Tensor, list, tuple)) for v in value):
                return _SLOW
            inner.append(value)
        elif isinstance(value, torch.Tensor):
            return _SLOW
        else:
            inner.append(value)
    plan = _plans.get(func) or _plan(func)
    if plan[0] in _opchecks.NAMES or plan[4]:  # a check of its own, for one device too
        return _SLOW
    try:
        out = func(*inner)
    except NotImplementedError as exc:
        out = _without_cpu_kernel(func, exc, inner, {})
    except RuntimeError:
        # the CPU words a convolution's dtype mismatch in its own way
        error = _cudaforms.convolution_error(args) if plan[0] in CONVOLUTIONS else None
        if error is None:
            raise
        raise error from None
    writes = plan[3]
    if type(out) is torch.Tensor:
        return _wrap(func, out, device, args, {}) if writes else SimTensor(out, device)
    if type(out) is tuple or type(out) is list:
        return type(out)(
            (
                (_wrap(func, o, device, args, {}) if writes else SimTensor(o, device))
                if type(o) is torch.Tensor
                else o
            )
            for o in out
        )
    return out


def _without_cpu_kernel(func, exc: NotImplementedError, args, kwargs):
    """Run ``func``'s own implementation (``_cudaonly``) when the CPU has no kernel for it, or
    raise."""
    own = _cudaonly.KERNELS.get(func)
    if own is None:
        raise _cannot_run(func, exc) from None
    return own(*args, **kwargs)


def _cannot_run(func, exc: NotImplementedError) -> NotImplementedError:
    return NotImplementedError(
        f"the simulated device cannot run {func}: it runs each operator with PyTorch's CPU kernel, "
        "and the CPU has none for it (a limit of the simulated device: "
        f"{exc.args[0].splitlines()[0] if exc.args else exc})"
    )


def _unwrap(value, reads: bool = True):
    kind = type(value)
    if kind is SimTensor:
        return _bits.read(value._values) if reads else value._values
    if (kind is list or kind is tuple) and any(type(v) is SimTensor for v in value):
        return kind(_unwrap(v, reads) for v in value)
    return value


def _collective(func, args: tuple, kwargs: dict):
    """A collective of ``torch.distributed`` (``c10d::allreduce_``, ``allgather_``, ...).

    The process group's backend (gloo) works on the CPU values in place, tensor
    lists nested or not; what it returns (the tensors it wrote and a ``Work``
    handle) goes back with the simulated tensors it wrote into, so code that
    waits on the handle finds the results on the device.
    """
    inner_args, inner_kwargs = pytree.tree_map_only(SimTensor, lambda t: t._values, (args, kwargs))
    out = func(*inner_args, **inner_kwargs)
    owners = {id(t._values): t for t in pytree.tree_leaves((args, kwargs)) if type(t) is SimTensor}
    return pytree.tree_map_only(torch.Tensor, lambda t: owners.get(id(t), t), out)


def _first_device(args, kwargs) -> torch.device | None:
    flat = (
        v
        for value in (*args, *kwargs.values())
        for v in (value if type(value) in (list, tuple) else (value,))
    )
    return next((v.device for v in flat if type(v) is SimTensor), None)


def run(func, args: tuple, kwargs: dict):
    """Run ``func`` on the CPU values and place its results like a device would."""
    target = _first_device(args, kwargs)
    device = kwargs.get("device")
    if device is not None or "pin_memory" in kwargs:
        kwargs = dict(kwargs)
        if device is not None:
            target = torch.device(device)
            if target.type == NAME:
                target = resolve(target)
                kwargs["device"] = torch.device("cpu")
        if kwargs.get("pin_memory"):
            kwargs["pin_memory"] = False
    writes = _plan(func)[3]
    # an operator that writes keeps its views as they are
    reads = not writes and not _bits.keeps_marks(func)
    inner_args = [_unwrap(a, reads) for a in args]
    inner_kwargs = {k: _unwrap(v, reads) for k, v in kwargs.items()}
    written = _bits.plain_copies(func, inner_args, inner_kwargs) if writes else []
    try:
        out = func(*inner_args, **inner_kwargs)
    except NotImplementedError as exc:
        out = _without_cpu_kernel(func, exc, inner_args, inner_kwargs)
    out = _bits.after(func, args, out, written)
    if target is None or target.type != NAME:
        return out
    if isinstance(out, torch.Tensor):
        return _wrap(func, out, target, args, kwargs)
    if type(out) is tuple or type(out) is list:
        return type(out)(
            _wrap(func, o, target, args, kwargs) if isinstance(o, torch.Tensor) else o for o in out
        )
    return out


def _wrap(func, values: torch.Tensor, target: torch.device, args: tuple, kwargs: dict):
    # In-place and out= operators return their argument: hand back the same wrapper.
    for value in (*args, *kwargs.values()):
        if type(value) is SimTensor and value._values is values and value.device == target:
            if (
                value.shape != values.shape
                or value.stride() != values.stride()
                or value.storage_offset() != values.storage_offset()
            ):
                _restride(func, value, values)
            return value
    return SimTensor(values, target)


def _restride(func, wrapper: SimTensor, values: torch.Tensor) -> None:
    """Give ``wrapper`` the shape ``func`` gave its values in place (``transpose_``, ``resize_``
    ...).

    The wrapper's metadata is set as PyTorch sets a wrapper subclass's for an
    in-place view operator (``return_and_correct_aliasing``): its meta kernel
    runs on the wrapper, with dispatch off. That works within the storage the
    wrapper was made with; a tensor that grew past it is put back as it was, unless that storage
    was empty (the ``at::empty({0})`` that a composite hands an out= operator): then the wrapper
    takes a storage of the new size, as CUDA's resize does, and no view of the old one can tell,
    since it held no element.
    """
    empty = wrapper.untyped_storage().nbytes() == 0
    with torch.utils._mode_utils.no_dispatch():
        meta = torch._C._meta_in_tls_dispatch_include()
        torch._C._set_meta_in_tls_dispatch_include(True)
        try:
            if empty:
                torch.ops.aten.set_.source_Storage_storage_offset(
                    wrapper,
                    SimTensor(values, wrapper.device).untyped_storage(),
                    values.storage_offset(),
                    values.size(),
                    values.stride(),
                )
            else:
                torch.ops.aten.as_strided_.default(
                    wrapper, values.size(), values.stride(), values.storage_offset()
                )
            return
        except RuntimeError:
            pass
        finally:
            torch._C._set_meta_in_tls_dispatch_include(meta)
    values.as_strided_(wrapper.size(), wrapper.stride(), wrapper.storage_offset())
    raise NotImplementedError(
        f"the simulated device cannot run {func} here: it would grow the tensor past the memory it"
        " was made with, and a tensor on the simulated device cannot grow in place (a limit of the"
        " simulated device); create a new tensor instead"
    )
