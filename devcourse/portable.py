"""Formats that carry no device: what an exported program or an ONNX file still pins down.

:func:`describe_exported` (a ``torch.export`` program) and :func:`describe_onnx` (an ``.onnx`` file)
list the devices, dtypes and shapes each is tied to; :func:`quiet_onnx_export` silences two messages
of ``torch.onnx.export`` that say nothing about the model. All of it runs on a CPU-only machine;
nothing here needs or looks for a GPU. Introduced in 08_portable_models_and_memory.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from pathlib import Path
from typing import Iterator

import torch

# torch.onnx logs one line per torchvision operator it cannot register when
# torchvision is not installed; the course does not use torchvision.
_REGISTRY_LOGGER = "torch.onnx._internal.exporter._registration"
# PyTorch's exporter calls a pytree API that PyTorch itself deprecated.
_PYTREE_WARNING = r"`isinstance\(treespec, LeafSpec\)` is deprecated"


@contextlib.contextmanager
def quiet_onnx_export() -> Iterator[None]:
    """While active, ``torch.onnx.export`` leaves out two messages that are not about your model.

    They are the log lines saying that torchvision's operators are skipped
    (torchvision is not installed) and a ``FutureWarning`` from inside
    PyTorch's exporter about a pytree API. Every other warning and error
    still shows. Pass ``verbose=False`` to the export for its progress lines.
    Works the same on any machine.
    """
    logger = logging.getLogger(_REGISTRY_LOGGER)
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=_PYTREE_WARNING, category=FutureWarning)
            yield
    finally:
        logger.setLevel(level)


def _shape(value: object) -> tuple:
    return tuple(int(d) if str(d).isdigit() else "dynamic" for d in getattr(value, "shape", ()))


def describe_exported(program: torch.export.ExportedProgram) -> dict[str, object]:
    """What ties a ``torch.export`` program to a device, a dtype or a shape.

    Returns a dict with:

    * ``"weight devices"`` and ``"weight dtypes"``: sorted names over its
      parameters, buffers and constants;
    * ``"devices in graph"``: sorted devices written as ``device=`` arguments
      of its operations (tensors the forward pass creates);
    * ``"inputs"``: ``(name, dtype, shape)`` per user input, a dimension
      exported as dynamic shown as ``"dynamic"``.
    """
    tensors = list(program.state_dict.values()) + [
        value for value in program.constants.values() if isinstance(value, torch.Tensor)
    ]
    graph_devices = {
        str(node.kwargs["device"])
        for node in program.graph.nodes
        if node.op == "call_function" and node.kwargs.get("device") is not None
    }
    user_inputs = set(program.graph_signature.user_inputs)
    inputs = [
        (node.name, str(node.meta["val"].dtype).removeprefix("torch."), _shape(node.meta["val"]))
        for node in program.graph.nodes
        if node.op == "placeholder"
        and node.name in user_inputs
        and isinstance(node.meta.get("val"), torch.Tensor)
    ]
    return {
        "weight devices": sorted({str(t.device) for t in tensors}),
        "weight dtypes": sorted({str(t.dtype).removeprefix("torch.") for t in tensors}),
        "devices in graph": sorted(graph_devices),
        "inputs": inputs,
    }


def describe_onnx(path: str | Path) -> dict[str, object]:
    """What ties an ONNX file to a dtype or a shape (it records no device).

    Reads the file with ``onnx`` without loading weights stored outside it,
    and returns a dict with:

    * ``"inputs"`` and ``"outputs"``: ``(name, dtype, shape)``, a dynamic
      dimension shown by its name;
    * ``"weight dtypes"``: sorted dtype names of its initializers (weights);
    * ``"external data"``: sorted names of the side files that hold weights,
      which must travel with the ``.onnx`` file.
    """
    import onnx
    from onnx.helper import tensor_dtype_to_np_dtype

    model = onnx.load(str(path), load_external_data=False)

    def values(items) -> list[tuple[str, str, tuple]]:
        described = []
        for item in items:
            tensor_type = item.type.tensor_type
            shape = tuple(d.dim_param or d.dim_value for d in tensor_type.shape.dim)
            described.append(
                (item.name, str(tensor_dtype_to_np_dtype(tensor_type.elem_type)), shape)
            )
        return described

    external = {
        entry.value
        for tensor in model.graph.initializer
        for entry in tensor.external_data
        if entry.key == "location"
    }
    return {
        "inputs": values(model.graph.input),
        "outputs": values(model.graph.output),
        "weight dtypes": sorted(
            {str(tensor_dtype_to_np_dtype(t.data_type)) for t in model.graph.initializer}
        ),
        "external data": sorted(external),
    }
