"""nbgrader settings for the course.

Instructor notebooks in ``solutions/`` are the source; ``nbgrader
generate_assignment`` writes the student versions into ``course/``.
"""

c = get_config()  # noqa: F821 (provided by nbgrader when it loads this file)

c.CourseDirectory.course_id = "pytorch-devices"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "course"
# The gradebook of the instructor's own working copy; grading runs use their own.
c.CourseDirectory.db_url = "sqlite:///.nbgrader/gradebook.db"

c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.text_stub = "YOUR ANSWER HERE"

# A student cell may train a small model; 60 s per cell is generous on a laptop.
c.ExecutePreprocessor.timeout = 60

# Files a notebook writes beside itself when it runs (08's memory picture) are the
# run's output, not part of the assignment: never copied from solutions/ into course/
c.CourseDirectory.ignore = [
    ".ipynb_checkpoints",
    "*.pyc",
    "__pycache__",
    "feedback",
    "memory_timeline.png",
]

# Late work: 10% of a notebook's score per started day past the assignment's due date, all of it
# after ten days (autograder/plugins/late.py). Due dates live in the gradebook; the submission time
# is timestamp.txt.
c.AssignLatePenalties.plugin_class = "autograder.plugins.late.PercentPerDay"
c.PercentPerDay.percent_per_day = 10.0

# What this course adds to grading (its kernels import torch and devcourse, and check on the device
# matrix): the grader's profile of it (devcourse/instructor/profile.py); a course that names none is
# graded plainly.
c.Grader.profile = "devcourse.instructor.profile.DeviceCourse"
