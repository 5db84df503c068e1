"""The grader's profile of this course (``c.Grader.profile`` in its ``nbgrader_config.py``): what
its kernels import and run first, the devices each submission is checked on, its demo class, and the
next steps it names."""

from __future__ import annotations

from autograder.course.profile import CourseProfile, DemoClass, KernelSetup
from devcourse.instructor.paths import DEMO_CLASS, ROOT, demo_due


class DeviceCourse(CourseProfile):
    """This course: its kernels import torch, ``simdevice`` and ``devcourse``, and every check runs
    on the device matrix (the CPU, and CUDA or the simulated accelerator), turned on before the
    student's code runs."""

    kernel = KernelSetup(
        packages=(
            "numpy",
            "torch",
            "torch.nn",
            "torch.testing",
            "torch._subclasses.fake_tensor",
            "simdevice.*",
            "devcourse.*",
        ),
        setup="devcourse.grading.device_matrix",
        plain_tensor="devcourse.grading.is_plain_tensor",
    )
    stand_ins = ("sim",)

    def devices(self) -> str:
        from devcourse.grading import device_matrix

        return " ".join(
            f"{entry.device}{'' if entry.real else ' (simulated)'}"
            for entry in device_matrix("tensor")
        )

    def not_checked(self) -> list[str]:
        from devcourse.grading import not_checked_here
        from devcourse.machines import MACHINES

        return not_checked_here(machines=tuple(MACHINES))

    def demo_class(self) -> DemoClass | None:
        from devcourse.instructor.roster import WHO

        return DemoClass(DEMO_CLASS, demo_due(), WHO) if DEMO_CLASS.is_dir() else None

    def next_steps(self, demo: bool, whole_class: bool) -> list[str]:
        """The checkout's pages and make targets, where the course's checkout is here."""
        if not (ROOT / "Makefile").is_file():
            return super().next_steps(demo, whole_class)
        return [
            (
                "formgrader, nbgrader's pages for grading by hand and reviewing:"
                " docs/instructors.md, in a term's course directory (make course-dir)"
            ),
            *(
                ["make grade ALL=1: the whole demo class, every assignment"]
                if demo and not whole_class
                else []
            ),
        ]
