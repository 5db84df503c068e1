"""The instructor's side of the course: build student versions, check them, grade."""

import sys

# Every process of the grader (the grader, its runners, a Dask worker's jobs) imports nbformat, whose
# jsonschema builds a parser for the IRI string format at import when rfc3987-syntax is installed
# (JupyterLab's jupyter-events asks for it): about 1 s of processor time on every start, for a
# format that no notebook, gradebook or job file uses. jsonschema skips that format when the module
# cannot be imported, so the grader's processes say it cannot (a kernel forked from the zygote is
# given its imports back: autograder.run.zygote).
SKIPPED_IMPORTS = ("rfc3987_syntax",)
sys.modules.update({name: None for name in SKIPPED_IMPORTS if name not in sys.modules})
