"""Answers that ask PyTorch which machine they run on get, in a grading kernel, the answer the
student's machine gives.

The grader turns the simulated accelerator on before a student's first cell (the device matrix needs
it), and once on it is PyTorch's accelerator. Outside the checks that run on a simulated device,
though, ``torch.accelerator``, ``torch.cuda``, ``torch.backends.mps`` and the course's helpers must
answer as on the machine the check stands for: the grader's own machine (a CPU-only one here), or
the machine a check simulates (``simulated_cuda(n)``, ``simulated_mps()``). So device resolution
written through any of them earns every point.

The first test checks the machinery in this process (seconds); the second grades three students of
00 through the grader's command line, each resolving devices through another of those interfaces
(about a minute on two cores).
"""

from __future__ import annotations

import nbformat
import pytest
import torch

from autograder.cli import grade
from devcourse.instructor.paths import solution_path
import simdevice
from devcourse import best_device, grading

ASSIGNMENT = "00_environment"

_LIST_HEAD = '''\
def list_devices() -> list[torch.device]:
    """Every device a tensor can be created on here: cpu, cuda:0, cuda:1, ..., then mps:0 if
    available."""
'''
_RESOLVE_HEAD = '''\
def resolve_device(request: str = "auto") -> torch.device:
    """The torch.device that `request` names, checked against this machine."""
'''
_CUDA_REQUEST = """\
    device = torch.device(request)
    if device.type == "mps":
        return torch.device("mps", 0)
    if device.type != "cuda":
        return device
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = 0 if device.index is None else device.index
    if not index < count:
        raise ValueError(f"{request!r}: no such GPU here, this machine has {count} CUDA device(s)")
    return torch.device("cuda", index)
"""

# Each answer resolves devices through one interface; each is correct on every machine.
ANSWERS = {
    "through_torch_accelerator": {
        "list_devices": _LIST_HEAD
        + """\
    devices = [torch.device("cpu")]
    accelerator = torch.accelerator.current_accelerator(check_available=True)
    if accelerator is not None:
        devices += [
            torch.device(accelerator.type, i) for i in range(torch.accelerator.device_count())
        ]
    return devices
""",
        "resolve_device": _RESOLVE_HEAD
        + """\
    if request == "auto":
        accelerator = torch.accelerator.current_accelerator(check_available=True)
        if accelerator is None:
            return torch.device("cpu")
        return torch.device(accelerator.type, torch.accelerator.current_device_index())
"""
        + _CUDA_REQUEST,
    },
    "through_cuda_and_mps_modules": {
        "list_devices": _LIST_HEAD
        + """\
    found = [torch.device("cpu")]
    for index in range(torch.cuda.device_count() if torch.cuda.is_available() else 0):
        found.append(torch.device("cuda", index))
    if torch.backends.mps.is_available():
        found.append(torch.device("mps", 0))
    return found
""",
        "resolve_device": _RESOLVE_HEAD
        + """\
    if request == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda", torch.cuda.current_device())
        if torch.backends.mps.is_available():
            return torch.device("mps", 0)
        return torch.device("cpu")
"""
        + _CUDA_REQUEST,
    },
    "through_course_helpers": {
        "list_devices": _LIST_HEAD
        + """\
    from devcourse.devices import hardware_accelerator

    kind = hardware_accelerator()
    if kind is None:
        return [torch.device("cpu")]
    count = 1 if kind == "mps" else torch.get_device_module(kind).device_count()
    return [torch.device("cpu")] + [torch.device(kind, i) for i in range(count)]
""",
        "resolve_device": _RESOLVE_HEAD
        + """\
    from devcourse.devices import best_device

    return best_device() if request == "auto" else _named(request)


def _named(request: str) -> torch.device:
"""
        + _CUDA_REQUEST,
    },
}


