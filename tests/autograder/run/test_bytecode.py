"""The grader finds packages installed without bytecode, which every sandboxed kernel compiles
again."""

import shlex
import subprocess
import sys

from autograder.run import bytecode


def _package(site, name, modules=("a", "b")):
    folder = site / name
    folder.mkdir(parents=True)
    for module in ("__init__", *modules):
        (folder / f"{module}.py").write_text(f"VALUE = {module!r}\n")
    return folder


def test_a_package_without_bytecode_is_found_and_the_advised_command_compiles_it(
    tmp_path, monkeypatch
):
    folder = _package(tmp_path, "uncompiled_pkg")
    (tmp_path / "single_module.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    names = ("uncompiled_pkg", "single_module", "no_such_package_here")
    missing = bytecode.uncompiled(names)
    # where they were installed
    assert missing == {"uncompiled_pkg": str(tmp_path), "single_module": str(tmp_path)}
    lines = bytecode.advice(missing)
    assert lines[0].startswith(
        "No compiled bytecode for uncompiled_pkg, single_module: every kernel compiles"
    )
    # the command the grader prints, as an instructor runs it
    subprocess.run(shlex.split(lines[1]), check=True)
    assert bytecode.uncompiled(names) == {}
    assert (folder / "__pycache__").is_dir() and bytecode.advice({}) == []


def test_a_package_with_most_of_its_bytecode_counts_as_compiled(tmp_path, monkeypatch):
    """Where the owner imported part of it once (a few modules compiled), only a package mostly
    without is named."""
    import py_compile

    folder = _package(tmp_path, "partly", modules=("a", "b", "c"))
    monkeypatch.syspath_prepend(str(tmp_path))
    py_compile.compile(str(folder / "__init__.py"))
    assert bytecode.uncompiled(("partly",)) == {"partly": str(tmp_path)}
    py_compile.compile(str(folder / "a.py"))
    assert bytecode.uncompiled(("partly",)) == {}


def test_this_environment_has_the_bytecode_of_what_kernels_import():
    """Installed by pip (make install), every package a kernel imports is compiled: the grader
    advises nothing."""
    assert bytecode.uncompiled() == {}


def test_a_worker_says_which_packages_its_kernels_will_compile_before_it_becomes_dasks_worker(
    tmp_path, monkeypatch, capsys
):
    from autograder.cli import worker

    _package(tmp_path, "uncompiled_pkg")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(bytecode, "PACKAGES", ("uncompiled_pkg",))

    class Became(Exception):
        pass

    def execve(path, command, env):
        raise Became(command, env)

    monkeypatch.setattr(worker.os, "execve", execve)
    try:
        worker.main(["tcp://127.0.0.1:1", "--gpu", "3", "--name", "w"])
    except Became as became:
        command, env = became.args
    assert (
        command[2:4] == ["distributed.cli.dask_worker", "tcp://127.0.0.1:1"]
        and env["CUDA_VISIBLE_DEVICES"] == "3"
    )
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith(
        "worker: No compiled bytecode for uncompiled_pkg: every kernel compiles"
    ), err
    assert err[1] == "worker: " + shlex.join(
        [sys.executable, "-m", "compileall", "-q", "-j0", str(tmp_path)]
    ), err
