"""What real training code runs, on the simulated device: recurrent layers, in-place views, the
encoder's nested path, and a clear error for what it cannot run.

Values are compared with the CPU's from the same seed, bit for bit: the
simulated device computes with PyTorch's CPU kernels, so any difference is a
bug of the device.
"""

from __future__ import annotations

import pytest
import torch
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import simdevice as sim


@pytest.fixture(scope="module", autouse=True)
def two_devices():
    return sim.enable(2)


def _train_recurrent(kind, device, packed):
    torch.manual_seed(0)
    rnn = getattr(torch.nn, kind)(4, 5, num_layers=2, bidirectional=True, dropout=0.2).to(device)
    opt = torch.optim.Adam(rnn.parameters(), lr=0.01)
    x = torch.randn(6, 3, 4, generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(3):
        inputs = x.to(device)
        if packed:
            inputs = pack_padded_sequence(inputs, torch.tensor([6, 4, 2]))
        out, _ = rnn(inputs)
        if packed:
            out = pad_packed_sequence(out)[0]
        loss = out.pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    rnn.eval()
    with torch.inference_mode():
        inferred = rnn(x.to(device))[0].cpu()
    return losses, [p.detach().cpu() for p in rnn.parameters()], inferred


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_recurrent_layers_train_and_infer_as_on_the_cpu(kind, packed):
    cpu_losses, cpu_params, cpu_inferred = _train_recurrent(kind, "cpu", packed)
    losses, params, inferred = _train_recurrent(kind, "sim:1", packed)
    assert losses == cpu_losses
    assert all(torch.equal(p, q) for p, q in zip(params, cpu_params))
    assert torch.equal(inferred, cpu_inferred)


@pytest.mark.parametrize("kind", ["LSTMCell", "GRUCell", "RNNCell"])
def test_recurrent_cells_give_the_cpus_values_and_gradients(kind):
    def run(device):
        torch.manual_seed(0)
        cell = getattr(torch.nn, kind)(3, 4).to(device)
        x = torch.randn(2, 3, generator=torch.Generator().manual_seed(1)).to(device)
        out = cell(x)
        hidden = out[0] if isinstance(out, tuple) else out
        hidden.sum().backward()
        return hidden.detach().cpu(), cell.weight_hh.grad.cpu()

    (cpu_out, cpu_grad), (out, grad) = run("cpu"), run("sim:0")
    assert torch.equal(out, cpu_out) and torch.equal(grad, cpu_grad)


def test_a_recurrent_layer_with_its_input_left_on_the_cpu_raises_cudas_message():
    with pytest.raises(
        RuntimeError, match="found input tensor at cpu and parameter tensor at sim:0"
    ):
        torch.nn.LSTM(3, 3).to("sim:0")(torch.randn(2, 1, 3))


def test_in_place_view_operators_change_the_shape_as_on_the_cpu():
    def run(device):
        x = torch.arange(24.0).reshape(2, 3, 4).to(device)
        steps = [
            lambda t: t.transpose_(0, 2),
            lambda t: t.unsqueeze_(1),
            lambda t: t.squeeze_(1),
            lambda t: t.t_() if t.dim() == 2 else t.squeeze_(),
            lambda t: t.as_strided_((3, 4), (4, 1), 2),
        ]
        seen = []
        for step in steps:
            assert step(x) is x  # in place: the same tensor back
            seen.append((tuple(x.shape), x.stride(), x.storage_offset(), x.cpu().clone()))
        y = torch.zeros(12).to(device).resize_as_(torch.empty(3, 4))
        return seen, tuple(y.shape)

    cpu_seen, cpu_resized = run("cpu")
    seen, resized = run("sim:1")
    assert resized == cpu_resized == (3, 4)
    for (shape, stride, offset, values), (cpu_shape, cpu_stride, cpu_offset, cpu_values) in zip(
        seen, cpu_seen
    ):
        assert (shape, stride, offset) == (cpu_shape, cpu_stride, cpu_offset)
        assert torch.equal(values, cpu_values)


def test_stft_gives_the_cpus_values():
    signal, window = (
        torch.randn(400, generator=torch.Generator().manual_seed(0)),
        torch.hann_window(64),
    )
    expected = torch.stft(signal, 64, window=window, return_complex=True)
    got = torch.stft(signal.to("sim:0"), 64, window=window.to("sim:0"), return_complex=True)
    assert got.device == torch.device("sim", 0) and torch.equal(got.cpu(), expected)


def test_a_transformer_encoder_in_inference_with_a_padding_mask_gives_the_cpus_values():
    """The encoder's nested-tensor fast path (``torch._nested_tensor_from_mask``) on the simulated
    device."""

    def run(device):
        torch.manual_seed(0)
        layer = torch.nn.TransformerEncoderLayer(8, 2, 16, batch_first=True)
        encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).to(device).eval()
        x = torch.randn(3, 5, 8, generator=torch.Generator().manual_seed(1))
        mask = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 4 + [True]])
        with torch.no_grad():
            out = encoder(x.to(device), src_key_padding_mask=mask.to(device))
        return out.device, out.cpu()

    with pytest.warns(UserWarning, match="nested tensors is in prototype stage"):
        cpu_device, expected = run("cpu")
    device, got = run("sim:1")
    assert device == torch.device("sim", 1) and torch.equal(got, expected)


def test_what_the_device_cannot_do_raises_an_error_naming_the_operation_and_the_device():
    x = torch.ones(3, device="sim:0")
    with pytest.raises(
        RuntimeError, match=r"data_ptr\(\) of a tensor on sim:0: .*a limit of the simulated device"
    ):
        x.data_ptr()
    with pytest.raises(
        NotImplementedError,
        match=r"cannot run aten.resize_.default here: .*a limit of the simulated",
    ):
        x.resize_(100)
    assert x.shape == (3,) and x.tolist() == [1.0, 1.0, 1.0]  # left as it was
    with pytest.raises(
        NotImplementedError,
        match=r"cannot run aten._to_sparse.default: .* \(a limit of the simulated",
    ):
        x.to_sparse()
    # a view's storage is its base's
    assert torch.ones(10, device="sim:0")[2:4].untyped_storage().nbytes() == 40


def _train_compiled(device, backend):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)).to(
        device
    )
    compiled = torch.compile(model, backend=backend)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(5, 4, generator=torch.Generator().manual_seed(1)).to(device)
    losses = []
    for _ in range(2):
        loss = compiled(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in model.parameters()]


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile_runs_with_the_values_of_the_cpu(backend):
    """The documented limit (``simdevice``'s docstring): graphs break at each operator on the
    simulated device, and the values are the eager ones, equal to the CPU's."""
    import warnings

    torch._dynamo.reset()
    cpu_losses, cpu_params = _train_compiled("cpu", backend)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Dynamo's notes on the graph breaks
        losses, params = _train_compiled("sim:1", backend)
    assert losses == cpu_losses
    assert all(torch.equal(p, q) for p, q in zip(params, cpu_params))


def test_attention_gives_the_cpus_values_and_gradients():
    """``scaled_dot_product_attention`` picks its kernel by device: the CPU's fused one, also on
    ``sim``."""

    def run(device):
        q, k, v = (
            torch.randn(2, 2, 5, 4, generator=torch.Generator().manual_seed(i))
            .to(device)
            .requires_grad_()
            for i in range(3)
        )
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.pow(2).sum().backward()
        return [t.detach().cpu() for t in (out, q.grad, k.grad, v.grad)]

    assert all(torch.equal(a, b) for a, b in zip(run("sim:1"), run("cpu")))