def test_the_matrix_turns_the_simulated_device_on_hidden_shown_only_where_a_check_runs_on_it():
    """torch.accelerator names no accelerator on this CPU-only machine, the simulated one being on
    for the matrix; it names sim in a check on sim:N, none in the check on the CPU, and CUDA or MPS
    where a check simulates such a machine."""
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the matrix uses its GPUs, not the simulated device")
    grading.device_matrix()
    # as the grader's kernel has it, whatever this process did before
    with simdevice.shown_as_accelerator(False):
        assert torch.accelerator.current_accelerator() is None
        assert (torch.accelerator.is_available(), torch.accelerator.device_count()) == (False, 0)
        assert torch.get_device_module() is torch.cpu
        with pytest.raises(RuntimeError, match="none is available"):
            torch.accelerator.synchronize()
        assert best_device() == torch.device("cpu")
        seen = {}

        def check(device):
            seen[str(device)] = (
                torch.accelerator.current_accelerator(),
                torch.accelerator.device_count(),
            )

        grading.check_on_devices(check)
        assert seen == {
            "cpu": (None, 0),
            "sim:0": (torch.device("sim"), 2),
            "sim:1": (torch.device("sim"), 2),
        }
        with grading.simulated_cuda(2):
            assert torch.accelerator.current_accelerator(check_available=True) == torch.device(
                "cuda"
            )
            assert (torch.accelerator.device_count(), torch.backends.mps.is_available()) == (
                2,
                False,
            )
            assert (
                best_device() == torch.device("cuda", 0) and torch.get_device_module() is torch.cuda
            )
        with grading.simulated_mps():
            assert torch.accelerator.current_accelerator() == torch.device("mps")
            assert (torch.accelerator.device_count(), torch.cuda.is_available()) == (1, False)
            assert best_device() == torch.device("mps", 0)
        assert torch.accelerator.current_accelerator() is None


def _submission(answers: dict[str, str]) -> nbformat.NotebookNode:
    nb = nbformat.read(solution_path(ASSIGNMENT), as_version=4)
    for cell in nb.cells:
        grade_id = cell.metadata.get("nbgrader", {}).get("grade_id")
        if cell.metadata.get("nbgrader", {}).get("solution") and grade_id in answers:
            cell.source, cell.outputs, cell.execution_count = answers[grade_id], [], None
    return nb


@pytest.fixture(scope="module")
def scores(tmp_path_factory):
    """Grade the three students through the command line; each one's (score, max score) per test
    cell of 00."""
    from nbgrader.api import Gradebook

    tmp = tmp_path_factory.mktemp("machine")
    for student, answers in ANSWERS.items():
        target = tmp / "submitted" / student / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
        target.parent.mkdir(parents=True)
        nbformat.write(_submission(answers), target)
    assert (
        grade.main(
            [
                "--submitted",
                str(tmp / "submitted"),
                "--workdir",
                str(tmp / "work"),
                "--quiet",
                "--no-feedback",
                "--cell-timeout",
                "45",
            ]
        )
        == 0
    )
    tests = [
        cell.metadata["nbgrader"]["grade_id"]
        for cell in nbformat.read(solution_path(ASSIGNMENT), 4).cells
        if cell.metadata.get("nbgrader", {}).get("grade") and cell.cell_type == "code"
    ]
    with Gradebook(f"sqlite:///{tmp / 'work' / 'gradebook.db'}") as gradebook:
        return {
            student: {
                test: (g.score, g.max_score)
                for test in tests
                for g in [gradebook.find_grade(test, ASSIGNMENT, ASSIGNMENT, student)]
            }
            for student in ANSWERS
        }


@pytest.mark.parametrize("student", sorted(ANSWERS))
def test_device_resolution_through_any_interface_keeps_every_point(scores, student):
    lost = {test: score for test, score in scores[student].items() if score[0] != score[1]}
    assert scores[student], f"{student} was not graded"
    assert not lost, f"{student} lost points on (score, max): {lost}"
