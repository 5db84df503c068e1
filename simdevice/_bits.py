"""Conjugate and negative views on the simulated device: read and written as what they stand for.

A conjugate view (``z.conj()``) or a negative one holds a bit, not other values. Inside
``__torch_dispatch__`` PyTorch leaves its Conjugate and Negative dispatch keys out, so a CPU kernel
would read and write such a view's memory as it lies: :func:`read` resolves it, :func:`plain_copies`
and :func:`after` write through it, and a copy that stands where a view should be
(``z.conj().imag``) refuses writes (:mod:`simdevice._tensor`).
"""

from __future__ import annotations

import torch

# Operators that make or read the conjugate and negative bits themselves: they get the views as they
# are.
MAKERS = frozenset(
    getattr(torch.ops.aten, name).default
    for name in (
        "_conj",
        "_neg_view",
        "resolve_conj",
        "resolve_neg",
        "conj_physical",
        "is_conj",
        "is_neg",
    )
)


_UNALIASED = "_sim_unaliased"  # set on values that are a copy where PyTorch would give a view


def marked(values: torch.Tensor) -> bool:
    """Whether ``values`` is a conjugate or negative view, or a copy standing where such a view's
    view would be."""
    return values.is_conj() or values.is_neg() or getattr(values, _UNALIASED, False)


_facts: dict[object, tuple[bool, bool, tuple[tuple[int, str], ...]]] = {}


def _facts_of(func) -> tuple[bool, bool, tuple[tuple[int, str], ...]]:
    """Whether ``func`` is a view operator, whether it keeps the bits (:func:`keeps_marks`), and
    (position, name) of each argument it writes into; read from its schema once."""
    facts = _facts.get(func)
    if facts is None:
        schema = func._schema
        view = any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns)
        keeps = func in MAKERS or (view and func is not torch.ops.aten.view_as_real.default)
        written = tuple(
            (i, a.name)
            for i, a in enumerate(schema.arguments)
            if a.alias_info is not None and a.alias_info.is_write
        )
        facts = _facts[func] = (view, keeps, written)
    return facts


def _is_view(func) -> bool:
    return _facts_of(func)[0]


def keeps_marks(func) -> bool:
    """Whether ``func`` gets conjugate and negative views as they are: it makes or reads the bits
    itself, or it is a view operator (``select``, ``transpose`` ...), whose result stays a view of
    the same memory with the same bit. ``view_as_real`` refuses such views (as PyTorch does
    everywhere): it gets a copy, whose views then refuse writes."""
    return _facts_of(func)[1]


def _written(func, args: list, kwargs: dict):
    """(container, key, value) of each argument ``func`` writes into."""
    for position, name in _facts_of(func)[2]:
        where, key = (args, position) if position < len(args) else (kwargs, name)
        if where is args or key in kwargs:
            yield where, key, where[key]


def plain_copies(func, args: list, kwargs: dict) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """For an operator that writes: each written argument that is a conjugate or negative view is
    replaced, in ``args`` and ``kwargs``, by a plain copy of what it stands for; returns the (view,
    copy) pairs for :func:`after`. Raises, in the device's words, for one that is a copy standing
    where a view should be."""
    pairs = []
    for where, key, value in _written(func, args, kwargs):
        if not (isinstance(value, torch.Tensor) and marked(value)):
            continue
        if getattr(value, _UNALIASED, False):
            raise NotImplementedError(
                f"the simulated device cannot run {func} here: it would write into a view of the"
                " real or imaginary part of a conjugate view (such as z.conj().imag), which the"
                " simulated device holds as a copy, so the write would not reach the tensor it"
                " views (a limit of the simulated device); write into the tensor itself, or into"
                " z.conj().resolve_conj()"
            )
        where[key] = read(value).clone()
        pairs.append((value, where[key]))
    return pairs


def after(func, args: tuple, out, pairs: list[tuple[torch.Tensor, torch.Tensor]]):
    """What ``func`` returns, once what it wrote into each plain copy is copied back through its
    view (the CPU's copy kernel applies the bits itself); a view operator's result made from a copy
    is marked as one."""
    if pairs:
        for view, copy in pairs:
            view.copy_(copy)
        swap = {id(copy): view for view, copy in pairs}
        out = (
            type(out)(swap.get(id(o), o) for o in out)
            if isinstance(out, (tuple, list))
            else swap.get(id(out), out)
        )
    if _is_view(func) and any(
        marked(v) and (not keeps_marks(func) or getattr(v, _UNALIASED, False))
        for v in _values_of(args)
    ):
        for result in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(result, torch.Tensor):
                setattr(result, _UNALIASED, True)
    return out


def _values_of(args: tuple):
    for value in args:
        for item in value if isinstance(value, (list, tuple)) else (value,):
            values = getattr(item, "_values", None)
            if isinstance(values, torch.Tensor):
                yield values


def read(values: torch.Tensor) -> torch.Tensor:
    """The values as an operator reads them: a conjugate or negative view resolved. Inside
    ``__torch_dispatch__`` PyTorch's Conjugate and Negative keys are left out, so a CPU kernel would
    read such a view's memory as it lies, without the conjugation or negation the view stands
    for."""
    return values.resolve_conj().resolve_neg() if marked(values) else values


class Marked:
    """The methods of a tensor on the simulated device that ask for its conjugate and negative bits:
    they answer for its values, as a CUDA tensor answers for itself (the wrapper's dispatch keys
    never carry the bits, so PyTorch's own methods would find none: ``is_conj()`` False, and
    ``resolve_conj()`` the view itself)."""

    _values: torch.Tensor

    def is_conj(self) -> bool:
        return self._values.is_conj()

    def is_neg(self) -> bool:
        return self._values.is_neg()

    def resolve_conj(self):
        # a clone reads the view: a tensor without the bit
        return self.clone() if self._values.is_conj() else self

    def resolve_neg(self):
        return self.clone() if self._values.is_neg() else self
