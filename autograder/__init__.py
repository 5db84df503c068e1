"""A grader for nbgrader courses: each submission run sandboxed, judged against the instructor's
solution, recorded in nbgrader's gradebook with feedback. ``python -m autograder`` lists its verbs
(:mod:`autograder.cli`)."""
