"""Helpers shared by the notebooks of the PyTorch device-management course.

Every helper works on a machine without a GPU; each docstring says what it
does there. The lesson that introduces a helper is named at the end of its
docstring, so a reader can go back to where it is explained.
"""

__all__ = ["accelerator_or_simulated", "best_device"]
__version__ = "0.1.0"


def __getattr__(name: str):
    """``devcourse.best_device`` and ``devcourse.accelerator_or_simulated``, imported at first use.

    They live in :mod:`devcourse.devices`, which imports torch; a program that only
    needs another module of the package (the autograder needs :mod:`autograder.run.forkclient` and
    :mod:`devcourse.validation`, neither of which uses torch) does not wait for torch.
    """
    if name in __all__:
        from devcourse import devices

        return getattr(devices, name)
    raise AttributeError(f"module 'devcourse' has no attribute {name!r}")


def __dir__() -> list[str]:
    """What ``dir(devcourse)`` and Jupyter's completion list: the lazily imported helpers too."""
    return sorted({*globals(), *__all__})
