"""Operators whose path depends on the device, on the simulated device: run whole on the CPU values.

The recurrent layers and ``scaled_dot_product_attention`` are composites that pick other parts,
rounding differently, off the CPU; :func:`register` runs each as one piece on the CPU values (under
an autograd function whose backward is PyTorch's own CPU one), so forward and gradients equal the
CPU's bit for bit.
"""

from __future__ import annotations

import torch
import torch.utils._pytree as pytree

from simdevice._tensor import SimTensor

OPERATORS = (
    "lstm.input",
    "lstm.data",
    "gru.input",
    "gru.data",
    "rnn_tanh.input",
    "rnn_tanh.data",
    "rnn_relu.input",
    "rnn_relu.data",
    "lstm_cell",
    "gru_cell",
    "rnn_tanh_cell",
    "rnn_relu_cell",
    "scaled_dot_product_attention",
)
_COMPOSITE = torch._C.DispatchKey.CompositeImplicitAutograd


class _OnCpu(torch.autograd.Function):
    """Runs ``op`` on the CPU values of its arguments, keeping the CPU's autograd graph for the
    backward."""

    @staticmethod
    def forward(ctx, op, spec, device, results, *flat):
        inputs = [
            t._values.detach().requires_grad_(t.requires_grad) if type(t) is SimTensor else t
            for t in flat
        ]
        args, kwargs = pytree.tree_unflatten(inputs, spec)
        with torch.enable_grad():
            out = op(*args, **kwargs)
        outputs, results["spec"] = pytree.tree_flatten(out)
        ctx.inputs, ctx.outputs, ctx.device = inputs, outputs, device
        return tuple(SimTensor(o.detach(), device) for o in outputs)

    @staticmethod
    def backward(ctx, *grads):
        pairs = [
            (o, g._values) for o, g in zip(ctx.outputs, grads) if g is not None and o.requires_grad
        ]
        leaves = [
            i for i, t in enumerate(ctx.inputs) if isinstance(t, torch.Tensor) and t.requires_grad
        ]
        found = [None] * len(leaves)
        if pairs:
            found = torch.autograd.grad(
                [o for o, _ in pairs],
                [ctx.inputs[i] for i in leaves],
                [g for _, g in pairs],
                allow_unused=True,
            )
        result = [None] * len(ctx.inputs)
        for i, grad in zip(leaves, found):
            result[i] = None if grad is None else SimTensor(grad, ctx.device)
        return (None, None, None, None, *result)


def _kernel(op):
    # .data forms: batch sizes stay on the CPU
    packed = op._schema.arguments[1].name == "batch_sizes"

    def kernel(*args, **kwargs):
        flat, spec = pytree.tree_flatten((args, kwargs))
        tensors = [
            t for i, t in enumerate(flat) if isinstance(t, torch.Tensor) and not (packed and i == 1)
        ]
        device = tensors[0].device
        if any(type(t) is not SimTensor or t.device != device for t in tensors):
            return op._op_dk(_COMPOSITE, *args, **kwargs)
        results: dict = {}
        out = _OnCpu.apply(op, spec, device, results, *flat)
        return pytree.tree_unflatten(list(out), results["spec"])

    return kernel


def _encoder_on_cpu(original):
    def forward(self, src, mask=None, src_key_padding_mask=None, is_causal=None):
        tensors = [src, mask, src_key_padding_mask, *self.parameters(), *self.buffers()]
        tensors = [t for t in tensors if t is not None]
        on_one_device = type(src) is SimTensor and all(
            type(t) is SimTensor and t.device == src.device for t in tensors
        )
        wants_grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
        if src_key_padding_mask is None or not on_one_device or wants_grad:
            return original(self, src, mask, src_key_padding_mask, is_causal)
        state = {name: t._values for name, t in (*self.named_parameters(), *self.named_buffers())}
        values = (None if t is None else t._values for t in (mask, src_key_padding_mask))
        out = torch.func.functional_call(self, state, (src._values, *values, is_causal))
        return SimTensor(out, src.device)

    forward.__doc__, forward.__wrapped__ = original.__doc__, original
    return forward


def register() -> torch.library.Library:
    """Register the kernels, and the encoder's path; the kernels last as long as the returned
    library does.

    ``torch.lstm``, ``gru``, ``rnn_tanh``/``rnn_relu`` (plain and packed) and their cells pick their
    parts by the input's device (``aten/src/ATen/native/RNN.cpp``): off the CPU the fused cells CUDA
    ships, which the CPU lacks. ``scaled_dot_product_attention`` runs a fused kernel on the CPU and
    its math fallback elsewhere. Tensors on two devices run the composite instead, whose parts raise
    the same-device error. ``nn.TransformerEncoder`` in inference with a padding mask packs a nested
    tensor (its fast path), which a tensor subclass cannot hold: with everything on one simulated
    device and no gradient wanted it runs on the CPU values (``torch.func.functional_call``).
    """
    encoder = torch.nn.TransformerEncoder
    if not hasattr(encoder.forward, "__wrapped__"):
        encoder.forward = _encoder_on_cpu(encoder.forward)
    library = torch.library.Library("aten", "IMPL")
    for name in OPERATORS:
        packet, _, overload = name.partition(".")
        op = getattr(getattr(torch.ops.aten, packet), overload or "default")
        library.impl(name, _kernel(op), "AutogradPrivateUse1")
    return library
