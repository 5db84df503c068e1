"""Claims of the notebooks that a line-by-line audit found false, each checked against PyTorch 2.13.

Each test checks the fact itself (in PyTorch, or in the installed library's source) and that the
solution notebook says it that way: the false wording is gone, and where a CPU can show the fact, a
cell shows it and its stored output says so. The cells' outputs stay current through nbval
(``tests/test_pipeline.py``).
"""

from __future__ import annotations

import inspect
import json
import re
from functools import cache
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from devcourse.instructor.paths import assignments, solution_path


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
    """Every "section N" of a notebook names one of its own numbered headings (09 named 3 and 4 of
    1-3)."""
    headings = {m.group(1) for m in _HEADING.finditer(markdown(name))}
    text = "\n".join(source(c) for c in cells(name))
    missing = []
    for match in _SECTION_REF.finditer(text):
        before = text[max(0, match.start() - 30) : match.start()]
        if re.search(r"notebook \d\d\W*$|notebook \d\d's $", before):
            continue  # a section of another notebook
        numbers = [match.group(1), *re.findall(r"\d+[a-z]?", match.group(2))]
        missing += [
            f"section {n} ({one_line(match.group(0))})" for n in numbers if n not in headings
        ]
    assert not missing, (
        f"{name} refers to sections it does not have: {missing}; its headings: {sorted(headings)}"
    )


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
    """Dividing by the scale neither makes nor removes inf and NaN; 06 no longer says a NaN check
    needs unscale_."""
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
    assert (
        "finite before unscale_: [False, True]" in shown
        and "finite after unscale_:  [False, True]" in shown
    ), shown


def test_06_names_the_sources_it_relies_on():
    """The .item() list is the Performance Tuning Guide's, not the CUDA notes'; the CUDA backward
    failure was measured on PyTorch 2.11 only, and 06 says so."""
    text = one_line(markdown("06_mixed_precision"))
    assert "CUDA notes list `.item()`" not in text
    assert "`.item()`, `.tolist()`, `print`, a copy to the CPU" not in text
    assert text.count("Performance Tuning Guide") >= 2
    sentence = next(s for s in text.split(". ") if "161129" in s)
    assert "2.11" in sentence, sentence


