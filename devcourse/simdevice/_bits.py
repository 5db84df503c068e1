"""Conjugate and negative views on the simulated device: read as what they stand for.

A conjugate view (``z.conj()``) or a negative one (``z.conj().imag``) holds a bit, not other values. Inside
``__torch_dispatch__`` PyTorch leaves its Conjugate and Negative dispatch keys out, so a CPU kernel handed such a
view would read its memory as it lies: :func:`read` resolves it first (:mod:`devcourse.simdevice._tensor`).
"""

from __future__ import annotations

import torch

# Operators that make or read the conjugate and negative bits themselves: they get the views as they are.
MAKERS = frozenset(getattr(torch.ops.aten, name).default for name in (
    "_conj", "_neg_view", "resolve_conj", "resolve_neg", "conj_physical", "is_conj", "is_neg"))


def marked(values: torch.Tensor) -> bool:
    """Whether ``values`` is a conjugate or negative view."""
    return values.is_conj() or values.is_neg()


def read(values: torch.Tensor) -> torch.Tensor:
    """The values as an operator reads them: a conjugate or negative view resolved. Inside ``__torch_dispatch__``
    PyTorch's Conjugate and Negative keys are left out, so a CPU kernel would read such a view's memory as it
    lies, without the conjugation or negation the view stands for."""
    return values.resolve_conj().resolve_neg() if marked(values) else values


class Marked:
    """The methods of a tensor on the simulated device that ask for its conjugate and negative bits: they answer for
    its values, as a CUDA tensor answers for itself (the wrapper's dispatch keys never carry the bits, so PyTorch's
    own methods would find none: ``is_conj()`` False, and ``resolve_conj()`` the view itself)."""

    _values: torch.Tensor

    def is_conj(self) -> bool:
        return self._values.is_conj()

    def is_neg(self) -> bool:
        return self._values.is_neg()

    def resolve_conj(self):
        return self.clone() if self._values.is_conj() else self  # a clone reads the view: a tensor without the bit

    def resolve_neg(self):
        return self.clone() if self._values.is_neg() else self
