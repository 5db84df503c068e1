"""``torch.autocast`` on the simulated device.

PyTorch ships no autocast kernels for PrivateUse1, so ``torch.autocast("sim")`` would change
nothing. :func:`register` adds them under ``AutocastPrivateUse1`` with CUDA's three policies for the
operators PyTorch's "Autocast Op Reference" lists for CUDA (the autocast dtype, float32, or the
inputs' widest dtype), casting only floating-point tensors on the simulated device (not float64), as
CUDA casts only those on its own device type.
"""

from __future__ import annotations

import torch

LOWER_PRECISION = (
    "addbmm addmm addmv addr baddbmm bmm chain_matmul linalg_multi_dot conv1d conv2d conv3d"
    " conv_transpose1d conv_transpose2d conv_transpose3d gru_cell linear lstm_cell matmul mm mv"
    " prelu rnn_tanh_cell rnn_relu_cell _convolution convolution"
).split()
FLOAT32 = (
    "pow acos asin binary_cross_entropy_with_logits cosh cosine_embedding_loss cdist"
    " cosine_similarity cross_entropy_loss cumprod cumsum dist erfinv exp expm1 group_norm"
    " hinge_embedding_loss kl_div l1_loss layer_norm log log_softmax log10 log1p log2"
    " margin_ranking_loss mse_loss multilabel_margin_loss multi_margin_loss nll_loss norm pdist"
    " poisson_nll_loss prod reciprocal rsqrt sinh smooth_l1_loss soft_margin_loss softmax softplus"
    " sum renorm tan triplet_margin_loss"
).split()
PROMOTE = (
    "addcdiv addcmul atan2 bilinear cross dot grid_sampler index_put scatter_add tensordot".split()
)

_KEY = torch._C.DispatchKey.AutocastPrivateUse1


def register(device_type: str) -> tuple[torch.library.Library, torch.library.Library]:
    """Register the autocast kernels for ``device_type``.

    Returns the libraries that hold them: the registrations last as long as
    these objects do.
    """
    library = torch.library.Library("aten", "IMPL")
    # Every other operator passes through autocast untouched, as on CUDA.
    passthrough = torch.library.Library("_", "IMPL")
    passthrough.fallback(torch.library.fallthrough_kernel, "AutocastPrivateUse1")

    def eligible(x) -> bool:
        return (
            isinstance(x, torch.Tensor)
            and x.device.type == device_type
            and x.is_floating_point()
            and x.dtype != torch.float64
        )

    def cast_all(value, dtype):
        if eligible(value):
            return value.to(dtype)
        if isinstance(value, (list, tuple)):
            return type(value)(cast_all(v, dtype) for v in value)
        return value

    def kernel(op, policy):
        def run(*args, **kwargs):
            if policy == "lower":
                dtype = torch.get_autocast_dtype(device_type)
            elif policy == "float32":
                dtype = torch.float32
            else:
                widths = [x.dtype for x in args if eligible(x)]
                dtype = max(widths, key=lambda d: torch.finfo(d).bits, default=None)
            with torch._C._ExcludeDispatchKeyGuard(torch._C.DispatchKeySet(_KEY)):
                if dtype is not None:
                    args, kwargs = (
                        cast_all(args, dtype),
                        {k: cast_all(v, dtype) for k, v in kwargs.items()},
                    )
                return op(*args, **kwargs)

        return run

    for policy, names in (("lower", LOWER_PRECISION), ("float32", FLOAT32), ("promote", PROMOTE)):
        for opname in names:
            packet = getattr(torch.ops.aten, opname, None)
            if packet is None:
                continue
            for overload in packet.overloads():
                op = getattr(packet, overload)
                if any(
                    a.alias_info is not None and a.alias_info.is_write for a in op._schema.arguments
                ):
                    continue  # out= and in-place forms are not autocast
                qualified = opname if overload == "default" else f"{opname}.{overload}"
                library.impl(qualified, kernel(op, policy), "AutocastPrivateUse1")
    return library, passthrough
