"""The map_location explorer: load a checkpoint saved on one device with any map_location.

:func:`explore` returns plain text (what nbval compares); :func:`map_location_explorer` wraps it in
ipywidgets. The checkpoints are :func:`~devcourse.checkpoints.make_checkpoint` fixtures kept in
memory, so on a CPU-only machine one "saved on cuda:1" loads with the same result or error a real
one would. Introduced in 04_map_location.
"""

from __future__ import annotations

import io
import tempfile
from pathlib import Path

import torch

from devcourse.checkpoints import SAVED_ON, make_checkpoint
from devcourse.devices import best_device


def _keep_storage(storage, location):  # the classic callable: keep each storage where it was loaded
    return storage


# Label shown in the picker -> a function giving the map_location to use.
MAP_LOCATIONS = {
    "None": lambda: None,
    "'cpu'": lambda: "cpu",
    "torch.device('cpu')": lambda: torch.device("cpu"),
    "{'cuda:1': 'cpu'}": lambda: {"cuda:1": "cpu"},
    "{'cuda:0': 'cpu'}": lambda: {"cuda:0": "cpu"},
    "lambda storage, location: storage": lambda: _keep_storage,
    "'meta'": lambda: "meta",
    "best_device()": best_device,
}

_fixtures: dict[str, bytes] = {}


def fixture_bytes(saved_on: str) -> bytes:
    """The file of a TinyNet checkpoint saved on ``saved_on`` (one of ``SAVED_ON``), made on first
    use."""
    if saved_on not in SAVED_ON:
        raise ValueError(f"saved_on must be one of {SAVED_ON}, not {saved_on!r}")
    if saved_on not in _fixtures:
        with tempfile.TemporaryDirectory(prefix="map-location-") as folder:
            path = Path(folder) / f"saved_on_{saved_on.replace(':', '')}.pt"
            make_checkpoint(path, saved_on=saved_on)
            _fixtures[saved_on] = path.read_bytes()
    return _fixtures[saved_on]


def explore(saved_on: str, choice: str) -> str:
    """Load the fixture saved on ``saved_on`` with the map_location labelled ``choice``.

    Returns the call, then each tensor's name, device and dtype, or the
    exception's type and message exactly as ``torch.load`` raised it. For the
    callable form it also lists the ``location`` strings the callable received.
    """
    if choice not in MAP_LOCATIONS:
        raise ValueError(f"choice must be one of {list(MAP_LOCATIONS)}, not {choice!r}")
    map_location = MAP_LOCATIONS[choice]()
    seen: list[str] = []
    if callable(map_location) and not isinstance(map_location, torch.device):
        user_function = map_location

        def map_location(storage, location):
            seen.append(location)
            return user_function(storage, location)

    lines = [f"torch.load(<saved on {saved_on}>, map_location={choice}, weights_only=True)"]
    try:
        state = torch.load(
            io.BytesIO(fixture_bytes(saved_on)), map_location=map_location, weights_only=True
        )
    except Exception as exc:  # noqa: BLE001 - the explorer shows the error instead of raising it
        lines.append(f"  {type(exc).__name__}: {exc}")
        return "\n".join(lines)
    if seen:
        lines.append(f"  the callable received location={sorted(set(seen))}")
    width = max(len(key) for key in state)
    lines += [f"  {key.ljust(width)}  {str(t.device):6}  {t.dtype}" for key, t in state.items()]
    return "\n".join(lines)


def map_location_explorer():
    """An ipywidgets panel: pick where the checkpoint was saved and a map_location, see the result.

    The result updates as soon as either choice changes. The kernel may start on
    a second change before the first one's result is shown, so a result is shown
    only if the choices it was computed for are still the current ones.
    """
    import threading
    from html import escape

    import ipywidgets as widgets

    saved_on = widgets.Dropdown(options=list(SAVED_ON), value="cuda:1", description="Saved on")
    choice = widgets.Dropdown(
        options=list(MAP_LOCATIONS),
        value="None",
        description="map_location",
        layout=widgets.Layout(width="28em"),
        style={"description_width": "initial"},
    )
    result = widgets.HTML()
    showing = threading.Lock()

    def update(_change: object = None) -> None:
        while True:
            wanted = (saved_on.value, choice.value)
            text = explore(*wanted)
            with showing:
                if (saved_on.value, choice.value) == wanted:
                    result.value = f"<pre>{escape(text)}</pre>"
                    return

    saved_on.observe(update, names="value")
    choice.observe(update, names="value")
    update()
    return widgets.VBox([widgets.HBox([saved_on, choice]), result])
