"""Claims of the notebooks that a line-by-line audit found false, each checked against PyTorch 2.13.

Each test checks the fact itself (in PyTorch, or in the installed library's source) and that the solution
notebook says it that way: the false wording is gone, and where a CPU can show the fact, a cell shows it and
its stored output says so. The cells' outputs stay current through nbval (``tests/test_pipeline.py``).
"""

from __future__ import annotations

import inspect
import json
import re
from functools import cache

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from autograder.course.paths import assignments, solution_path


@cache
def cells(name: str) -> list[dict]:
    return json.loads(solution_path(name).read_text())["cells"]


def source(cell: dict) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def markdown(name: str) -> str:
    return "\n".join(source(c) for c in cells(name) if c["cell_type"] == "markdown")


def code_cell(name: str, needle: str) -> dict:
    found = [c for c in cells(name) if c["cell_type"] == "code" and needle in source(c)]
    assert len(found) == 1, f"{name}: {len(found)} code cells hold {needle!r}, expected one"
    return found[0]


def output_text(cell: dict) -> str:
    parts = []
    for output in cell.get("outputs", []):
        if output["output_type"] == "stream":
            parts.append("".join(output["text"]))
        elif output["output_type"] == "error":
            parts.append(f"{output['ename']}: {output['evalue']}")
        else:
            parts.append("".join(output.get("data", {}).get("text/plain", "")))
    return "\n".join(parts)


def one_line(text: str) -> str:
    return re.sub(r"\s+", " ", text)


_SECTION_REF = re.compile(r"\b[Ss]ections? (\d+[a-z]?)((?:(?:, | and | or )\d+[a-z]?)*)")
_HEADING = re.compile(r"^#{2,3} (\d+[a-z]?)\.", re.M)


@pytest.mark.parametrize("name", assignments())
def test_section_references_name_sections_the_notebook_has(name):
    """Every "section N" of a notebook names one of its own numbered headings (09 named 3 and 4 of 1-3)."""
    headings = {m.group(1) for m in _HEADING.finditer(markdown(name))}
    text = "\n".join(source(c) for c in cells(name))
    missing = []
    for match in _SECTION_REF.finditer(text):
        before = text[max(0, match.start() - 30):match.start()]
        if re.search(r"notebook \d\d\W*$|notebook \d\d's $", before):
            continue  # a section of another notebook
        numbers = [match.group(1), *re.findall(r"\d+[a-z]?", match.group(2))]
        missing += [f"section {n} ({one_line(match.group(0))})" for n in numbers if n not in headings]
    assert not missing, f"{name} refers to sections it does not have: {missing}; its headings: {sorted(headings)}"


class _Ops(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def _linear_ops(bias: bool) -> list[str]:
    layer = nn.Linear(3, 4, bias=bias)
    with torch.no_grad(), _Ops() as ops:
        layer(torch.ones(5, 3))
    return ops.names


def test_02_only_a_linear_layer_with_a_bias_runs_addmm():
    """nn.Linear runs addmm with a bias and mm without one; 02 says so, and shows the mm error."""
    assert "addmm" in _linear_ops(bias=True)
    assert "mm" in _linear_ops(bias=False) and "addmm" not in _linear_ops(bias=False)
    text = one_line(markdown("02_cross_device_errors"))
    assert "every `nn.Linear` runs" not in text, "02 still says every nn.Linear runs addmm"
    assert "with a bias runs" in text
    shown = code_cell("02_cross_device_errors", "bias=False")
    assert "raises-exception" in shown["metadata"].get("tags", [])
    assert re.search(r"wrapper_(SIM|CUDA)_mm\)", output_text(shown)), output_text(shown)


def test_06_a_check_for_inf_or_nan_needs_no_unscale():
    """Dividing by the scale neither makes nor removes inf and NaN; 06 no longer says a NaN check needs unscale_."""
    model = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**16)
    scaler.scale(model(torch.ones(4, 3)).sum()).backward()
    model.weight.grad[0, 0], model.weight.grad[1, 1] = float("inf"), float("nan")
    before = [p.grad.isfinite().clone() for p in model.parameters()]
    scaler.unscale_(optimizer)
    assert all(torch.equal(b, p.grad.isfinite()) for b, p in zip(before, model.parameters()))
    text = one_line(markdown("06_mixed_precision"))
    assert "checking them for NaN) needs `unscale_`" not in text
    shown = output_text(code_cell("06_mixed_precision", "overflowed_scaler.unscale_("))
    assert "finite before unscale_: [False, True]" in shown and "finite after unscale_:  [False, True]" in shown, shown


