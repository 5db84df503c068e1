"""Probes (autograder.prepare.probes, autograder.inside.recorder, autograder.judge.compare): tests
rewritten into probes, values judged outside the kernel.

The probes run here in this process (a recorder installed with a list as its publisher), the
instructor's answer and a student's side by side, as the grader runs them in two kernels.
"""

import builtins
import secrets

import pytest
import torch

from devcourse.instructor.profile import DeviceCourse
from autograder.inside import recorder
from autograder.judge import compare
from autograder.prepare import probes

# the course's checks trust its simulated device's tensors
PLAIN_TENSOR = DeviceCourse.kernel.plain_tensor

TEST = '''"""name_of() names the device; ones_on() makes ones there."""
from devcourse.grading import check_on_devices, assert_tensor

def check_names(device):
    expected = f"cuda:{device.index}" if device.type == "cuda" else str(device)
    got = name_of(device)
    assert got == expected, f"got {got!r}, expected {expected!r}"
    assert isinstance(got, str) and len(got) > 0
    assert_tensor(ones_on(device), torch.ones(2), device)
    ### BEGIN HIDDEN TESTS
    assert name_of(torch.device("cpu")) == "cpu-secret-expectation"[:3], "the CPU is named cpu"
    assert torch.allclose(ones_on(device).cpu() * 3, torch.full((2,), 3.0), atol=1e-6)
    ### END HIDDEN TESTS

checked = check_on_devices(check_names)
'''

SOLUTION = """
def name_of(device):
    return str(device)

def ones_on(device):
    return torch.ones(2, device=device)
"""


def run(source: str, answers: str, reference: bool) -> dict:
    """Run a test's probe after ``answers`` in a fresh namespace; return what the recorder
    published."""
    name = "_probe_" + secrets.token_hex(4)
    published = []
    recorder.install(name, publish=published.append, plain_tensor=PLAIN_TENSOR)
    try:
        namespace = {"torch": torch}
        exec(answers, namespace)
        code, _ = probes.probe_source(source, name, reference=reference)
        exec(code, namespace)
    finally:
        builtins.__dict__.pop(name, None)
    assert len(published) == 1
    return published[0]


@pytest.fixture(scope="module")
def reference():
    return run(TEST, SOLUTION, reference=True)


def judge(answers: str, reference: dict, source: str = TEST) -> compare.Outcome:
    return compare.compare(
        run(source, answers, reference=False), reference, probes.sites_of(source)
    )


def test_a_students_probe_holds_no_expected_side():
    code, sites = probes.probe_source(TEST, "_r", reference=False)
    assert "secret-expectation" not in code and "torch.full" not in code and "atol" not in code
    assert "expected =" not in code, "a name bound only for an expected side is not bound"
    assert "got {got!r}" not in code, "assertion messages are not sent either"
    reference_code, reference_sites = probes.probe_source(TEST, "_r", reference=True)
    assert (
        "secret-expectation" in reference_code and "with _course_probe.hidden():" in reference_code
    )
    assert sites == reference_sites
    assert [(s.kind, s.hidden) for s in sites] == [
        ("eq", False),
        ("check", False),
        ("check", False),
        ("tensor", False),
        ("eq", True),
        ("allclose", True),
    ]


def test_the_instructors_probe_passes_its_own_checks(reference):
    sites = probes.sites_of(TEST)
    assert compare.self_check(reference, sites) is None
    hidden = [e for e in reference["events"] if e[1] and sites[e[0]].kind != "check"]
    assert len(hidden) == 2 * 3, "two hidden value checks on each of 3 devices, marked as hidden"


def test_a_correct_answer_passes_and_an_other_correct_answer_too(reference):
    assert judge(SOLUTION, reference).passed
    other = SOLUTION.replace(
        "return torch.ones(2, device=device)", "return torch.zeros(2).to(device) + 1"
    )
    assert judge(other, reference).passed


