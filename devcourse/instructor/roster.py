"""The demo class's students: for each, what they hand in for each assignment, as
:mod:`devcourse.instructor.demo` fills it into the student versions. The instructor's solution,
nothing at all, answers with the mistakes students really make, and submissions that attack the
grader or break (each earns only what its honest answers earn).
"""

from __future__ import annotations

import textwrap

import nbformat

from autograder.course.cells import is_test
from devcourse.instructor.paths import COURSE, assignments


def _code(source: str) -> str:
    return textwrap.dedent(source).strip("\n")


SOLUTION = "solution"
STUB = "stub"
# the names the solution defines, as stubs that forge the grader's records (see FORGER)
FORGED = "forged"

# For each student: assignment -> {grade_id: source, or SOLUTION / STUB};
# "*" gives the default for answers not named. A missing assignment was not
# handed in.
ROSTER: dict[str, dict[str, dict[str, str]]] = {
    # Hands in the instructor's solution everywhere: full marks.
    "ada": {name: {"*": SOLUTION} for name in assignments()},
    # Hands in the quicker notebooks untouched: no marks.
    "linus": {
        name: {"*": STUB} for name in assignments() if name[:2] in ("00", "01", "02", "03", "05")
    },
    # Hands in 00 only, with a typo that raises NameError in one answer.
    "margaret": {
        "00_environment": {
            "*": SOLUTION,
            # The cause, but a fix in the kernel that already asked CUDA: one of the two points, by
            # hand.
            "reply_to_a_classmate": (
                "CUDA_VISIBLE_DEVICES is 3, but the server only has GPUs 0 and 1, so PyTorch "
                "sees no GPU. Your PyTorch is not broken. Set the variable to 0,1 with "
                "os.environ at the top of the notebook and run it again."
            ),
            "resolve_device": _code('''
                def resolve_device(request: str = "auto") -> torch.device:
                    """The torch.device that `request` names, checked against this machine."""
                    if request == "auto":
                        return best_devcie()
                    return torch.device(request)
            '''),
        },
    },
    # Partly right: the mistakes of someone who learnt from blog posts.
    "grace": {
        "00_environment": {
            "*": STUB,
            "list_devices": _code('''
                def list_devices() -> list[torch.device]:
                    """Every device a tensor can be created on here: cpu, cuda:0, cuda:1, ..., then mps if available."""
                    return ["cpu"] + [f"cuda:{i}" for i in range(torch.cuda.device_count())]
            '''),
            "resolve_device": _code('''
                def resolve_device(request: str = "auto") -> torch.device:
                    """The torch.device that `request` names, checked against this machine."""
                    if request == "auto":
                        return best_device()
                    return torch.device(request)
            '''),
            "diagnose": _code('''
                def diagnose(facts: EnvFacts, expect_gpu: bool) -> list[str]:
                    """The codes of the problems that keep this set-up from using a GPU as expected; [] when all
                    is well."""
                    if not expect_gpu:
                        return []
                    if facts.cuda_build is None:
                        return ["cpu_only_build"]
                    if facts.device_count == 0:
                        return ["no_gpu_visible"]
                    return []
            '''),
        },
        "01_device_placement": {
            "move_batch": _code('''
                def move_batch(batch, device, dtype=None):
                    """A copy of `batch` (nested dicts, lists, tuples, named tuples) with every tensor on `device`.

                    When `dtype` is given, floating-point tensors are cast to it; other tensors keep their dtype.
                    """
                    if isinstance(batch, torch.Tensor):
                        return batch.to(device, dtype) if dtype is not None else batch.to(device)
                    if isinstance(batch, dict):
                        return {key: move_batch(value, device, dtype) for key, value in batch.items()}
                    if isinstance(batch, (list, tuple)):
                        return type(batch)(move_batch(value, device, dtype) for value in batch)
                    return batch
            '''),
            "model_devices": _code('''
                def model_devices(model: nn.Module) -> set[torch.device]:
                    """The devices of all parameters and buffers of `model`, submodules included."""
                    return {parameter.device for parameter in model.parameters()}
            '''),
            "causal_mask": _code('''
                def causal_mask(scores: torch.Tensor) -> torch.Tensor:
                    """A (T, T) bool mask on scores.device, True strictly above the diagonal, for scores of shape
                    (..., T, T)."""
                    T = scores.shape[-1]
                    return torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
            '''),
        },
        "02_cross_device_errors": {
            "find_misplaced": _code('''
                def find_misplaced(model: nn.Module, device: torch.device, *inputs) -> list[str]:
                    """Names of the parameters, buffers and inputs ("input 0", ...) that are not on `device`."""
                    names = [name for name, parameter in model.named_parameters() if parameter.device != device]
                    return names + [f"input {i}" for i, x in enumerate(inputs) if x.device != device]
            '''),
            "standardize": _code('''
                class Standardize(nn.Module):
                    """(x - mean) / std, with mean and std kept as buffers: moved by .to(), saved by state_dict()."""

                    def __init__(self, mean: torch.Tensor, std: torch.Tensor):
                        super().__init__()
                        self.mean = mean
                        self.std = std

                    def forward(self, x: torch.Tensor) -> torch.Tensor:
                        return (x - self.mean) / self.std
            '''),
            "prepare_batch": _code('''
                def prepare_batch(batch, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
                    """The (data, label) pair of `batch`, both moved to `device` with non_blocking=True."""
                    data, label = batch
                    return data.to(device, non_blocking=True), data.to(device, non_blocking=True)
            '''),
        },
    },
}


