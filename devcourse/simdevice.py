"""The simulated accelerator under the course's name, as the notebooks import it (``import
devcourse.simdevice``).

It is the ``simdevice`` distribution's own module, the same object: nothing here but that alias.
"""

import sys

import simdevice as _simdevice

sys.modules[__name__] = _simdevice
