"""What every part of the simulated device needs to know: its name, how many devices are on, and valid indices."""

from __future__ import annotations

import torch

NAME = "sim"
state: dict[str, object] = {"enabled": False, "count": 0}


def resolve(device: torch.device | str | int | None) -> torch.device:
    """``sim``, ``sim:N``, ``N`` or None as an indexed simulated device; an index past the count raises."""
    if device is None:
        index = 0
    elif isinstance(device, int):
        index = device
    else:
        device = torch.device(device)
        if device.type != NAME:
            raise ValueError(f"expected a {NAME} device, got {device}")
        index = 0 if device.index is None else device.index
    count = state["count"]
    if not 0 <= index < count:
        have = "no simulated devices are turned on" if count == 0 else (
            f"{count} simulated device{'s' if count != 1 else ''} turned on "
            f"({', '.join(f'{NAME}:{i}' for i in range(count))})"
        )
        raise RuntimeError(f"{NAME.upper()} error: invalid device ordinal: {NAME}:{index} was asked for, but {have}")
    return torch.device(NAME, index)
