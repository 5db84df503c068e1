"""Small models the notebooks save, load, wrap and move.

Introduced in 03_saving_and_loading.
"""

from __future__ import annotations

import torch
from torch import nn


class TinyNet(nn.Module):
    """Linear, BatchNorm1d, ReLU, Linear: parameters, float buffers and an int64 buffer.

    Small enough to save and load in milliseconds on any machine, yet it has
    everything a checkpoint can hold: weights, biases, running statistics and
    the int64 ``num_batches_tracked`` counter, which ``.half()`` leaves alone.
    """

    def __init__(self, in_features: int = 8, hidden: int = 16, out_features: int = 4):
        super().__init__()
        self.encoder = nn.Sequential(
            nn.Linear(in_features, hidden), nn.BatchNorm1d(hidden), nn.ReLU()
        )
        self.head = nn.Linear(hidden, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(x))


def seeded_tinynet(seed: int = 0, **sizes: int) -> TinyNet:
    """A TinyNet whose weights and running statistics depend only on ``seed``.

    It takes one training-mode step on seeded data so the BatchNorm buffers
    hold real statistics. The global random state is left as it was.
    """
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = TinyNet(**sizes)
        model.train()
        with torch.no_grad():
            model(torch.randn(32, model.encoder[0].in_features))
    return model
