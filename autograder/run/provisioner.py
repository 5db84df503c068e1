"""How a grading kernel's process starts: a jupyter_client kernel provisioner, the documented seam
for it.

:class:`SandboxProvisioner`, registered as ``grading-sandbox`` (an entry point in pyproject.toml)
and named by the kernel spec the runner writes (:func:`kernel_specs`), starts the kernel's command
through the sandbox's launcher (:func:`autograder.run.sandbox.wrap`), or, in a runner the zygote
forked, through a launcher forked ahead.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import threading
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.provisioning import LocalProvisioner
from traitlets import Unicode

from autograder.run import sandbox

NAME = "grading-sandbox"
KERNEL = "grading"  # the kernel spec's name
KERNEL_OUTPUT_BYTES = 1 << 20  # what a notebook's kernels may leave in their output file together


class KernelOutput:
    """Where a sandbox's standard output and error go: a pipe, copied by a thread of the runner into
    a file of its own (never the runner's log, which the grader writes), up to what is left there of
    :data:`KERNEL_OUTPUT_BYTES`; what comes past that is only counted, in a last line. What the
    grader reads of a kernel's output comes over Jupyter's messages."""

    def __init__(self, path: str):
        self.log = open(path, "ab")
        self.left = max(0, KERNEL_OUTPUT_BYTES - self.log.tell())
        self.read_end, self.write_end = os.pipe()
        self.thread = threading.Thread(target=self._copy, name="kernel-output", daemon=True)
        self.thread.start()

    def _copy(self) -> None:
        dropped = 0
        with self.log, os.fdopen(self.read_end, "rb", buffering=0) as pipe:
            while chunk := pipe.read(1 << 16):
                kept = chunk[: self.left]
                self.log.write(kept)
                self.log.flush()
                self.left -= len(kept)
                dropped += len(chunk) - len(kept)
            if dropped:
                self.log.write(
                    f"\n[{dropped} more bytes of the kernel's output not kept: at most "
                    f"{KERNEL_OUTPUT_BYTES} bytes per notebook]\n".encode()
                )

    def handed_over(self) -> None:
        """The sandbox holds the pipe's write end now: this process lets go of its own."""
        if self.write_end >= 0:
            os.close(self.write_end)
            self.write_end = -1


class SandboxProvisioner(LocalProvisioner):
    """A local kernel whose process is the sandbox's launcher (then its init, then the kernel)."""

    spec_path = Unicode(
        help="the sandbox's settings for this kernel, as autograder.run.sandbox.Spec wrote them"
    )
    output: KernelOutput | None = None

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        kwargs = await super().pre_launch(**kwargs)
        kwargs["cmd"] = sandbox.wrap(kwargs["cmd"], Path(self.spec_path))
        path = json.loads(Path(self.spec_path).read_text()).get("kernel_output")
        if path:
            self.output = KernelOutput(path)
            kwargs["stdout"] = kwargs["stderr"] = self.output.write_end
        return kwargs

    async def launch_kernel(self, cmd: list[str], **kwargs: Any):
        try:
            return await self._launch(cmd, **kwargs)
        finally:
            if self.output is not None:
                self.output.handed_over()

    async def cleanup(self, restart: bool = False) -> None:
        await super().cleanup(restart)
        # what the kernel printed last reaches its file before the runner reads it
        if self.output is not None:
            self.output.thread.join(timeout=5)

    async def _launch(self, cmd: list[str], **kwargs: Any):
        launchers = getattr(self.parent, "launchers", None)
        options = self._scrub_kwargs(kwargs)
        output = options.pop("stdout", None)
        if (
            options.pop("stderr", output) != output
            or not launchers
            or set(options) - {"env", "cwd", "independent"}
        ):
            return await super().launch_kernel(cmd, **kwargs)
        env = dict(options.get("env") or os.environ)
        if not options.get("independent"):
            env["JPY_PARENT_PID"] = str(os.getpid())  # as jupyter_client's launch_kernel sets it
        self.process = launchers.pop(0).start(
            [os.path.expanduser(part) for part in cmd], env, options.get("cwd"), output
        )
        self.pid = self.process.pid
        try:
            self.pgid = os.getpgid(self.pid)
        except OSError:
            self.pgid = None
        self.cwd = options.get("cwd") or pathlib.Path.cwd()
        return self.connection_info


def kernel_specs(folder: Path, spec_path: Path) -> KernelSpecManager:
    """A folder of kernel specs holding :data:`KERNEL`, ``python -m ipykernel_launcher`` of this
    Python started by :class:`SandboxProvisioner` with the sandbox of ``spec_path``; its manager,
    for a kernel manager to read."""
    spec = {
        "argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
        "display_name": "Python 3 (grading sandbox)",
        "language": "python",
        "metadata": {
            "kernel_provisioner": {
                "provisioner_name": NAME,
                "config": {"spec_path": str(spec_path)},
            }
        },
    }
    (folder / KERNEL).mkdir(parents=True, exist_ok=True)
    (folder / KERNEL / "kernel.json").write_text(json.dumps(spec))
    return KernelSpecManager(kernel_dirs=[str(folder)])