# Submissions that break the rules, or break: each earns only what its honest answers earn.
ROSTER.update(
    {
        # Crashes its kernel (a native crash, as a broken extension would) after two correct
        # answers.
        "hal": {
            "01_device_placement": {
                "*": STUB,
                "move_batch": SOLUTION,
                "model_devices": _code('''
                def model_devices(model: nn.Module) -> set[torch.device]:
                    """The devices of all parameters and buffers of `model`, submodules included."""
                    return {t.device for t in [*model.parameters(), *model.buffers()]}

                import faulthandler
                faulthandler._sigsegv()
            '''),
            },
        },
        # Loops forever in one answer: the cell's time limit stops the notebook there.
        "tony": {
            "02_cross_device_errors": {
                "*": SOLUTION,
                "standardize": _code("""
                step = 0
                while step >= 0:  # meant to stop at 10, never does
                    step += 1
            """),
            },
        },
        # Keeps a 12 GiB cache in one answer: the memory limit makes that cell fail, the others
        # still count.
        "mia": {
            "03_saving_and_loading": {
                "*": SOLUTION,
                "save_checkpoint": _code("""
                _cache = [torch.ones(256, 1024, 1024) for _ in range(12)]  # 12 x 1 GiB, never freed
            """),
            },
        },
        # Wrong answers, and patches what the tests use, in ways a text search would miss.
        "mallory": {
            "01_device_placement": {
                "*": STUB,
                "move_batch": _code("""
                tools = [torch, torch.testing]
                tools[0].equal = lambda *args, **kwargs: True
                tools[0].allclose = lambda *args, **kwargs: True
                tools[1].assert_close = lambda *args, **kwargs: None

                import devcourse.grading as g
                helpers = vars(g)
                helpers["assert_tensor"] = lambda *args, **kwargs: None
                helpers["check_on_devices"] = lambda check, kind="tensor": []

                def move_batch(batch, device, dtype=None):
                    return batch
            """),
                "model_devices": _code("""
                class Anything(set):
                    def __eq__(self, other):
                        return True

                    __hash__ = set.__hash__

                def model_devices(model):
                    return Anything()
            """),
            },
            "00_environment": {
                "*": STUB,
                "resolve_device": _code("""
                class Yes:
                    def __eq__(self, other):
                        return True

                    def __ne__(self, other):
                        return False

                def resolve_device(request="auto"):
                    return Yes()
            """),
                "diagnose": _code("""
                import sys
                shell = sys.modules["IPython"].core.getipython.get_ipython()
                shell.showtraceback = lambda *args, **kwargs: None

                def diagnose(facts, expect_gpu):
                    return None
            """),
            },
        },
        # Looks for the hidden tests, the gradebook and the other students on disk, and tries to
        # leave a mark.
        "eve": {
            "00_environment": {
                "*": STUB,
                "list_devices": _code("""
                import os
                from pathlib import Path

                found = []
                for top in ["/", Path.cwd().parent, Path.cwd().parent.parent, Path.home(), Path("/tmp")]:
                    for folder, _, files in os.walk(top):
                        if folder.startswith(("/proc", "/sys", "/usr", "/dev")) or "python" in folder:
                            continue
                        for name in files:
                            if name.endswith((".ipynb", ".db")) or "grading" in name:
                                found.append(os.path.join(folder, name))
                        if len(found) > 200:
                            break
                print(len(found), "files found")
                for path in found:
                    try:
                        text = Path(path).read_text(errors="ignore")
                    except OSError:
                        continue
                    if "BEGIN HIDDEN TESTS" in text:
                        print("hidden tests in", path)
                    try:
                        with open(path, "a") as handle:
                            handle.write("eve was here")
                        print("wrote", path)
                    except OSError:
                        pass

                import devcourse.grading
                try:
                    with open(devcourse.grading.__file__, "a") as handle:
                        handle.write("\\nassert_tensor = lambda *a, **k: None\\n")
                    print("patched the course's installed code")
                except OSError as error:
                    print("cannot patch the course's code:", type(error).__name__)

                def list_devices():
                    return []
            """),
            },
        },
    }
)


