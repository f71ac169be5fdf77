"""Provider pairwise with empty operands (a batch of none, a zero inner dimension): the
products are torch's (empty, or zeros where the inner dimension is 0), made on demand and from
a prefetched plan, and the session goes on (the HE packing of an empty operand raised and left
the channel refusing every later request)."""

from __future__ import annotations

import pytest

pytest.importorskip("tenseal")
pytest.importorskip("nacl")

from tests.conftest import get_pool  # noqa: E402

CASES = [((0, 3), (3, 2), "matmul"), ((4, 0), (0, 2), "matmul"), ((4, 3), (3, 0), "matmul"),
         ((0,), (0,), "mul"), ((0, 1, 5, 5), (2, 1, 3, 3), "conv2d")]


def _products(prefetch: bool):
    import torch
    import torch.nn.functional as F

    import crypten_lite
    from crypten_lite.mpc import offline
    g = torch.Generator().manual_seed(3)
    out = []
    pairs = [(torch.randn(*a, generator=g), torch.randn(*b, generator=g), op) for a, b, op in CASES]
    xs = [(crypten_lite.cryptensor(a, src=0), crypten_lite.cryptensor(b, src=1), op) for a, b, op in pairs]

    def run():
        got = []
        for x, y, op in xs:
            z = x @ y if op == "matmul" else x * y if op == "mul" else x.conv2d(y)
            got.append(z.get_plain_text())
        return got
    if prefetch:
        with offline.record() as plan:
            run()
        offline.prefetch(plan)
    got = run()
    for (a, b, op), z in zip(pairs, got):
        ref = a @ b if op == "matmul" else a * b if op == "mul" else F.conv2d(a, b)
        out.append((tuple(z.shape) == tuple(ref.shape), float((z - ref).abs().max()) if z.numel() else 0.0))
    after = crypten_lite.cryptensor(torch.full((3,), 2.0), src=0)
    out.append(float((after * after).get_plain_text().sum()))
    return out


@pytest.mark.parametrize("prefetch", [False, True], ids=["on_demand", "prefetched"])
def test_empty_operands_give_torchs_products_and_the_session_goes_on(prefetch):
    got = get_pool(2, provider="pairwise").run(_products, prefetch)[0]
    *products, after = got
    assert all(same and err == 0.0 for same, err in products), products
    assert after == pytest.approx(12.0, abs=1e-3)
