"""Where CUDA takes a CPU tensor beside device tensors in an operator without a generated device
check.

:func:`error` gives what CUDA raises for such an operator (TensorIterator's rules, and the few CUDA
kernels that check CPU scalars of their own), or None; ``_devicecheck.check_devices`` raises it.
Each rule names the PyTorch source it follows, read as of the pinned torch.
"""

from __future__ import annotations

import functools

import torch

from simdevice._state import NAME

SAME_DEVICE = "Expected all tensors to be on the same device, "
TOO_MANY = "Trying to pass too many CPU scalars to non-CPU kernel!"

# Operators whose TensorIterator config sets allow_cpu_scalars: BINARY_OP_CONFIG,
# BINARY_FLOAT_OP_CONFIG and set_up_comparison_op_config (aten/src/ATen/TensorIterator.cpp,
# build_*binary_op, build_*comparison_op), used by the meta functions in native/BinaryOps.cpp,
# TensorCompare.cpp, Loss.cpp and Activation.cpp; addcmul's meta function (native/PointwiseOps.cpp,
# not addcdiv's); lerp's (native/Lerp.cpp); threshold's (Activation.cpp). In-place forms (``add_``)
# build the same config.
ALLOW_CPU_SCALAR = frozenset(
    {
        "add",
        "sub",
        "mul",
        "div",
        "remainder",
        "fmod",
        "floor_divide",
        "true_divide",
        "_add_relu",
        "pow",
        "atan2",
        "copysign",
        "hypot",
        "nextafter",
        "heaviside",
        "logaddexp",
        "logaddexp2",
        "xlogy",
        "special_xlog1py",
        "special_zeta",
        "igamma",
        "igammac",
        "gcd",
        "lcm",
        "maximum",
        "minimum",
        "fmax",
        "fmin",
        "clamp_min",
        "clamp_max",
        "bitwise_and",
        "bitwise_or",
        "bitwise_xor",
        "bitwise_left_shift",
        "bitwise_right_shift",
        "__and__",
        "__or__",
        "__xor__",
        "__lshift__",
        "__rshift__",
        "__ilshift__",
        "__irshift__",
        "eq",
        "ne",
        "lt",
        "le",
        "gt",
        "ge",
        "logical_and",
        "logical_or",
        "logical_xor",
        "special_chebyshev_polynomial_t",
        "special_chebyshev_polynomial_u",
        "special_chebyshev_polynomial_v",
        "special_chebyshev_polynomial_w",
        "special_shifted_chebyshev_polynomial_t",
        "special_shifted_chebyshev_polynomial_u",
        "special_shifted_chebyshev_polynomial_v",
        "special_shifted_chebyshev_polynomial_w",
        "special_hermite_polynomial_h",
        "special_hermite_polynomial_he",
        "special_laguerre_polynomial_l",
        "special_legendre_polynomial_p",
        "mse_loss",
        "smooth_l1_loss",
        "huber_loss",
        "sigmoid_backward",
        "tanh_backward",
        "logit_backward",
        "gelu_backward",
        "silu_backward",
        "hardsigmoid_backward",
        "threshold_backward",
        "elu_backward",
        "hardtanh_backward",
        "softplus_backward",
        "leaky_relu_backward",
        "threshold",
        "addcmul",
        "lerp",
    }
)
# Of those, operators whose CUDA kernel runs through ``gpu_kernel``
# (aten/src/ATen/native/cuda/Loops.cuh), which asserts that every operand is on the device, where
# the binary kernels' ``gpu_kernel_with_scalars`` takes a CPU scalar at either input: the losses'
# and activations' backward kernels (cuda/BinaryMiscOpsKernels.cu, BinaryMiscBackwardOpsKernels.cu,
# Activation*.cu), and lerp's for self and end (cuda/Lerp.cu takes weight).
ASSERTING = frozenset(
    {
        "mse_loss",
        "smooth_l1_loss",
        "huber_loss",
        "sigmoid_backward",
        "tanh_backward",
        "logit_backward",
        "gelu_backward",
        "silu_backward",
        "hardsigmoid_backward",
        "elu_backward",
        "hardtanh_backward",
        "softplus_backward",
        "leaky_relu_backward",
    }
)
# addcmul_cuda_kernel (cuda/PointwiseOpsKernel.cu) refuses a CPU scalar self or tensor1 in its own
# words.
_ADDCMUL = {
    1: "CPU Scalar support for self argument is not supported when calling addcmul on {} tensors.",
    2: (
        "CPU Scalar support for tensor1 argument is not supported when calling addcmul on {}"
        " tensors. However, CPU Scalar support for tensor2 is supported, please swap your tensor1"
        " and tensor2 terms."
    ),
}
# Operators that read a 0-dim ``value`` tensor on another device as a number (``value.item()``):
# fill_ (Fill.cpp), masked_fill__cuda (cuda/Indexing.cu), index_fill_ (TensorAdvancedIndexing.cpp).
VALUE_AS_NUMBER = frozenset({"fill_", "masked_fill_", "index_fill_"})
# Operators whose index tensors may stay on the CPU, as on CUDA (``x[cpu_index]``); a 0-dim value on
# any device is moved to self's device first (_index_put_impl_, native/TensorAdvancedIndexing.cpp).
INDEXING = frozenset(
    {"index", "index_put", "index_put_", "_index_put_impl_", "_unsafe_index", "_unsafe_index_put"}
)


