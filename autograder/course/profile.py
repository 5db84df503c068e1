"""What is this course's own in grading: the devices each submission is checked on."""

from __future__ import annotations


def devices_text() -> str:
    from devcourse.grading import device_matrix

    labels = {"": "", "sim": " (simulated)"}
    return " ".join(f"{entry.device}{labels.get(entry.stand_in, '')}" for entry in device_matrix("tensor"))