@pytest.mark.parametrize(
    "answers, reason",
    [
        (
            SOLUTION.replace("return str(device)", "return device.type"),
            "the check `got == expected` failed",
        ),
        (
            SOLUTION.replace("torch.ones(2, device=device)", "torch.ones(2)"),
            "the check `assert_tensor(ones_on(device), torch.ones(2), device)` failed",
        ),
        (
            SOLUTION.replace(
                "torch.ones(2, device=device)", "torch.ones(2, device=device, dtype=torch.float64)"
            ),
            "failed",
        ),
        (
            SOLUTION.replace(
                "return str(device)", "return 'cpu' if device.type == 'cpu' else str(device) + ' '"
            ),
            "the check `got == expected` failed",
        ),
        (
            SOLUTION.replace("return str(device)", "raise NotImplementedError()"),
            "raised AssertionError, from NotImplementedError",
        ),
    ],
)
def test_wrong_answers_fail_with_the_graders_own_words(reference, answers, reason):
    outcome = judge(answers, reference)
    assert not outcome.passed and reason in outcome.reason, outcome.reason


def test_a_hidden_check_is_named_only_as_hidden(reference):
    wrong = (
        SOLUTION.replace(
            "return str(device)",
            "return 'CPU' if str(device) == 'cpu' and _calls.append(1) is None "
            "and len(_calls) > 3 else str(device)",
        )
        + "\n_calls = []\n"
    )
    outcome = judge(wrong, reference)
    assert not outcome.passed and outcome.reason == "a hidden check failed", outcome.reason


FORGER = (
    SOLUTION.replace("return str(device)", "return _forge(device)")
    + """
import builtins as _b
def _forge(device):
    # Reach the recorder and make it record what a passing run records: True for checks,
    # and for values whatever this code can find (it never sees an expected side).
    for _key, _value in list(vars(_b).items()):
        if _key.startswith("_probe_"):
            _value.check = lambda site, passed: _value.events.append([site, False, True])
            _real = _value.value
            _value.value = lambda site, actual, *rest: _real(site, "cpu-secret-expectation")
    return "nothing"
"""
)


def test_a_kernel_that_rewrites_its_recorder_gains_nothing(reference):
    outcome = judge(FORGER, reference)
    assert not outcome.passed, "a forged record passed"


def test_a_probe_that_stops_early_or_goes_on_fails(reference):
    events = reference["events"]
    sites = probes.sites_of(TEST)
    student = {"events": [e[:3] for e in events]}
    assert compare.compare(student, reference, sites).passed
    assert not compare.compare({"events": student["events"][:-1]}, reference, sites).passed
    assert not compare.compare(
        {"events": student["events"] + [["raised", "ValueError"]]}, reference, sites
    ).passed
    assert not compare.compare(None, reference, sites).passed
    assert (
        "not reached"
        in compare.compare(
            {"events": [["raised", "Hidden_test_says_cpu_secret"]]}, reference, sites
        ).reason
    )
    assert (
        "Hidden_test"
        not in compare.compare(
            {"events": [["raised", "Hidden_test_says_cpu_secret"]]}, reference, sites
        ).reason
    ), "a class name a submission chose is not shown"


def test_values_compare_as_they_do_in_the_kernel():
    enc = {}
    recorder.install(
        "_probe_enc", publish=lambda payload: enc.update(payload), plain_tensor=PLAIN_TENSOR
    )
    try:
        rec = builtins.__dict__["_probe_enc"]
        rec.begin()
        values = [
            torch.device("cpu"),
            torch.float16,
            torch.Size([2, 3]),
            {"a": [1, (2, 3)]},
            {3, 1},
            float("nan"),
            2**80,
            "text",
            None,
            type(torch.ones(1)),
            ["x"],
        ]
        for index, value in enumerate(values):
            rec.value(index, value)
        rec.end()
    finally:
        builtins.__dict__.pop("_probe_enc")
    got = [compare.decode(event[2]) for event in enc["events"]]
    assert got[0] == compare.decode({"$": "device", "v": "cpu"})
    assert got[0] != compare.decode({"$": "device", "v": "cpu:0"})
    assert got[1] == compare.decode({"$": "dtype", "v": "torch.float16"})
    assert got[2] == (2, 3) and got[3] == {"a": [1, (2, 3)]} and got[4] == {1, 3}
    assert got[5] != got[5] and got[6] == 2**80 and got[7] == "text" and got[8] is None
    assert got[10] == ["x"] and got[10] != ("x",)


