"""Shared fixtures: persistent pools of gRPC party processes (plus a dealer under the additive
protocol) per world size, provider and protocol.

Protocols: `pool` runs a test with 2 and 3 parties under the additive protocol; `pool_all`
adds 3 parties under replicated secret sharing ("3rss", no dealer); `pool3_rss` is the rss
pool alone. A test of ops that exist under both protocols takes `pool_all`."""

from __future__ import annotations

import os
import pathlib

import pytest
from hypothesis import settings

from crypten_lite.mpc import PartyPool

# Property tests never depend on timing (no per-example deadline: a loaded machine is slow,
# not wrong) and draw the same examples on every run (a rerun never changes the verdict).
settings.register_profile("crypten_lite", deadline=None, derandomize=True, print_blob=True)
settings.load_profile("crypten_lite")

_POOLS: dict[tuple[int, str, str], PartyPool] = {}


def get_pool(world_size: int, provider: str = "dealer", protocol: str = "additive") -> PartyPool:
    """A pool shared by the whole test session (restarted after a failing run)."""
    key = (world_size, provider, protocol)
    if key not in _POOLS:
        # A party that fails stops the others at once (abort frame), so the timeout only
        # bounds a stuck peer: long, so that no correct wait reaches it on a loaded machine.
        _POOLS[key] = PartyPool(world_size, provider=provider, timeout=600, protocol=protocol)
    return _POOLS[key]


@pytest.fixture(scope="session")
def pool2() -> PartyPool:
    return get_pool(2)


@pytest.fixture(scope="session")
def pool3() -> PartyPool:
    return get_pool(3)


@pytest.fixture(params=[2, 3], ids=["2pc", "3pc"])
def pool(request) -> PartyPool:
    """Runs the test with 2 and with 3 parties."""
    return get_pool(request.param)


@pytest.fixture(scope="session")
def pool3_rss() -> PartyPool:
    """3 parties under replicated secret sharing (no dealer process)."""
    return get_pool(3, protocol="rss")


@pytest.fixture(params=[(2, "additive"), (3, "additive"), (3, "rss")], ids=["2pc", "3pc", "3rss"])
def pool_all(request) -> PartyPool:
    """Runs the test with 2 and 3 parties (additive) and with 3 parties under rss."""
    world_size, protocol = request.param
    return get_pool(world_size, protocol=protocol)


def pytest_sessionfinish(session, exitstatus):
    for p in _POOLS.values():
        p.close()
    _POOLS.clear()


# -- tests that change the machine: opt-in -----------------------------------------------------
# A test that installs system packages or starts system services (the Docker test: Debian's
# docker.io, docker-compose, containerd, runc, iptables and debootstrap, a root dockerd and a few
# GB of images; a browser test: Debian's chromium) carries the marker
#     @pytest.mark.system_tests("installs Debian's chromium with apt-get")   (or as pytestmark)
# and runs only with CRYPTEN_LITE_SYSTEM_TESTS=1 (.ci/run sets it); otherwise it is skipped with
# a reason that names the variable and what the test would install. CRYPTEN_LITE_SKIP_DOCKER=1
# (the old opt-out) still switches the Docker test off.
SYSTEM_TESTS_ENV = "CRYPTEN_LITE_SYSTEM_TESTS"


def system_tests_enabled() -> bool:
    """True where the user opted in to tests that install system packages."""
    return os.environ.get(SYSTEM_TESTS_ENV) == "1"


# -- a run that explains itself ----------------------------------------------------------------
# Tests run phase by phase (unit, protocol, integration, container: the system tests last),
# and a line names each phase, with its count, when it starts. `announce` (a fixture) prints a
# line to the terminal at once, whatever pytest captures: call it before any step that takes
# minutes (installing the Docker engine, building the image).
PHASES = ("unit", "protocol", "integration", "torchvision", "container")


def _phase(item: pytest.Item) -> str:
    if item.get_closest_marker("system_tests") is not None:
        return "container"
    parts = pathlib.Path(str(item.fspath)).parts
    if "tests" in parts and parts.index("tests") + 1 < len(parts) - 1:
        name = parts[parts.index("tests") + 1]
        if name in PHASES:
            return name
    return "other"


def pytest_configure(config):
    config.addinivalue_line("markers", "system_tests(what): installs system packages or starts "
                            f"system services; runs only with {SYSTEM_TESTS_ENV}=1 (what: what it "
                            "would install, for the skip reason)")


def pytest_collection_modifyitems(config, items):
    for item in items:
        marker = item.get_closest_marker("system_tests")
        if marker is not None and not system_tests_enabled():
            what = marker.args[0] if marker.args else "installs system packages"
            item.add_marker(pytest.mark.skip(
                reason=f"a system test: it {what}; set {SYSTEM_TESTS_ENV}=1 to run it"))
    order = {name: i for i, name in enumerate(PHASES)}
    items.sort(key=lambda item: order.get(_phase(item), len(PHASES)))  # stable: files keep order


def _say(config, text: str) -> None:
    """Print a line on the terminal now, past pytest's output capture."""
    tr = config.pluginmanager.get_plugin("terminalreporter")
    capman = config.pluginmanager.get_plugin("capturemanager")
    if tr is None or capman is None:
        print(text, flush=True)
        return
    with capman.global_and_fixture_disabled():
        if getattr(tr._tw, "width_of_current_line", 0):  # noqa: SLF001 (after a row of dots)
            tr.write("\n")
        tr.write_line(text)
        tr.flush()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    config = item.config
    phase = _phase(item)
    if getattr(config, "_crypten_lite_phase", None) == phase:
        return
    config._crypten_lite_phase = phase  # noqa: SLF001
    counts: dict[str, int] = {}
    for other in item.session.items:  # those selected (after -k / -m / deselection)
        counts[_phase(other)] = counts.get(_phase(other), 0) + 1
    if config.getoption("verbose") >= -1:
        where = "system tests" if phase == "container" else f"tests/{phase}"
        _say(config, f"== phase {phase} ({where}): {counts.get(phase, 0)} tests ==")


@pytest.fixture(scope="session")
def announce(request):
    """``announce(text)`` prints a line to the terminal now (not captured)."""
    return lambda text: _say(request.config, text)
