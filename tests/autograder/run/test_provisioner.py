"""The grading kernel's provisioner: found through its entry point, it starts the kernel through the
sandbox."""

import asyncio
import sys

from jupyter_client.manager import AsyncKernelManager

from autograder.run import sandbox
from autograder.run.provisioner import KERNEL, SandboxProvisioner, kernel_specs


def test_the_kernel_spec_names_the_provisioner_which_wraps_the_kernels_command_in_the_sandbox(
    tmp_path,
):
    spec = sandbox.Spec(workdir=str(tmp_path), memory_mib=256, namespaces=False).write(
        tmp_path / "sandbox.json"
    )
    km = AsyncKernelManager(
        kernel_name=KERNEL,
        kernel_spec_manager=kernel_specs(tmp_path / "specs", spec),
        transport="ipc",
        ip=str(tmp_path / "k"),
        connection_file=str(tmp_path / "k.json"),
    )
    # jupyter_client makes the provisioner the kernel spec names, from its entry point, and asks it
    # for the command
    command, _ = asyncio.run(km.pre_start_kernel(env={}))
    assert type(km.provisioner) is SandboxProvisioner
    assert command == sandbox.wrap(
        [sys.executable, "-m", "ipykernel_launcher", "-f", km.connection_file], spec
    )
    assert command[:3] == [sys.executable, "-I", sandbox.LAUNCHER]
