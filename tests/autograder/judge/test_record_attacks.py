"""Records that should hold values and hold none: a value check never passes without the values it
compares.

A kernel's record of a tensor holds its values, a digest of them (a large one) or none (a meta
tensor); the reference's record says which. An answer whose tensor the recorder cannot serialise (a
sparse one) is refused with a named reason, and a forged record that leaves the values out fails, as
a wrong answer does.
"""

import base64

import pytest
import torch
from test_probe import encoded

from autograder.judge import compare
from autograder.prepare import probes

EXPECTED = torch.arange(4.0)
ON_CPU = encoded({"args": [EXPECTED, "cpu"], "kwargs": {}})

TEST = """
from devcourse.grading import assert_tensor
assert_tensor(counts(), torch.arange(4.0), "cpu")
"""


def _without(record: dict, *keys: str) -> dict:
    return {key: value for key, value in record.items() if key not in keys}


def test_a_sparse_tensor_is_refused_with_a_reason_and_fails():
    """Before, a sparse tensor of the right shape passed whatever its values: it was recorded
    without any."""
    sparse = encoded(torch.zeros(4).to_sparse())
    assert sparse["refused"] == "layout" and "data" not in sparse and "sha256" not in sparse
    assert not compare.holds("tensor", sparse, ON_CPU)
    assert not compare.holds("tensor", encoded(EXPECTED.to_sparse()), ON_CPU), (
        "right values, unrecordable layout"
    )
    assert compare.holds("tensor", encoded(EXPECTED.clone()), ON_CPU)


def test_the_outcome_names_why_a_sparse_answer_failed():
    sites = probes.sites_of(TEST)
    reference = {"events": [[0, False, encoded(EXPECTED), ON_CPU]]}
    outcome = compare.compare(
        {"events": [[0, False, encoded(torch.zeros(4).to_sparse())]]}, reference, sites
    )
    assert not outcome.passed and "layout whose values the grader does not record" in outcome.reason
    assert compare.compare({"events": [[0, False, encoded(EXPECTED)]]}, reference, sites).passed


def test_a_record_without_the_values_the_reference_holds_fails():
    """A forged record with the right type, device, dtype and shape but no values passed before."""
    honest = encoded(EXPECTED)
    assert compare.holds("tensor", honest, ON_CPU)
    assert not compare.holds("tensor", _without(honest, "data"), ON_CPU)
    assert not compare.holds("tensor", dict(_without(honest, "data"), sha256="0" * 64), ON_CPU)


def test_a_digest_is_compared_where_the_reference_holds_one():
    digest = dict(_without(encoded(EXPECTED), "data"), sha256="ab" * 32)
    by_digest = {
        "$": "dict",
        "cls": "dict",
        "v": [
            ["args", {"$": "list", "cls": "builtins.list", "v": [digest, "cpu"]}],
            ["kwargs", {"$": "dict", "v": []}],
        ],
    }
    assert compare.holds("tensor", digest, by_digest)
    assert not compare.holds("tensor", _without(digest, "sha256"), by_digest), (
        "no digest where one is expected"
    )
    assert not compare.holds("tensor", dict(digest, sha256="cd" * 32), by_digest)
    assert not compare.holds("tensor", encoded(EXPECTED), by_digest), (
        "values where the reference has a digest"
    )


def test_a_meta_reference_wants_no_values():
    meta = encoded({"args": [torch.ones(2, device="meta")], "kwargs": {}})
    assert compare.holds("tensor", encoded(torch.ones(2, device="meta")), meta)
    forged = dict(encoded(torch.ones(2, device="meta")), data=base64.b64encode(bytes(8)).decode())
    assert not compare.holds("tensor", forged, meta)


@pytest.mark.parametrize("kind", ["equal", "allclose", "assert_close"])
def test_other_value_checks_want_values_too(kind):
    expectation = encoded({"args": [EXPECTED], "kwargs": {}})
    assert compare.holds(kind, encoded(EXPECTED.clone()), expectation)
    assert not compare.holds(kind, _without(encoded(EXPECTED), "data"), expectation)
    assert not compare.holds(kind, encoded(EXPECTED.to_sparse()), expectation)