def test_07_ddp_syncs_buffers_by_default_with_none():
    """DDP 2.13 declares broadcast_buffers=None (deprecated) and forward_sync_buffers=None; 07 says
    so."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    defaults = {
        name: p.default
        for name, p in inspect.signature(DDP).parameters.items()
        if name.endswith("_buffers")
    }
    assert defaults == {"broadcast_buffers": None, "forward_sync_buffers": None}, defaults
    text = one_line(markdown("07_multi_device_training"))
    assert "`broadcast_buffers=True`, the default" not in text
    shown = output_text(code_cell("07_multi_device_training", "inspect.signature(DDP)"))
    assert "'broadcast_buffers': None" in shown and "'forward_sync_buffers': None" in shown, shown


def test_07_distributed_sampler_repeats_samples_when_the_data_does_not_split():
    """DistributedSampler pads by repeating samples; 07 no longer calls the shares disjoint without
    a condition."""
    from torch.utils.data import DistributedSampler

    shares = [
        list(DistributedSampler(range(5), num_replicas=2, rank=r, shuffle=False)) for r in (0, 1)
    ]
    assert shares == [[0, 2, 4], [1, 3, 0]], shares
    text = one_line("\n".join(source(c) for c in cells("07_multi_device_training")))
    assert "deals each rank a disjoint share," not in text
    assert "gives the two ranks disjoint shares that" not in text
    shown = output_text(code_cell("07_multi_device_training", "five = TensorDataset"))
    assert "[[0, 2, 4], [1, 3, 0]]" in shown, shown


def test_08_export_keeps_the_factory_call_not_its_result():
    """An exported program calls torch.ones again on every run, with the export's device as a
    constant."""
    from torch.export import export

    class AddsNoise(nn.Module):
        def forward(self, x):
            return x + torch.randn(x.shape, device=x.device)

    program = export(AddsNoise(), (torch.zeros(2, 3),))
    nodes = [n for n in program.graph.nodes if n.op == "call_function" and "device" in n.kwargs]
    assert [str(n.kwargs["device"]) for n in nodes] == ["cpu"]
    run = program.module()
    assert not torch.equal(run(torch.zeros(2, 3)), run(torch.zeros(2, 3))), (
        "the call runs on every run"
    )
    text = one_line(markdown("08_portable_models_and_memory"))
    assert "That line is not run again later; its result is written into the graph" not in text
    assert "two calls, two results: True" in output_text(
        code_cell("08_portable_models_and_memory", "AddsNoise")
    )


def test_09_save_file_copies_tensors_of_other_devices_itself():
    """safetensors' save_file moves any non-CPU tensor to the CPU itself; 09 says what stops it on
    the simulated device instead of saying it refuses devices it copies."""
    from safetensors import torch as safetensors_torch

    assert 'tensor.to("cpu")' in inspect.getsource(safetensors_torch._to_ndarray)
    assert "storage_ptr" in inspect.getsource(safetensors_torch._find_shared_tensors)
    text = one_line(markdown("09_sharded_checkpoints"))
    assert "accepts tensors on the accelerators safetensors knows" not in text
    assert "finds no memory to read" not in text
    shown = output_text(code_cell("09_sharded_checkpoints", "def save_file_steps"))
    if "_find_shared_tensors" in shown:  # the stored output of a machine without a GPU
        assert "_to_ndarray" in shown, shown


ASIDE = "> **Behind the scenes"


def main_line(name: str) -> str:
    """A notebook's markdown less its "behind the scenes" asides, on one line."""
    return one_line(
        "\n".join(
            source(c)
            for c in cells(name)
            if c["cell_type"] == "markdown" and not source(c).startswith(ASIDE)
        )
    )


def asides(name: str) -> str:
    return one_line("\n".join(source(c) for c in cells(name) if source(c).startswith(ASIDE)))


def test_01_the_matrix_adds_no_simulated_device_beside_one_gpu():
    """With one GPU the matrix is the CPU and that GPU (``devcourse/grading.py:device_matrix``); 01
    says so and shows it with the course's stand-in for a GPU machine."""
    from devcourse.grading import device_matrix, simulated_cuda

    with simulated_cuda(1):
        assert [str(d.device) for d in device_matrix()] == ["cpu", "cuda:0"]
    text = main_line("01_device_placement")
    assert "with the simulated devices added when it has only one" not in text
    assert "never added beside a GPU" in text
    shown = output_text(code_cell("01_device_placement", "with simulated_cuda(count)"))
    assert (
        "1 GPU:  ['cpu', 'cuda:0']" in shown and "2 GPUs: ['cpu', 'cuda:0', 'cuda:1']" in shown
    ), shown


def test_06_float16_overflows_from_65520_not_past_65504():
    """A cast rounds to the nearest float16: below 65520 to 65504, from 65520 (halfway to 65536) to
    inf."""
    assert torch.tensor([65519.0, 65520.0]).half().tolist() == [65504.0, float("inf")]
    text = main_line("06_mixed_precision")
    assert "Past 65504 a value becomes" not in text and "overflows past 65504" not in text
    assert "65520" in text.split("## Summary")[1], "06's summary still gives the wrong boundary"
    shown = output_text(code_cell("06_mixed_precision", "(65504.0, 65519.0, 65520.0)"))
    assert "65519.0 -> 65504.0" in shown and "65520.0 -> inf" in shown, shown


def test_07_exercise_2_checks_shares_that_overlap_too():
    """With 11 samples for 2 ranks, DistributedSampler repeats one; 07 no longer says Exercise 2
    checks that the shares never overlap, and Exercise 2's hidden checks do expect the repeat."""
    from torch.utils.data import DistributedSampler

    shares = [set(DistributedSampler(range(11), num_replicas=2, rank=r)) for r in (0, 1)]
    assert len(shares[0] & shares[1]) == 1
    assert "checks that the shares never overlap" not in main_line("07_multi_device_training")
    assert "padding repeats exactly one sample" in source(
        code_cell("07_multi_device_training", "def loader_cases")
    )