@functools.cache
def _roles(func) -> tuple[tuple[str, bool, bool], ...]:
    """Each schema argument's name, whether the operator writes it, and whether it is an ``out=``
    argument."""
    return tuple(
        (a.name, a.alias_info is not None and a.alias_info.is_write, a.is_out)
        for a in func._schema.arguments
    )


def operands(func, args: tuple, kwargs: dict, number: str = "") -> list[tuple[torch.Tensor, bool]]:
    """``func``'s tensors as TensorIterator orders them, each with whether it is an output: written
    arguments (``out=``, an in-place self) first, then the inputs, an in-place self among them
    (``mark_outputs``). A 0-dim argument named ``number`` is left out."""
    outputs, inputs = [], []
    for position, (name, written, out) in enumerate(_roles(func)):
        value = args[position] if position < len(args) else kwargs.get(name)
        for tensor in value if isinstance(value, (list, tuple)) else (value,):
            if not isinstance(tensor, torch.Tensor) or (name == number and tensor.dim() == 0):
                continue
            if written:
                outputs.append((tensor, True))
            if not out:
                inputs.append((tensor, False))
    return outputs + inputs


def one_device(args: tuple, kwargs: dict) -> bool:
    """Whether every tensor among the arguments (in lists too) is on one simulated device, where no
    device rule can raise (an operator's own checks, a convolution's, may: the caller asks this of
    the others only)."""
    device = None
    for value in (*args, *kwargs.values()) if kwargs else args:
        for item in value if type(value) in (list, tuple) else (value,):
            if isinstance(item, torch.Tensor):
                where = item.device
                if device is None:
                    if where.type != NAME:
                        return False
                    device = where
                elif where != device:
                    return False
    return True


def _cpu_scalar(tensor: torch.Tensor) -> bool:
    return tensor.device.type == "cpu" and tensor.dim() == 0


def error(name: str, func, args: tuple, kwargs: dict) -> RuntimeError | None:
    """What CUDA raises when ``func``'s tensors are on more than one device, or None when it
    runs."""
    ops = operands(func, args, kwargs, "value" if name in VALUE_AS_NUMBER else "")
    # TensorIteratorBase::compute_types: the common device is the first operand's not on the CPU,
    # outputs first.
    common = next((t.device for t, _ in ops if t.device.type != "cpu"), None)
    if common is None:
        return None
    base = name[:-1] if name.endswith("_") and not name.endswith("__") else name
    if name in INDEXING:
        ops = _indexing(args, kwargs)
    elif base == "where" and any(not o and t.device.type != "cpu" for t, o in ops):
        # where_self_out (native/TensorCompare.cpp) moves 0-dim CPU inputs to the first input's
        # device not the CPU
        ops = [(t, output) for t, output in ops if output or not _cpu_scalar(t)]
    allowed = 1 if base in ALLOW_CPU_SCALAR else 0
    scalars = []
    for index, (tensor, output) in enumerate(ops):
        if allowed and not output and _cpu_scalar(tensor):
            if len(scalars) == allowed:
                return RuntimeError(TOO_MANY)
            scalars.append(index)
        elif tensor.device != common:
            return RuntimeError(
                f"{SAME_DEVICE}but found at least two devices, {common} and {tensor.device}!"
            )
    # a functional operator's output is TensorIterator's operand 0 too, undefined until it runs
    return _kernel_error(base, [i + (0 if ops and ops[0][1] else 1) for i in scalars])


def _indexing(args: tuple, kwargs: dict) -> list[tuple[torch.Tensor, bool]]:
    """self and values: the index tensors may stay on the CPU, and a 0-dim value may be anywhere."""
    values = (args[0], *args[2:], *kwargs.values())
    return [
        (t, False) for t in values if isinstance(t, torch.Tensor) and (t is args[0] or t.dim() > 0)
    ]


def _kernel_error(base: str, scalars: list[int]) -> RuntimeError | None:
    """The CUDA kernel's own error for the CPU scalar TensorIterator let through (its operand
    index), or None."""
    if not scalars:
        return None
    index = scalars[0]
    if base == "addcmul" and index in _ADDCMUL:
        return RuntimeError(_ADDCMUL[index].format(NAME))
    if base in ASSERTING or (base == "lerp" and index != 3):
        return RuntimeError(f"argument {index}: expected a {NAME.upper()} device but found cpu")
    return None
