"""Operators that PyTorch implements for CUDA only, written for the simulated device.

The simulated device runs every operator with PyTorch's CPU kernel; those of ``nn.SyncBatchNorm``
have none (it refuses the CPU). Each function here takes and returns CPU tensors and follows the
CUDA kernel's contract (``aten/src/ATen/native/cuda/Normalization.cu``); they are looked up only
after the CPU kernel is found missing, so they cost other operators nothing.
"""

from __future__ import annotations

import torch

aten = torch.ops.aten


def _reduced_dims(input: torch.Tensor) -> list[int]:
    return [0, *range(2, input.dim())]  # every dimension but the channels


def _per_channel(values: torch.Tensor, input: torch.Tensor) -> torch.Tensor:
    return values.view(1, -1, *([1] * (input.dim() - 2)))


def _acc(input: torch.Tensor) -> torch.Tensor:
    return input.float() if input.dtype in (torch.float16, torch.bfloat16) else input


def batch_norm_stats(input, eps):
    x = _acc(input)
    dims = _reduced_dims(x)
    mean = x.mean(dims)
    var = x.var(dims, unbiased=False)
    return mean, (var + eps).rsqrt()


def batch_norm_gather_stats_with_counts(
    input, mean, invstd, running_mean, running_var, momentum, eps, counts
):
    counts = counts.to(mean.dtype).reshape(-1, 1)
    total = counts.sum()
    global_mean = (mean * counts).sum(0) / total
    variances = invstd.pow(-2) - eps  # each rank's biased variance
    global_var = ((variances + (mean - global_mean).pow(2)) * counts).sum(0) / total
    with torch.no_grad():
        if running_mean is not None:
            running_mean.mul_(1 - momentum).add_(global_mean.to(running_mean.dtype), alpha=momentum)
        if running_var is not None:
            unbiased = global_var * total / (total - 1)
            running_var.mul_(1 - momentum).add_(unbiased.to(running_var.dtype), alpha=momentum)
    return global_mean, (global_var + eps).rsqrt()


def batch_norm_elemt(input, weight, bias, mean, invstd, eps):
    out = (_acc(input) - _per_channel(mean, input)) * _per_channel(invstd, input)
    if weight is not None:
        out = out * _per_channel(weight, input)
    if bias is not None:
        out = out + _per_channel(bias, input)
    return out.to(input.dtype)


def batch_norm_backward_reduce(grad_out, input, mean, invstd, weight, input_g, weight_g, bias_g):
    dims = _reduced_dims(input)
    dy = _acc(grad_out)
    sum_dy = dy.sum(dims)
    sum_dy_xmu = (dy * (_acc(input) - _per_channel(mean, input))).sum(dims)
    grad_weight = (sum_dy_xmu * invstd).to(weight.dtype) if weight is not None else torch.empty(0)
    grad_bias = sum_dy.to(weight.dtype) if weight is not None else torch.empty(0)
    return sum_dy, sum_dy_xmu, grad_weight, grad_bias


def batch_norm_backward_elemt(grad_out, input, mean, invstd, weight, sum_dy, sum_dy_xmu, count):
    total = count.sum().to(sum_dy.dtype)
    mean_dy, mean_dy_xmu = sum_dy / total, sum_dy_xmu / total
    xmu = _acc(input) - _per_channel(mean, input)
    scale = (
        _per_channel(invstd, input)
        if weight is None
        else _per_channel(invstd * weight.to(invstd.dtype), input)
    )
    grad = (
        _acc(grad_out)
        - _per_channel(mean_dy, input)
        - xmu * _per_channel(invstd.pow(2) * mean_dy_xmu, input)
    ) * scale
    return grad.to(input.dtype)


def record_stream(tensor, stream):
    """Nothing to do: it keeps CUDA's caching allocator from reusing memory too early, and here
    nothing is cached."""
    return None


# Each as CUDA's: the same outputs, running statistics updated in place, statistics in float32 for
# half inputs.
KERNELS = {
    aten.record_stream.default: record_stream,
    aten.batch_norm_stats.default: batch_norm_stats,
    aten.batch_norm_gather_stats_with_counts.default: batch_norm_gather_stats_with_counts,
    aten.batch_norm_elemt.default: batch_norm_elemt,
    aten.batch_norm_backward_reduce.default: batch_norm_backward_reduce,
    aten.batch_norm_backward_elemt.default: batch_norm_backward_elemt,
}