# Tampering with the notebook itself: applied to the student's notebook after the answers are filled
# in.
def _edit_tests(nb):
    """Replace every test with `pass`, and delete the last test cell."""
    tests = [c for c in nb.cells if is_test(c)]
    for cell in tests:
        cell.source = "pass  # nothing to check"
    nb.cells.remove(tests[-1])
    return nb


def _corrupt(nb):
    """The first half of the notebook's file, as an interrupted upload leaves it."""
    text = nbformat.writes(nb)
    return text[: len(text) // 2]


def _from_another_assignment(nb):
    other = nbformat.read(
        COURSE / "02_cross_device_errors" / "02_cross_device_errors.ipynb", as_version=4
    )
    return other


# Every submission was handed in an hour before its due date (paths.demo_due), except these: hours
# late.
LATE_HOURS = {("grace", "02_cross_device_errors"): 26}

ROSTER["trudy"] = {"02_cross_device_errors": {"*": STUB}}
ROSTER["forger"] = {name: {"*": FORGED} for name in assignments()}
ROSTER["oscar"] = {"00_environment": {"*": SOLUTION}, "01_device_placement": {"*": SOLUTION}}
# Who each demo student is, in one line: what the grader's output says of them.
WHO = {
    "ada": (
        "hands in the instructor's solution everywhere: full marks but the written answers, graded"
        " by hand"
    ),
    "linus": "hands in the quicker notebooks untouched: no marks",
    "margaret": "hands in 00 only, with a typo that raises NameError in one answer",
    "grace": "partly right: the mistakes of someone who learnt from blog posts; one notebook late",
    "hal": "crashes its kernel after two correct answers: keeps what it earned before",
    "tony": "loops forever in one answer: the time limit stops the notebook there",
    "mia": "keeps a 12 GiB cache in one answer: the memory limit stops that cell",
    "mallory": "wrong answers, and patches what the tests use: the score is withheld for review",
    "eve": "looks for the hidden tests, the gradebook and the others' work on disk: finds none",
    "forger": "answers nothing and forges the grader's records: earns nothing",
    "trudy": "replaces the tests with `pass` and deletes one: they are put back",
    "oscar": "hands in a broken file and another assignment's notebook: each said, not graded",
}

TAMPER = {
    ("trudy", "02_cross_device_errors"): _edit_tests,
    ("oscar", "00_environment"): _corrupt,
    ("oscar", "01_device_placement"): _from_another_assignment,
}
