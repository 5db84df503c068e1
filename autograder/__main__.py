"""``python -m autograder VERB``: see :mod:`autograder.cli`."""

from autograder.cli import main, run

run(main)
