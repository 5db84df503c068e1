"""What this course's instructors and maintainers run, apart from what students' notebooks import:
the build of the notebooks from ``solutions/``, the demo class, the GPU and Slurm checks, and the
grader's profile of the course (:mod:`.profile`). The grader runs them as its verbs (``autograder
build``, ``demo``, ``gpu-check``, ``slurm-check``), registered in the ``autograder.verbs`` entry
point group by this package's distribution.
"""
