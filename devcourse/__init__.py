"""Helpers shared by the notebooks of the PyTorch device-management course.

Every helper works on a machine without a GPU; each docstring says what it
does there. The lesson that introduces a helper is named at the end of its
docstring, so a reader can go back to where it is explained.
"""

from devcourse.devices import accelerator_or_simulated, best_device

__all__ = ["accelerator_or_simulated", "best_device"]
__version__ = "0.1.0"