def test_09_fsdp2_gathers_a_block_ahead_so_two_can_be_whole():
    """FSDP2 prefetches. Read in ``torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py``
    (PyTorch 2.13): ``FSDPParamGroup._backward_prefetch``, run from ``pre_backward`` once the block
    is gathered, calls ``_prefetch_unshard`` on the block before it in forward order;
    ``FSDPCommContext.lazy_init`` makes an all-gather stream to overlap "next all-gather with
    current forward compute" (implicit forward prefetching);
    ``FSDPModule.set_modules_to_forward_prefetch`` and ``set_modules_to_backward_prefetch``
    (``_fully_shard.py``) ask for more, "more reserved memory". 09 says so, and a cell shows two
    blocks whole in the backward pass."""
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as group

    assert 'self._prefetch_unshard(target, "backward")' in inspect.getsource(
        group.FSDPParamGroup._backward_prefetch
    )
    assert "_backward_prefetch()" in inspect.getsource(group.FSDPParamGroup.pre_backward)
    assert "overlapping next all-gather" in inspect.getsource(group.FSDPCommContext.lazy_init)
    assert "more reserved memory" in inspect.getdoc(FSDPModule.set_modules_to_forward_prefetch)
    text = one_line("\n".join(source(c) for c in cells("09_sharded_checkpoints")))
    assert "only one block's full weights exist at a time" not in text
    assert "only one child's full weights in memory at a time" not in text
    assert "up to two blocks are whole at once" in text
    shown = output_text(code_cell("09_sharded_checkpoints", "def fsdp_order"))
    assert "most blocks whole at once: forward 1, backward 2" in shown, shown


def test_internals_sit_in_asides_and_the_terms_that_stay_are_defined():
    """02's TensorIterator, 06's autocast kernels, 07's rendezvous and gloo threads, 08's C library
    allocator are told in "behind the scenes" asides; the main line defines the caching allocator it
    keeps."""
    moved = {
        "02_cross_device_errors": ["TensorIterator", "native_functions.yaml", "adaption"],
        "06_mixed_precision": ["AutocastPrivateUse1", "161129"],
        "07_multi_device_training": ["TCPStore", "register_backend", "ProcessGroupGloo", "#179291"],
        "08_portable_models_and_memory": ["posix_memalign", "M_MMAP_THRESHOLD"],
    }
    for name, terms in moved.items():
        assert [t for t in terms if t in main_line(name)] == [], (
            f"{name}: internals left in the main line"
        )
        assert all(t in asides(name) for t in terms), f"{name}: {terms} not all in its asides"
    assert all(
        torch._C._dispatch_has_kernel_for_dispatch_key("aten::mm", k)
        for k in ("AutocastCPU", "AutocastCUDA")
    )
    import torchgen

    table = (
        Path(torchgen.__file__).parent / "packaged/ATen/native/native_functions.yaml"
    ).read_text()
    marks = (
        table.count("device_check: NoCheck"),
        table.count("device_check: NoCheck   # TensorIterator"),
    )
    assert marks == (878, 504) and "504 of the 878" in asides("02_cross_device_errors"), marks
    assert "*caching allocator*" in main_line("08_portable_models_and_memory")
    assert "keeps the block in a cache" in main_line("08_portable_models_and_memory")


@pytest.mark.parametrize("name", assignments())
def test_every_test_cell_keeps_a_visible_check(name):
    """The students' version of each test cell runs something beyond imports and definitions, so an
    unanswered notebook fails it (06's time_on_device_waits_for_the_device held nothing visible)."""
    import ast

    from autograder.course.cells import is_test
    from devcourse.instructor.paths import COURSE

    notebook = json.loads((COURSE / name / f"{name}.ipynb").read_text())
    empty = []
    for cell in notebook["cells"]:
        if is_test(_Cell(cell)):
            body = ast.parse(source(cell)).body
            kinds = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef)
            if all(
                isinstance(s, kinds)
                or (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))
                for s in body
            ):
                empty.append(cell["metadata"]["nbgrader"]["grade_id"])
    assert not empty, f"{name}: test cells with nothing visible to fail: {empty}"


