"""Provider pairwise without its libraries: a clear ConfigError naming the install command when
the provider is made, before any exchange with the other party (PyNaCl's was only raised at
the first OT, after the handshake)."""

from __future__ import annotations

import sys

import pytest

from crypten_lite import provider
from crypten_lite.config import Config
from crypten_lite.errors import ConfigError


@pytest.mark.parametrize("module, name", [("nacl", "PyNaCl"), ("tenseal", "TenSEAL")])
def test_missing_library_is_named_when_the_provider_is_made(monkeypatch, module, name):
    for m in [m for m in sys.modules if m == module or m.startswith(module + ".")]:
        monkeypatch.delitem(sys.modules, m)
    monkeypatch.setitem(sys.modules, module, None)      # import of it fails
    cfg = Config(rank=0, world_size=2, provider="pairwise")

    class NoComm:                                        # any exchange is a test failure
        def __getattr__(self, attr):
            raise AssertionError(f"the provider used the transport ({attr}) before its check")

    with pytest.raises(ConfigError) as e:
        provider.make(cfg, NoComm())
    assert name in str(e.value) and "pip install 'crypten_lite[pairwise]'" in str(e.value)
