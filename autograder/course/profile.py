"""What a course adds to grading, learnt in one place: the profile its ``nbgrader_config.py`` names.

Any nbgrader course is graded with the plain :class:`CourseProfile`, which adds nothing; a course whose tests rely
on helpers of their own names a subclass (``c.Grader.profile = "package.module.Class"``), as this course names
:class:`DeviceCourse`: the packages its kernels import, what they run first, and the devices each submission is
checked on. The guard, the zygote and the sandbox read it (:class:`KernelSetup`).
"""

from __future__ import annotations

import importlib
from dataclasses import asdict, dataclass
from pathlib import Path

from autograder.course.config import config_of


@dataclass(frozen=True)
class KernelSetup:
    """What a grading kernel is given before the first cell, as the job file carries it to the runner."""

    packages: tuple[str, ...] = ()  # imported first; "name.*": the package and each of its modules
    setup: str = ""  # "module.function" called after the imports, before the guard's snapshot
    plain_tensor: str = ""  # "module.function": whether a tensor is one the checks trust (default: exact types)

    def as_dict(self) -> dict:
        return asdict(self)


class CourseProfile:
    """The plain profile: a course whose notebooks need nothing but Python and what they import themselves."""

    kernel = KernelSetup()
    stand_ins: tuple[str, ...] = ()  # device types the grader simulates: an answer that names one is reviewed

    def devices(self) -> str:
        """What the report says each submission is checked on; "" says nothing."""
        return ""

    def not_checked(self) -> list[str]:
        """The machines some checks ask for that this machine cannot stand for, each with why (the report says)."""
        return []

    def course_packages(self) -> list[str]:
        """The course's own packages among the kernel's (``name.*``): their code is part of a reference's key, and
        the sandbox shows their folders where they lie outside the Python environment (an editable install)."""
        return [name.removesuffix(".*") for name in self.kernel.packages if name.endswith(".*")]

    def package_folders(self) -> list[Path]:
        """The folders of :meth:`course_packages`."""
        return [Path(importlib.import_module(name).__file__).resolve().parent for name in self.course_packages()]


class DeviceCourse(CourseProfile):
    """This course: its kernels import torch, ``simdevice`` and ``devcourse``, and every check runs on the device matrix
    (the CPU, and CUDA or the simulated accelerator), turned on before the student's code runs."""

    kernel = KernelSetup(packages=("numpy", "torch", "torch.nn", "torch.testing", "torch._subclasses.fake_tensor",
                                   "simdevice.*", "devcourse.*"),
                         setup="devcourse.grading.device_matrix", plain_tensor="devcourse.grading.is_plain_tensor")
    stand_ins = ("sim",)

    def devices(self) -> str:
        from devcourse.grading import device_matrix

        return " ".join(f"{entry.device}{'' if entry.real else ' (simulated)'}" for entry in device_matrix("tensor"))

    def not_checked(self) -> list[str]:
        from devcourse.grading import not_checked_here
        from devcourse.machines import MACHINES

        return not_checked_here(machines=tuple(MACHINES))


class ProfileError(Exception):
    """A profile named in a course's configuration that cannot be used; the message says why."""


def profile_named(name: str) -> CourseProfile:
    """The profile of the class ``name`` (``package.module.Class``); the plain one for ``""``."""
    if not name:
        return CourseProfile()
    module, _, attribute = name.rpartition(".")
    try:
        found = getattr(importlib.import_module(module), attribute)
        if not (isinstance(found, type) and issubclass(found, CourseProfile)):
            raise ProfileError(f"the course's grading profile {name!r} is not a CourseProfile")
        profile = found()
        for package in profile.course_packages():
            importlib.import_module(package)  # a profile whose packages are not installed cannot grade
    except ImportError as error:
        missing = error.name or module
        raise ProfileError(f"the course's grading profile {name!r} needs the package {missing.split('.')[0]!r}, "
                           f"which is not installed here: install it into this environment (the course's own "
                           f"package: pip install it from the course's repository), or remove c.Grader.profile "
                           f"from the course's nbgrader_config.py to grade it plainly") from None
    except (AttributeError, ValueError) as error:
        raise ProfileError(f"the course's grading profile {name!r} cannot be imported: {error}") from None
    return profile


def profile_name_of(workdir: Path) -> str:
    """The profile a course's ``nbgrader_config.py`` names (``c.Grader.profile``); "" where it names none."""
    value = config_of(workdir).get("Grader", {}).get("profile", "")
    return value if isinstance(value, str) else ""