def encoded(value):
    """``value`` as the kernel's recorder encodes it."""
    out = {}
    recorder.install(
        "_probe_t", publish=lambda payload: out.update(payload), plain_tensor=PLAIN_TENSOR
    )
    try:
        rec = builtins.__dict__["_probe_t"]
        rec.begin()
        rec.value(0, value)
        rec.end()
    finally:
        builtins.__dict__.pop("_probe_t")
    return out["events"][0][2]


def test_tensor_checks_follow_assert_tensor():
    want = encoded({"args": [torch.arange(4.0), "cpu"], "kwargs": {}})
    assert compare.holds("tensor", encoded(torch.arange(4.0)), want)
    assert not compare.holds("tensor", encoded(torch.arange(4.0).double()), want)
    assert not compare.holds("tensor", encoded(torch.arange(4.0) + 1), want)
    assert not compare.holds("tensor", encoded(torch.arange(4.0).reshape(2, 2)), want)
    assert compare.holds(
        "tensor",
        encoded(torch.ones(2, device="meta")),
        encoded({"args": [torch.ones(2, device="meta")], "kwargs": {}}),
    ), "no values on meta"

    class Lying(torch.Tensor):
        pass

    assert not compare.holds("tensor", encoded(torch.arange(4.0).as_subclass(Lying)), want), (
        "a subclass is refused"
    )
    close = encoded({"args": [torch.ones(3)], "kwargs": {"atol": 1e-3}})
    assert compare.holds("allclose", encoded(torch.ones(3) + 1e-4), close)
    assert not compare.holds("allclose", encoded(torch.ones(3) + 1e-2), close)
    assert not compare.holds("eq", {"$": "tensor", "plain": False}, {"$": "tensor", "plain": False})
    assert compare.decode([1, 2]) != [1, 2], "only the recorder's encoding is read"


WORKER_TEST = """
def report(outdir):
    assert dist.is_initialized(), "runs in another process"
    return 1

results = run_functions([answer], report)
assert results == [1, 1]
"""


def test_functions_run_in_other_processes_keep_their_assertions():
    code, sites = probes.probe_source(WORKER_TEST, "_r", reference=False)
    assert "assert dist.is_initialized()" in code and len(sites) == 1


def test_a_helper_parameter_that_only_feeds_expectations_is_not_passed():
    source = """
def same_state(got, expected):
    for key in got:
        assert torch.equal(got[key], expected[key])

same_state(load(path), {"w": torch.zeros(2)})
"""
    code, _ = probes.probe_source(source, "_r", reference=False)
    assert "torch.zeros" not in code and "same_state(load(path), None)" in code


def test_the_probes_of_the_same_tests_are_made_once_whatever_each_jobs_recorder_is_named():
    """Every job names its recorder anew; the probes of an assignment's tests are rewritten once,
    and each job's differ only in the name they bind."""
    tests = ["x = 1\nassert x == 1", "assert [1, 2] == [1, 2]"]
    probes._notebook_probes.cache_clear()
    first, sites = probes.notebook_probes(tests, "one_probe", reference=False)
    second, again = probes.notebook_probes(tests, "other_probe", reference=False)
    assert probes._notebook_probes.cache_info().misses == 1
    assert sites == again
    assert [p.replace("'one_probe'", "'other_probe'") for p in first] == second
    assert all("'other_probe'" in p and "'one_probe'" not in p for p in second)
