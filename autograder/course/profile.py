"""What a course adds to grading, learnt in one place: the profile its ``nbgrader_config.py`` names.

Any nbgrader course is graded with the plain :class:`CourseProfile`, which adds nothing; a course
whose tests rely on helpers of their own names a subclass in its package (``c.Grader.profile =
"package.module.Class"``): the packages its kernels import, what they run first, the devices each
submission is checked on, its demo class and the next steps it names. The guard, the zygote and the
sandbox read it (:class:`KernelSetup`).
"""

from __future__ import annotations

import importlib
import importlib.util
from dataclasses import asdict, dataclass, field
from pathlib import Path

from autograder.course.config import config_of
from autograder.settings import Settings


@dataclass(frozen=True)
class KernelSetup:
    """What a grading kernel is given before the first cell, as the job file carries it to the
    runner."""

    packages: tuple[str, ...] = ()  # imported first; "name.*": the package and each of its modules
    setup: str = ""  # "module.function" called after the imports, before the guard's snapshot
    # "module.function": whether a tensor is one the checks trust (default: exact types)
    plain_tensor: str = ""

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class DemoClass:
    """A course's demo class: the submissions graded when the grader runs from the course's folder
    without a submissions folder named, their due dates, and who each student is (printed after the
    table)."""

    submitted: Path
    # assignment -> due date, as nbgrader reads it
    due: dict[str, str] = field(default_factory=dict)
    who: dict[str, str] = field(default_factory=dict)  # student -> what their submissions show


class CourseProfile:
    """The plain profile: a course whose notebooks need nothing but Python and what they import
    themselves."""

    kernel = KernelSetup()
    # device types the grader simulates: an answer that names one is reviewed
    stand_ins: tuple[str, ...] = ()

    def devices(self) -> str:
        """What the report says each submission is checked on; "" says nothing."""
        return ""

    def not_checked(self) -> list[str]:
        """The machines some checks ask for that this machine cannot stand for, each with why (the
        report says)."""
        return []

    def demo_class(self) -> DemoClass | None:
        """The course's demo class, where it has one."""
        return None

    def next_steps(self, demo: bool, whole_class: bool) -> list[str]:
        """What the lines after the table name to open next, besides the feedback, the report and a
        review: for a grader installed from a wheel, nbgrader's pages and the grader's own commands.
        ``demo``: the demo class was graded; ``whole_class``: every assignment of every student."""
        return [
            (
                "nbgrader formgrader, in the course directory: nbgrader's pages for grading by hand"
                " and reviewing, the grades this run recorded included"
            ),
            (
                "autograder --help: every verb (feedback again, a course directory for a term, a"
                " Dask worker)"
            ),
        ]

    def course_packages(self) -> list[str]:
        """The course's own packages among the kernel's (``name.*``): their code is part of a
        reference's key, and the sandbox shows their folders where they lie outside the Python
        environment (an editable install)."""
        return [name.removesuffix(".*") for name in self.kernel.packages if name.endswith(".*")]

    def package_folders(self) -> list[Path]:
        """The folders of :meth:`course_packages`."""
        return [
            Path(importlib.util.find_spec(name).origin).resolve().parent
            for name in self.course_packages()
        ]


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
            # a profile whose packages are not installed cannot grade; found, not imported (a course
            # package may import torch, which the zygote imports beside the grader's set-up)
            if importlib.util.find_spec(package) is None:
                raise ImportError(name=package)
    except ImportError as error:
        missing = error.name or module
        raise ProfileError(
            f"the course's grading profile {name!r} needs the package {missing.split('.')[0]!r}, "
            "which is not installed here: install it into this environment (the course's own "
            "package: pip install it from the course's repository), or remove c.Grader.profile "
            "from the course's nbgrader_config.py to grade it plainly"
        ) from None
    except (AttributeError, ValueError) as error:
        raise ProfileError(
            f"the course's grading profile {name!r} cannot be imported: {error}"
        ) from None
    return profile


def profile_name_of(workdir: Path) -> str:
    """The profile a course's ``nbgrader_config.py`` names (``c.Grader.profile``); "" where it names
    none."""
    value = config_of(workdir).get("Grader", {}).get("profile", "")
    return value if isinstance(value, str) else ""


def checked_on(settings: Settings) -> tuple[str, tuple[str, ...]]:
    """The devices a run's checks run on and the machines they name that this one cannot stand for:
    as named once for the run (``settings.devices``), else as its profile names them here."""
    if settings.devices is not None and settings.not_checked is not None:
        return settings.devices, tuple(settings.not_checked)
    profile = profile_named(settings.profile or "")
    return profile.devices(), tuple(profile.not_checked())