class _Cell(dict):
    def __getattr__(self, key):
        return self[key]


ROOT = solution_path("00_environment").parents[2]


def doc(path: str) -> str:
    return one_line((ROOT / path).read_text())


def test_the_disk_space_names_the_torch_build_it_holds_for():
    """About 2 GB holds with PyTorch's CPU-only build, which this environment has; PyPI's default
    Linux wheel brings the CUDA libraries. The README and the site's home say which."""
    assert torch.version.cuda is None, "the environment measured is the CPU-only build"
    for page in ("README.md", "docs/index.md"):
        text = doc(page)
        assert "about 2 GB of disk for the environment." not in text, page
        assert "about 2 GB with PyTorch's CPU-only build" in text, page


def test_grading_names_the_module_that_sets_one_thread():
    """``autograder/run/kernel.py`` sets OMP_NUM_THREADS for the grading kernels; ``runner.py`` does
    not."""
    assert "OMP_NUM_THREADS=" in (ROOT / "autograder/run/kernel.py").read_text()
    assert "OMP_NUM_THREADS" not in (ROOT / "autograder/run/runner.py").read_text()
    text = doc("docs/grading.md")
    sentence = text[text.index("`OMP_NUM_THREADS=1` and") :][:200]
    assert "autograder/run/kernel.py" in sentence and "runner.py" not in sentence, sentence


def test_benchmarks_detail_the_simulated_device_run_of_its_row():
    """The simulated device's section gives the figures of the run its table row holds."""
    text = doc("docs/benchmarks.md")
    row = re.search(r"<!-- benchmark:simulated_device -->(.*?)<!-- /benchmark", text).group(1)
    section = text[text.index("### The simulated device") :]
    section = section[: section.index("###", 5)]
    ratios = re.findall(r"\d+\.\d+x", row) + re.findall(r"\d+\.\d+ ms", row)
    assert ratios and all(r in section for r in ratios), (ratios, section)


def test_the_cuda_backward_failure_says_which_pytorch_it_was_seen_on():
    """pytorch/pytorch#161129 was seen with PyTorch 2.11 on an H200 (the GPU report); the pages that
    state the failure name the issue and that version."""
    for page in ("docs/simulated-device.md", "docs/gpu.md"):
        text = doc(page)
        sentence = text[text.index("CUDA backward pass") :][:400]
        assert "161129" in sentence and "2.11" in sentence, (page, sentence)


def test_cluster_page_claims_only_what_dask_documents():
    """Nothing says how many clusters run Dask; dask-jobqueue's cluster classes are what is
    known."""
    import dask_jobqueue

    assert {"SLURMCluster", "PBSCluster", "SGECluster", "LSFCluster"} <= set(dir(dask_jobqueue))
    text = doc("docs/cluster.md")
    assert "Most university clusters already run Dask" not in text
    assert "PBS" in text and "LSF" in text


def test_gpu_report_is_a_summary_with_the_run_log_beside_it():
    """The navigation's GPU report is a short summary without commit hashes; the runs' log is a page
    beside it, outside the navigation, and ``make gpu-check`` writes a run there."""
    import yaml

    from devcourse.instructor import gpucheck as gpu

    summary = (ROOT / "docs/gpu-report.md").read_text()
    assert len(summary.splitlines()) <= 80 and "gpu-log.md" in summary
    assert not re.findall(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*\d)[0-9a-f]{7,40}\b", summary)
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    pages = json.dumps(config["nav"])
    assert "gpu-report.md" in pages and "gpu-log.md" not in pages
    assert "/gpu-log.md" in config["not_in_nav"].split()
    assert gpu.GPU_REPORT.name == "gpu-log.md"
