"""The instructor's side of the course: build student versions, check them, grade."""
