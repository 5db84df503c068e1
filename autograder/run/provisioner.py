"""How a grading kernel's process starts: a jupyter_client kernel provisioner, the documented seam for it.

:class:`SandboxProvisioner`, registered as ``grading-sandbox`` (an entry point in pyproject.toml) and named by the
kernel spec the runner writes (:func:`kernel_specs`), starts the kernel's command through the sandbox's launcher
(:func:`autograder.run.sandbox.wrap`), or, in a runner the zygote forked, through a launcher forked ahead.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
from pathlib import Path
from typing import Any

from jupyter_client.kernelspec import KernelSpecManager
from jupyter_client.provisioning import LocalProvisioner
from traitlets import Unicode

from autograder.run import sandbox

NAME = "grading-sandbox"
KERNEL = "grading"  # the kernel spec's name


class SandboxProvisioner(LocalProvisioner):
    """A local kernel whose process is the sandbox's launcher (then its init, then the kernel)."""

    spec_path = Unicode(help="the sandbox's settings for this kernel, as autograder.run.sandbox.Spec wrote them")

    async def pre_launch(self, **kwargs: Any) -> dict[str, Any]:
        kwargs = await super().pre_launch(**kwargs)
        kwargs["cmd"] = sandbox.wrap(kwargs["cmd"], Path(self.spec_path))
        return kwargs

    async def launch_kernel(self, cmd: list[str], **kwargs: Any):
        launchers = getattr(self.parent, "launchers", None)
        options = self._scrub_kwargs(kwargs)
        if not launchers or set(options) - {"env", "cwd", "independent"}:
            return await super().launch_kernel(cmd, **kwargs)
        env = dict(options.get("env") or os.environ)
        if not options.get("independent"):
            env["JPY_PARENT_PID"] = str(os.getpid())  # as jupyter_client's launch_kernel sets it
        self.process = launchers.pop(0).start([os.path.expanduser(part) for part in cmd], env, options.get("cwd"))
        self.pid = self.process.pid
        try:
            self.pgid = os.getpgid(self.pid)
        except OSError:
            self.pgid = None
        self.cwd = options.get("cwd") or pathlib.Path.cwd()
        return self.connection_info


def kernel_specs(folder: Path, spec_path: Path) -> KernelSpecManager:
    """A folder of kernel specs holding :data:`KERNEL`, ``python -m ipykernel_launcher`` of this Python started by
    :class:`SandboxProvisioner` with the sandbox of ``spec_path``; its manager, for a kernel manager to read."""
    spec = {"argv": [sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
            "display_name": "Python 3 (grading sandbox)", "language": "python",
            "metadata": {"kernel_provisioner": {"provisioner_name": NAME, "config": {"spec_path": str(spec_path)}}}}
    (folder / KERNEL).mkdir(parents=True, exist_ok=True)
    (folder / KERNEL / "kernel.json").write_text(json.dumps(spec))
    return KernelSpecManager(kernel_dirs=[str(folder)])
