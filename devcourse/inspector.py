"""Where each tensor of a model lives, and in what dtype, with the odd one out flagged.

:func:`tensor_rows` lists every parameter and buffer, :func:`odd_ones` names those off the model's
usual device or floating dtype, :func:`inspect_text` prints the table (what nbval compares) and
:func:`inspector_widget` shows it in JupyterLab. Works on any device, ``meta`` included, so it runs
the same on a CPU-only machine. Introduced in 02_cross_device_errors.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch
from torch import nn

FILTERS = ("all", "parameters", "buffers", "odd ones")


@dataclass(frozen=True)
class TensorRow:
    name: str
    kind: str  # "parameter" or "buffer"
    device: str
    dtype: torch.dtype
    shape: tuple[int, ...]


def tensor_rows(model: nn.Module) -> list[TensorRow]:
    """Every parameter, then every buffer, of ``model``, with qualified names."""
    rows = [
        TensorRow(n, "parameter", str(t.device), t.dtype, tuple(t.shape))
        for n, t in model.named_parameters()
    ]
    rows += [
        TensorRow(n, "buffer", str(t.device), t.dtype, tuple(t.shape))
        for n, t in model.named_buffers()
    ]
    return rows


def odd_ones(rows: list[TensorRow]) -> dict[str, str]:
    """``{name: reason}`` for each tensor off the model's most common device or floating dtype
    (integer buffers such as ``num_batches_tracked`` are never flagged for their dtype)."""
    if not rows:
        return {}
    usual_device = Counter(r.device for r in rows).most_common(1)[0][0]
    floating = [r.dtype for r in rows if r.dtype.is_floating_point]
    usual_dtype = Counter(floating).most_common(1)[0][0] if floating else None
    odd = {}
    for r in rows:
        reasons = []
        if r.device != usual_device:
            reasons.append(f"on {r.device}, the rest on {usual_device}")
        if r.dtype.is_floating_point and r.dtype != usual_dtype:
            reasons.append(
                f"{str(r.dtype).removeprefix('torch.')}, the rest"
                f" {str(usual_dtype).removeprefix('torch.')}"
            )
        if reasons:
            odd[r.name] = "; ".join(reasons)
    return odd


def _select(rows: list[TensorRow], odd: dict[str, str], show: str) -> list[TensorRow]:
    if show not in FILTERS:
        raise ValueError(f"show must be one of {FILTERS}, not {show!r}")
    if show == "parameters":
        return [r for r in rows if r.kind == "parameter"]
    if show == "buffers":
        return [r for r in rows if r.kind == "buffer"]
    if show == "odd ones":
        return [r for r in rows if r.name in odd]
    return rows


def inspect_text(model: nn.Module, show: str = "all") -> str:
    """The table as aligned text, one line per tensor, with ``<- reason`` after each odd one."""
    rows = tensor_rows(model)
    odd = odd_ones(rows)
    chosen = _select(rows, odd, show)
    if not chosen:
        return "(no tensors to show)"
    width = max(len(r.name) for r in chosen)
    lines = []
    for r in chosen:
        dtype = str(r.dtype).removeprefix("torch.")
        line = f"{r.name.ljust(width)}  {r.kind:9}  {r.device:7} {dtype:9} {str(r.shape)}"
        lines.append(line + (f"  <- {odd[r.name]}" if r.name in odd else ""))
    return "\n".join(lines)


def inspector_widget(model: nn.Module):
    """An ipywidgets panel: a filter (all, parameters, buffers, odd ones) above the table.

    The kernel may start on a second click before the first one's table is
    shown, so a table is shown only if its filter is still the one selected.
    """
    import threading
    from html import escape

    import ipywidgets as widgets

    show = widgets.ToggleButtons(options=list(FILTERS), value="all", description="Show")
    table = widgets.HTML()
    showing = threading.Lock()

    def update(_change: object = None) -> None:
        while True:
            wanted = show.value
            text = inspect_text(model, wanted)
            with showing:
                if show.value == wanted:
                    table.value = f"<pre>{escape(text)}</pre>"
                    return

    show.observe(update, names="value")
    update()
    return widgets.VBox([show, table])
