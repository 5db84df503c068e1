"""Where students' code relies on how CUDA behaves, the simulated device behaves the same way.

Parameters keep their identity through moves, errors take CUDA's forms, and
events and streams time work on the device's simulated clock. Without a GPU
here, CUDA's side of each comparison is the CPU's (values) or PyTorch's own
source (wording), named in each test.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import devcourse.simdevice as sim


@pytest.fixture(scope="module", autouse=True)
def two_devices():
    return sim.enable(2)


class _Tied(torch.nn.Module):
    """A language model's shape: the output layer shares the embedding's weight."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(7, 4)
        self.hidden = torch.nn.Linear(4, 4)
        self.decoder = torch.nn.Linear(4, 7)
        self.decoder.weight = self.embed.weight

    def forward(self, tokens):
        return self.decoder(torch.tanh(self.hidden(self.embed(tokens))))


@pytest.mark.parametrize("device", ["sim:0", "sim:1"])
def test_a_move_keeps_each_parameter_object_and_weight_ties(device):
    torch.manual_seed(0)
    model = _Tied()
    before = list(model.parameters())
    weight = model.hidden.weight
    assert model.to(device) is model
    assert model.hidden.weight is weight and weight.device == torch.device(device)
    assert isinstance(weight, torch.nn.Parameter)
    assert model.decoder.weight is model.embed.weight
    assert [p is q for p, q in zip(model.parameters(), before)] == [True] * len(before)
    model.sim(1 - torch.device(device).index).cpu().double()  # every direction (.sim() like .cuda()), a dtype
    assert model.decoder.weight is model.embed.weight and model.hidden.weight is weight
    assert weight.device.type == "cpu" and weight.dtype == torch.float64


def _train_with_optimizer_built_first(device, optimizer):
    torch.manual_seed(0)
    model = _Tied()
    opt = optimizer(model.parameters(), lr=0.1)  # built on the CPU, before the move, as tutorials often do
    model.to(device)
    tokens = torch.randint(0, 7, (5,), generator=torch.Generator().manual_seed(1))
    losses = []
    for _ in range(4):
        logits = model(tokens.to(device))
        loss = F.cross_entropy(logits, tokens.roll(1).to(device))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, model


@pytest.mark.parametrize("optimizer", [torch.optim.SGD, torch.optim.Adam], ids=lambda o: o.__name__)
def test_an_optimizer_built_before_the_move_trains_as_on_the_cpu(optimizer):
    cpu_losses, cpu_model = _train_with_optimizer_built_first("cpu", optimizer)
    losses, model = _train_with_optimizer_built_first("sim:1", optimizer)
    assert losses == cpu_losses
    assert losses[-1] < losses[0]
    assert sum(p.numel() for p in model.parameters()) == sum(p.numel() for p in cpu_model.parameters())
    for (name, p), q in zip(model.named_parameters(), cpu_model.parameters()):
        assert torch.equal(p.detach().cpu(), q.detach()), name
