"""What grade prints after its table: only what was chosen, who the demo students are, what to open
next."""

from autograder.cli.guide import HOW_TO_READ, guide, shown
from autograder.course.profile import CourseProfile
from autograder.settings import Result
from devcourse.instructor.paths import DEMO_CLASS
from devcourse.instructor.profile import DeviceCourse
from devcourse.instructor.roster import WHO


def _results() -> list[Result]:
    return [
        Result("ada", "00", 8, 10),
        Result("ada", "01", 8, 8),
        Result("mallory", "00", None, 10, note="withheld", withheld=True),
        Result("mallory", "01", 0, 8),
        Result("tony", "00", None, 10, note="not submitted"),
        Result("tony", "02", 3, 7),
    ]


def test_the_table_shows_the_assignments_chosen_and_the_students_who_handed_any_in():
    table = shown(_results(), ("00", "01"), ())
    assert {(r.student, r.assignment) for r in table} == {
        ("ada", "00"),
        ("ada", "01"),
        ("mallory", "00"),
        ("mallory", "01"),
    }
    assert shown(_results(), (), ()) == _results(), "nothing chosen: the whole class, every row"
    assert {r.student for r in shown(_results(), (), ("tony",))} == {"tony"}


def test_the_guide_names_the_demo_students_shown_and_what_to_open_next(tmp_path):
    page = tmp_path / "feedback" / "ada" / "00" / "00.html"
    page.parent.mkdir(parents=True)
    page.write_text("<html></html>")
    table = shown(_results(), ("00", "01"), ())
    lines = guide(
        table, tmp_path, DeviceCourse(), demo=DeviceCourse().demo_class(), whole_class=False
    )
    text = "\n".join(lines)
    assert HOW_TO_READ in lines
    assert f"  ada: {WHO['ada']}" in lines and f"  mallory: {WHO['mallory']}" in lines
    assert "tony:" not in text, "a student the table does not show is not explained"
    assert f"open {page}" in text
    assert "python -m autograder review mallory/00 --release" in text
    assert "make grade ALL=1" in text and "formgrader" in text
    plain = "\n".join(guide(table, tmp_path, DeviceCourse(), demo=None, whole_class=True))
    assert "demo class" not in plain and "ALL=1" not in plain and f"open {page}" in plain


def test_a_course_without_a_profile_of_its_own_is_shown_the_graders_commands(tmp_path, monkeypatch):
    """A course with no profile, or this course's installed without its checkout: no docs/ folder
    and no Makefile around, so the lines name commands on PATH instead, and no student is
    explained."""
    from devcourse.instructor import profile

    for course in (CourseProfile(), DeviceCourse()):
        text = "\n".join(
            guide(
                shown(_results(), ("00", "01"), ()), tmp_path, course, demo=None, whole_class=False
            )
        )
        assert ("make " in text) == isinstance(course, DeviceCourse), text
    # this course's, installed from a wheel: no checkout
    monkeypatch.setattr(profile, "ROOT", tmp_path)
    for course in (CourseProfile(), DeviceCourse()):
        text = "\n".join(
            guide(
                shown(_results(), ("00", "01"), ()),
                tmp_path,
                course,
                demo=course.demo_class(),
                whole_class=False,
            )
        )
        assert "nbgrader formgrader" in text and "autograder --help" in text
        assert "docs/" not in text and "make " not in text
    assert "ada:" not in "\n".join(
        guide(
            _results(),
            tmp_path,
            CourseProfile(),
            demo=CourseProfile().demo_class(),
            whole_class=True,
        )
    )


def test_the_feedback_page_named_first_is_of_a_submission_that_lost_some_points(tmp_path):
    for student, assignment in (("ada", "00"), ("ada", "01"), ("mallory", "01"), ("tony", "02")):
        page = tmp_path / "feedback" / student / assignment / f"{assignment}.html"
        page.parent.mkdir(parents=True)
        page.write_text("<html></html>")
    text = "\n".join(guide(_results(), tmp_path, CourseProfile(), demo=None, whole_class=True))
    assert f"open {tmp_path / 'feedback' / 'tony' / '02' / '02.html'}" in text, (
        "3 of 7: passed and failed tests"
    )


def test_every_demo_student_is_explained():
    assert sorted(WHO) == sorted(p.name for p in DEMO_CLASS.iterdir() if p.is_dir())


def test_the_header_names_a_machine_the_checks_ask_for_that_this_one_cannot_stand_for(
    monkeypatch, tmp_path
):
    """On a CUDA machine the simulated Mac cannot be turned on: the run says so before it starts
    (and report.txt keeps it), instead of passing those checks over in silence."""
    import argparse

    import torch

    from autograder.cli import grade
    from autograder.settings import Settings

    args = argparse.Namespace(submitted=DEMO_CLASS, course=None)
    settings = Settings(jobs=1, profile="devcourse.instructor.profile.DeviceCourse")
    here = grade._header(args, settings, f"sqlite:///{tmp_path}/gradebook.db")
    assert not any(line.startswith("Not checked on this machine") for line in here), (
        "a CPU machine stands for a Mac"
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    on_cuda = grade._header(args, settings, f"sqlite:///{tmp_path}/gradebook.db")
    said = [line for line in on_cuda if line.startswith("Not checked on this machine")]
    assert any("a simulated Mac" in line for line in said), on_cuda
