"""What this machine offers PyTorch: versions, devices, and a quick test of each.

:func:`collect_facts` gathers the facts, :meth:`EnvFacts.to_text` prints them as plain text (what
nbval compares), and :func:`report_widget` shows them in JupyterLab with a button that runs a small
computation on a chosen device. On a CPU-only machine the report says so (no CUDA build or no CUDA
device) and offers only ``cpu``. Introduced in 00_environment.
"""

from __future__ import annotations

import os
import platform
import time
from dataclasses import dataclass, field

import torch

from devcourse.measure import synchronize


@dataclass(frozen=True)
class CudaDevice:
    """One CUDA device as ``torch.cuda`` describes it."""

    index: int
    name: str
    total_memory_gib: float
    capability: tuple[int, int]


@dataclass(frozen=True)
class EnvFacts:
    """Everything the course needs to know about this machine's PyTorch set-up."""

    python_version: str
    platform: str
    torch_version: str
    cuda_build: str | None  # torch.version.cuda: None for a CPU-only build
    cuda_available: bool
    device_count: int
    cuda_visible_devices: str | None  # the environment variable, None when unset
    mps_available: bool = False
    cpu_threads: int = 1
    cuda_devices: tuple[CudaDevice, ...] = field(default_factory=tuple)

    def devices(self) -> list[torch.device]:
        """Every device a tensor can live on here: ``cpu``, then each GPU."""
        found = [torch.device("cpu")]
        found += [torch.device("cuda", d.index) for d in self.cuda_devices]
        if self.mps_available:
            found.append(torch.device("mps"))
        return found

    def rows(self) -> list[tuple[str, str]]:
        """The report as ``(key, value)`` pairs, in display order."""
        rows = [
            ("python", self.python_version),
            ("platform", self.platform),
            ("torch", self.torch_version),
            ("CUDA build", self.cuda_build or "none (CPU-only build)"),
            ("CUDA available", str(self.cuda_available)),
            ("CUDA devices", str(self.device_count)),
            (
                "CUDA_VISIBLE_DEVICES",
                "unset" if self.cuda_visible_devices is None else repr(self.cuda_visible_devices),
            ),
            ("MPS available", str(self.mps_available)),
            ("CPU threads", str(self.cpu_threads)),
        ]
        for d in self.cuda_devices:
            major, minor = d.capability
            rows.append(
                (
                    f"cuda:{d.index}",
                    f"{d.name}, {d.total_memory_gib:.1f} GiB, compute capability {major}.{minor}",
                )
            )
        return rows

    def to_text(self) -> str:
        """The report as aligned ``key  value`` lines."""
        rows = self.rows()
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def collect_facts() -> EnvFacts:
    """Read this machine's facts from ``torch`` and the environment.

    On a CPU-only machine ``cuda_available`` is False, ``device_count`` 0 and
    ``cuda_devices`` empty; ``cuda_build`` is None for a CPU-only wheel.
    """
    cuda_available = torch.cuda.is_available()
    count = torch.cuda.device_count() if cuda_available else 0
    devices = []
    for i in range(count):
        props = torch.cuda.get_device_properties(i)
        devices.append(
            CudaDevice(i, props.name, props.total_memory / 2**30, (props.major, props.minor))
        )
    mps = getattr(torch.backends, "mps", None)
    return EnvFacts(
        python_version=platform.python_version(),
        platform=platform.platform(terse=True),
        torch_version=torch.__version__,
        cuda_build=torch.version.cuda,
        cuda_available=cuda_available,
        device_count=count,
        cuda_visible_devices=os.environ.get("CUDA_VISIBLE_DEVICES"),
        mps_available=bool(mps is not None and mps.is_available()),
        cpu_threads=torch.get_num_threads(),
        cuda_devices=tuple(devices),
    )


def smoke_test(device: torch.device | str, size: int = 256) -> str:
    """Multiply two ``size`` x ``size`` matrices on ``device`` and say how it went.

    Returns one line: the device, the result's device and the time taken, or
    the error the device raised. Works on ``cpu`` and ``meta`` everywhere.
    """
    device = torch.device(device)
    try:
        start = time.perf_counter()
        a = torch.randn(size, size, device=device)
        product = a @ a
        synchronize(device)
        elapsed_ms = (time.perf_counter() - start) * 1000
    except Exception as exc:  # noqa: BLE001 - the report shows any failure instead of raising it
        return f"{device}: failed with {type(exc).__name__}: {exc}"
    return f"{device}: {size}x{size} matmul ran, result on {product.device}, {elapsed_ms:.1f} ms"


def report_widget(facts: EnvFacts | None = None):
    """An ipywidgets panel: the report, a device picker and a test button.

    Clicking the button runs :func:`smoke_test` on the picked device and
    appends its line to the output. On a CPU-only machine the picker offers
    ``cpu`` alone.
    """
    import ipywidgets as widgets

    facts = facts or collect_facts()
    summary = widgets.HTML(_html_table(facts))
    picker = widgets.Dropdown(options=[str(d) for d in facts.devices()], description="Device")
    button = widgets.Button(description="Run a test", icon="play")
    output = widgets.Output()

    def run(_button: object) -> None:
        with output:
            print(smoke_test(picker.value))

    button.on_click(run)
    return widgets.VBox([summary, widgets.HBox([picker, button]), output])


def _html_table(facts: EnvFacts) -> str:
    from html import escape

    cells = "".join(
        f"<tr><th style='text-align:left'>{escape(key)}</th><td>{escape(value)}</td></tr>"
        for key, value in facts.rows()
    )
    return f"<table>{cells}</table>"
