import pytest
import torch
from torch import nn

from devcourse.inspector import inspect_text, inspector_widget, odd_ones, tensor_rows
from devcourse.models import TinyNet


def _split_model():
    model = TinyNet().to("meta")
    model.head.bias = nn.Parameter(torch.zeros(4))  # re-created on the CPU
    model.encoder[1].running_var = torch.ones(16, dtype=torch.float16, device="meta")
    return model


def test_rows_list_parameters_then_buffers_with_device_and_dtype():
    rows = tensor_rows(TinyNet())
    assert [r.kind for r in rows] == ["parameter"] * 6 + ["buffer"] * 3
    assert rows[-1].name == "encoder.1.num_batches_tracked" and rows[-1].dtype == torch.int64
    assert {r.device for r in rows} == {"cpu"}


def test_a_healthy_model_has_no_odd_ones_even_with_an_integer_buffer():
    assert odd_ones(tensor_rows(TinyNet())) == {}
    assert odd_ones(tensor_rows(nn.Sequential())) == {}


def test_the_odd_ones_are_named_with_their_reason():
    odd = odd_ones(tensor_rows(_split_model()))
    assert odd == {
        "head.bias": "on cpu, the rest on meta",
        "encoder.1.running_var": "float16, the rest float32",
    }


def test_text_marks_odd_ones_and_filters():
    model = _split_model()
    text = inspect_text(model)
    assert len(text.splitlines()) == 9
    assert [line.split()[0] for line in text.splitlines() if "<-" in line] == [
        "head.bias",
        "encoder.1.running_var",
    ]
    assert [line.split()[0] for line in inspect_text(model, "odd ones").splitlines()] == [
        "head.bias",
        "encoder.1.running_var",
    ]
    assert all("buffer" in line for line in inspect_text(model, "buffers").splitlines())
    assert inspect_text(nn.ReLU()) == "(no tensors to show)"
    with pytest.raises(ValueError):
        inspect_text(model, "weights")


def test_widget_table_follows_the_filter():
    panel = inspector_widget(_split_model())
    show, table = panel.children
    assert "encoder.0.weight" in table.value
    show.value = "odd ones"
    assert "encoder.0.weight" not in table.value and "head.bias" in table.value


def test_widget_shows_the_table_of_the_filter_it_ends_with(monkeypatch):
    """A second click handled while the first one's table is computed decides what stays on
    display."""
    from html import escape

    from devcourse import inspector

    model = _split_model()
    panel = inspector_widget(model)
    show, table = panel.children
    real = inspector.inspect_text

    def inspect_while_the_filter_changes(module, wanted="all"):
        text = real(module, wanted)
        if wanted == "parameters":
            show.value = "odd ones"
        return text

    monkeypatch.setattr(inspector, "inspect_text", inspect_while_the_filter_changes)
    show.value = "parameters"
    assert table.value == f"<pre>{escape(real(model, 'odd ones'))}</pre>"
