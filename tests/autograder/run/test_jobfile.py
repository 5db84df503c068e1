"""A job file (autograder.run.jobspec): what the grader writes is what the runner reads, and a file
that is corrupt or of another version is refused with its path and what is wrong, never half
read."""

from __future__ import annotations

import json

import pytest

from autograder.run.jobspec import JobSpec, JobSpecError

FIELDS = {
    "guard_name": "_grader_1",
    "recorder_name": "_grader_1_probe",
    "probes": [["t", "check()"]],
    "notebook_in": "in.ipynb",
    "notebook_out": "out.ipynb",
    "status_out": "status.json",
    "observations_out": "observations.json",
    "probes_log": "probes.log",
    "ipc_dir": "/tmp/k",
    "workdir": "/tmp/work",
    "cell_timeout_s": 60.0,
    "time_limit_s": 600.0,
    "recorded_bytes": 1 << 28,
    "sandbox": {"workdir": "/tmp/work"},
}


def test_what_is_written_is_read_and_another_versions_extra_keys_are_passed_over(tmp_path):
    JobSpec(**FIELDS, kernel={"packages": ["devcourse.*"]}).write(tmp_path / "job.json")
    assert JobSpec.read(tmp_path / "job.json") == JobSpec(
        **FIELDS, kernel={"packages": ["devcourse.*"]}
    )
    (tmp_path / "later.json").write_text(json.dumps({**FIELDS, "from_a_later_version": 1}))
    # cgroups and kernel: none asked for
    assert JobSpec.read(tmp_path / "later.json") == JobSpec(**FIELDS)


@pytest.mark.parametrize(
    "text,says",
    [
        ('{"guard_name": ', "cannot be read: JSONDecodeError"),
        ("[]", "holds a list, not a job"),
        (
            json.dumps(
                {k: v for k, v in FIELDS.items() if k not in ("probes_log", "recorded_bytes")}
            ),
            "lacks probes_log, recorded_bytes: written by another version?",
        ),
    ],
)
def test_a_corrupt_or_older_job_file_is_refused_naming_its_path_and_what_is_wrong(
    tmp_path, text, says
):
    (tmp_path / "job.json").write_text(text)
    with pytest.raises(JobSpecError) as refused:
        JobSpec.read(tmp_path / "job.json")
    assert str(tmp_path / "job.json") in str(refused.value) and says in str(refused.value), (
        refused.value
    )
