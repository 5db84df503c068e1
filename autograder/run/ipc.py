"""The folder of a run's kernel sockets: one per run, in the temporary folder, removed however the
run ends."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from pathlib import Path

IPC_OWNER = ".owner"  # in a run's folder of sockets: locked (flock) for as long as the run lives


@contextlib.contextmanager
def ipc_folder():
    """The run's folder for its kernels' sockets, in the temporary folder, removed when the run
    ends.

    A run killed outright (SIGKILL, a machine's OOM killer) cannot remove its own, so every run
    first removes those of runs that are gone: each run holds a lock on its folder's
    :data:`IPC_OWNER` (made under another name and locked before it takes that name, so no run ever
    finds it unlocked while its owner lives); a folder whose lock can be taken belongs to nobody. A
    folder without that file is left alone: it is not a run's (or was left by a grader from before
    the lock).
    """
    for folder in Path(tempfile.gettempdir()).glob("grade-*"):
        try:
            with open(folder / IPC_OWNER) as owner:
                fcntl.flock(owner, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:  # no such file (not a run's folder, or one being made), or its run lives
            continue
        shutil.rmtree(folder, ignore_errors=True)
    with tempfile.TemporaryDirectory(prefix="grade-") as root:
        os.chmod(root, 0o755)
        with open(Path(root) / f"{IPC_OWNER}.new", "w") as owner:
            fcntl.flock(owner, fcntl.LOCK_EX)
            os.rename(owner.name, Path(root) / IPC_OWNER)
            yield Path(root)
