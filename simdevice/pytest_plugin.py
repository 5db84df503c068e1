"""simdevice's pytest plugin: simulated devices in any PyTorch project's tests, registered when
simdevice is installed.

``--simdevice N`` turns N simulated devices on for the session; the ``simdevices`` fixture hands
them to a test, turning two on where the option did not. Without either nothing happens, and the
plugin imports neither torch nor pytest before pytest configures it, so a process that only imports
simdevice's modules pays nothing for it.
"""

from __future__ import annotations

import types


def pytest_addoption(parser) -> None:
    group = parser.getgroup("simdevice", "simulated accelerator (simdevice)")
    group.addoption(
        "--simdevice",
        type=int,
        default=0,
        metavar="N",
        help=(
            "turn on N simulated devices (sim:0 ... sim:N-1) for the whole session; by default they"
            " are turned on only for tests that ask for the simdevices fixture"
        ),
    )


def pytest_configure(config) -> None:
    import pytest

    count = config.getoption("simdevice")
    if count < 0:
        raise pytest.UsageError(f"--simdevice takes a number of devices, 0 or more, not {count}")
    if count:
        import simdevice

        simdevice.enable(count)

    @pytest.fixture(scope="session")
    def simdevices() -> list:
        """The simulated devices, ``[sim:0, sim:1, ...]``: those of ``--simdevice``, else two turned
        on now (for the rest of the session, as :func:`simdevice.enable` does)."""
        import simdevice

        if not simdevice.is_enabled():
            simdevice.enable(2)
        return simdevice.devices()

    # pytest finds fixtures on any object it is handed
    fixtures = types.ModuleType("simdevice_fixtures")
    fixtures.simdevices = simdevices
    config.pluginmanager.register(fixtures, "simdevice-fixtures")


def pytest_report_header(config) -> str | None:
    count = config.getoption("simdevice")
    return (
        f"simdevice: {count} simulated device(s) on (sim:0 ... sim:{count - 1})" if count else None
    )
