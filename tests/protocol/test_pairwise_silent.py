"""Provider 'pairwise' with silent OT over real gRPC (separate processes, TLS): a ReLU large
enough that its OT extensions are silent (n * 64 >= ot.SILENT_MIN) agrees with torch, its
online rounds and bytes are the dealer provider's, and its offline bytes are far below
IKNP's 16 bytes per OT (provider/ferret.py). The unit tests of the construction itself are
tests/unit/test_pairwise_ferret.py."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("tenseal")
pytest.importorskip("nacl")

import crypten_lite  # noqa: E402
from crypten_lite import comm  # noqa: E402

from tests.conftest import get_pool  # noqa: E402

N = 4096                       # 64 OTs per element and top mask: 262,144 per extension


def _relu(n: int) -> dict:
    from crypten_lite.provider import ot
    from crypten_lite.session import current
    c = comm.get()
    x = torch.linspace(-4, 4, n)
    ex = crypten_lite.cryptensor(x, src=0)
    provider = current().provider
    pairwise = provider.name == "pairwise"
    if pairwise:
        before = provider.stats["pairwise_bytes_sent"] + provider.stats["pairwise_bytes_received"]
        made = provider._ot.made
    c.reset_communication_stats()
    y = ex.relu()
    online = c.get_communication_stats()
    out = {"err": (y.get_plain_text() - x.relu()).abs().max().item(),
           "rounds": online["rounds"], "bytes": online["bytes_sent"]}
    if pairwise:
        out.update(silent=[p is not None and p.produced > 0 for p in provider._ot._silent],
                   mode=provider._ot.mode, silent_min=ot.SILENT_MIN,
                   offline=provider.stats["pairwise_bytes_sent"]
                   + provider.stats["pairwise_bytes_received"] - before,
                   ots=provider._ot.made - made)
    return out


def test_silent_relu_agrees_with_torch_and_keeps_the_online_cost():
    pw = get_pool(2, provider="pairwise")
    pw.run(_relu, N)                                     # the first use bootstraps the pools
    got = pw.run(_relu, N)
    dealer = get_pool(2).run(_relu, N)
    for r in range(2):
        assert got[r]["mode"] == "ferret" and N * 64 >= got[r]["silent_min"]
        assert any(got[r]["silent"]), got[r]              # the large extensions went silent
        assert got[r]["err"] < 1e-2, got[r]
        assert (got[r]["rounds"], got[r]["bytes"]) == (dealer[r]["rounds"], dealer[r]["bytes"])
    # offline, both parties' bytes once the pools run (their one-time bootstrap, 74,036
    # IKNP OTs per direction, in the first call): far below IKNP's 16 bytes per OT
    assert got[0]["ots"] > 0 and got[0]["offline"] < 16 * got[0]["ots"] / 4, got[0]
