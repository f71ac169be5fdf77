"""Shared fixtures: persistent pools of gRPC party processes (plus a dealer under the additive
protocol) per world size, provider and protocol.

Protocols: `pool` runs a test with 2 and 3 parties under the additive protocol; `pool_all`
adds 3 parties under replicated secret sharing ("3rss", no dealer); `pool3_rss` is the rss
pool alone. A test of ops that exist under both protocols takes `pool_all`."""

from __future__ import annotations

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
