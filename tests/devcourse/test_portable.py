"""devcourse.portable: what exported programs and ONNX files are still tied to."""

import logging
import warnings

import pytest
import torch
from torch import nn
from torch.export import Dim, export

from devcourse import portable
from devcourse.models import TinyNet, seeded_tinynet


class CreatesOnDevice(nn.Module):
    def forward(self, x):
        return x + torch.ones(x.shape[-1], device=x.device)


def test_describe_exported_lists_weights_graph_devices_and_inputs():
    program = export(
        seeded_tinynet(0).eval(), (torch.randn(4, 8),), dynamic_shapes=({0: Dim("batch")},)
    )
    described = portable.describe_exported(program)
    assert described == {
        "weight devices": ["cpu"],
        "weight dtypes": ["float32", "int64"],
        "devices in graph": [],
        "inputs": [("x", "float32", ("dynamic", 8))],
    }


def test_describe_exported_sees_a_device_written_into_the_graph():
    described = portable.describe_exported(export(CreatesOnDevice(), (torch.randn(2, 3),)))
    assert described["devices in graph"] == ["cpu"]
    assert described["inputs"] == [("x", "float32", (2, 3))]


def test_describe_exported_reports_meta_and_half_weights():
    with torch.device("meta"):
        model = TinyNet().eval().half()
    described = portable.describe_exported(
        export(model, (torch.randn(2, 8, device="meta", dtype=torch.half),))
    )
    assert described["weight devices"] == ["meta"]
    assert described["weight dtypes"] == ["float16", "int64"]


@pytest.fixture
def onnx_files(tmp_path):
    model = seeded_tinynet(0).eval()
    dynamic, fixed_half = tmp_path / "dynamic.onnx", tmp_path / "half.onnx"
    with portable.quiet_onnx_export():
        torch.onnx.export(
            model, (torch.randn(4, 8),), dynamic, dynamic_shapes=({0: Dim("batch")},), verbose=False
        )
        torch.onnx.export(
            model.half(),
            (torch.randn(4, 8).half(),),
            fixed_half,
            verbose=False,
            external_data=False,
        )
    return dynamic, fixed_half


def test_describe_onnx_reads_types_shapes_and_side_files(onnx_files):
    dynamic, fixed_half = onnx_files
    described = portable.describe_onnx(dynamic)
    assert described["inputs"] == [("x", "float32", ("batch", 8))]
    assert described["outputs"][0][1:] == ("float32", ("batch", 4))
    assert described["weight dtypes"] == ["float32"]
    assert described["external data"] == ["dynamic.onnx.data"]
    half = portable.describe_onnx(fixed_half)
    assert half["inputs"] == [("x", "float16", (4, 8))]
    assert half["weight dtypes"] == ["float16"] and half["external data"] == []


def test_quiet_onnx_export_silences_only_its_two_messages(caplog):
    logger = logging.getLogger(portable._REGISTRY_LOGGER)
    level = logger.level
    with warnings.catch_warnings(record=True) as caught, caplog.at_level(logging.WARNING):
        warnings.simplefilter("always")
        with portable.quiet_onnx_export():
            logger.warning("torchvision is not installed. Skipping torchvision::nms")
            warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use ...", FutureWarning)
            warnings.warn("something about your model", UserWarning)
    assert [str(w.message) for w in caught] == ["something about your model"]
    assert not [r for r in caplog.records if "torchvision" in r.getMessage()]
    assert logger.level == level