def test_06_names_the_sources_it_relies_on():
    """The .item() list is the Performance Tuning Guide's, not the CUDA notes'; the CUDA backward failure was
    measured on PyTorch 2.11 only, and 06 says so."""
    text = one_line(markdown("06_mixed_precision"))
    assert "CUDA notes list `.item()`" not in text
    assert "`.item()`, `.tolist()`, `print`, a copy to the CPU" not in text
    assert text.count("Performance Tuning Guide") >= 2
    sentence = next(s for s in text.split(". ") if "161129" in s)
    assert "2.11" in sentence, sentence


def test_07_ddp_syncs_buffers_by_default_with_none():
    """DDP 2.13 declares broadcast_buffers=None (deprecated) and forward_sync_buffers=None; 07 says so."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    defaults = {name: p.default for name, p in inspect.signature(DDP).parameters.items() if name.endswith("_buffers")}
    assert defaults == {"broadcast_buffers": None, "forward_sync_buffers": None}, defaults
    text = one_line(markdown("07_multi_device_training"))
    assert "`broadcast_buffers=True`, the default" not in text
    shown = output_text(code_cell("07_multi_device_training", "inspect.signature(DDP)"))
    assert "'broadcast_buffers': None" in shown and "'forward_sync_buffers': None" in shown, shown


def test_07_distributed_sampler_repeats_samples_when_the_data_does_not_split():
    """DistributedSampler pads by repeating samples; 07 no longer calls the shares disjoint without a condition."""
    from torch.utils.data import DistributedSampler

    shares = [list(DistributedSampler(range(5), num_replicas=2, rank=r, shuffle=False)) for r in (0, 1)]
    assert shares == [[0, 2, 4], [1, 3, 0]], shares
    text = one_line("\n".join(source(c) for c in cells("07_multi_device_training")))
    assert "deals each rank a disjoint share," not in text
    assert "gives the two ranks disjoint shares that" not in text
    shown = output_text(code_cell("07_multi_device_training", "five = TensorDataset"))
    assert "[[0, 2, 4], [1, 3, 0]]" in shown, shown


def test_08_export_keeps_the_factory_call_not_its_result():
    """An exported program calls torch.ones again on every run, with the export's device as a constant."""
    from torch.export import export

    class AddsNoise(nn.Module):
        def forward(self, x):
            return x + torch.randn(x.shape, device=x.device)

    program = export(AddsNoise(), (torch.zeros(2, 3),))
    nodes = [n for n in program.graph.nodes if n.op == "call_function" and "device" in n.kwargs]
    assert [str(n.kwargs["device"]) for n in nodes] == ["cpu"]
    run = program.module()
    assert not torch.equal(run(torch.zeros(2, 3)), run(torch.zeros(2, 3))), "the call runs on every run"
    text = one_line(markdown("08_portable_models_and_memory"))
    assert "That line is not run again later; its result is written into the graph" not in text
    assert "two calls, two results: True" in output_text(code_cell("08_portable_models_and_memory", "AddsNoise"))


def test_09_save_file_copies_tensors_of_other_devices_itself():
    """safetensors' save_file moves any non-CPU tensor to the CPU itself; 09 says what stops it on the simulated
    device instead of saying it refuses devices it copies."""
    from safetensors import torch as safetensors_torch

    assert 'tensor.to("cpu")' in inspect.getsource(safetensors_torch._to_ndarray)
    assert "storage_ptr" in inspect.getsource(safetensors_torch._find_shared_tensors)
    text = one_line(markdown("09_sharded_checkpoints"))
    assert "accepts tensors on the accelerators safetensors knows" not in text
    assert "finds no memory to read" not in text
    shown = output_text(code_cell("09_sharded_checkpoints", "def save_file_steps"))
    if "_find_shared_tensors" in shown:  # the stored output of a machine without a GPU
        assert "_to_ndarray" in shown, shown
