"""Issue 29's audit: an offline store of a private model's inference. A plan recorded from a
later forward of an already masked model holds fixed-weight triples bound to this session's
weight masks; stored and used by a later session (which masks its weights afresh) it gave
outputs off by about 3e9 with no error. make_store and prefetch from a store now refuse such a
plan on both parties, naming what to do; a freshly loaded model's FIRST forward, stored and
prefetched before another fresh load's first forward, agrees with torch with nothing made
online (the attack and the working path, in one session of two real party processes)."""

from __future__ import annotations

import pytest

pytest.importorskip("tenseal")
pytest.importorskip("nacl")

from tests.conftest import get_pool  # noqa: E402


def _stored_model(root: str):
    import json

    import torch

    import crypten_lite
    from crypten_lite.errors import ConfigError
    from crypten_lite.mpc import offline
    from crypten_lite.session import current
    rank = current().rank
    torch.manual_seed(0)  # test data only
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    x = torch.randn(2, 16)

    def load():
        private = crypten_lite.nn.from_pytorch(model if rank == 0 else None, torch.empty(2, 16), src=0)
        return private.encrypt(src=0).eval()
    xe = crypten_lite.cryptensor(x if rank == 1 else None, src=1)
    key, directory = f"{root}/key-{{rank}}", f"{root}/store-{{rank}}"
    out = {}
    first = load()
    first(xe)                                   # masks its weights
    with offline.record() as later:
        first(xe)
    for name, call in (("make", lambda: offline.make_store(later, directory, key_file=key)),
                       ("use", lambda: offline.prefetch(later, store=directory, key_file=key))):
        try:
            call()
            out[name] = "accepted"
        except ConfigError as e:
            out[name] = str(e)
    fresh = load()
    with offline.record() as plan:              # a fresh load's first forward: masks in the plan
        fresh(xe)
    plan = json.loads(json.dumps(plan))         # as a later session would read it back
    out["store_id"] = offline.make_store(plan, directory, key_file=key)
    again = load()                              # "the later session": masks drawn afresh
    provider = current().provider
    offline.prefetch(plan, store=directory, key_file=key)
    made = provider.stats["pairwise_made"]
    got = again(xe).get_plain_text()
    out["made_online"] = provider.stats["pairwise_made"] - made
    with torch.no_grad():
        out["err"] = float((got - model(x)).abs().max())
    return out


def test_a_store_of_a_masked_models_later_forward_is_refused_and_a_first_forward_works(tmp_path):
    results = get_pool(2, provider="pairwise").run(_stored_model, str(tmp_path))
    for r in results:
        for name in ("make", "use"):
            assert "fixed-weight products whose weight masks were drawn before" in r[name], r[name]
            assert "FIRST forward" in r[name]
        assert r["err"] < 1e-3 and r["made_online"] == 0, r
    assert results[0]["store_id"] == results[1]["store_id"]
