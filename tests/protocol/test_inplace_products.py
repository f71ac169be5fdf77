"""Products compute in place (the opening's differences written into the one message, the sum
made in it or in a received share, Beaver terms accumulated into one fresh tensor, local
truncation in the product's own result): none of it may touch the operands' shares, the
shares of a reveal, or a correlated value's components (mpc/beaver.py, mpc/primitives.py)."""

from __future__ import annotations

import torch

import crypten_lite
from crypten_lite.errors import ProtocolError


def _products_leave_operands_alone():
    from crypten_lite.session import current
    g = torch.Generator().manual_seed(5)  # test data only, never shares
    a, b, w = torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g), torch.randn(4, 3, generator=g)
    x, y, v = (crypten_lite.cryptensor(a, src=0), crypten_lite.cryptensor(b, src=1),
               crypten_lite.cryptensor(w, src=1))
    before = [t.share.clone() for t in (x, y, v)]
    got = {"mul": (x * y, a * b), "square": (x.square(), a * a), "matmul": (x @ v, a @ w),
           "broadcast": (x * y[0], a * b[0]), "again": (x * y, a * b)}
    errors = {k: float((z.get_plain_text() - ref).abs().max()) for k, (z, ref) in got.items()}
    unchanged = all(torch.equal(t.share, s) for t, s in zip((x, y, v), before))
    # A reveal's result is this party's own tensor: changing it changes nothing else.
    first = x.get_plain_text()
    first += 1000
    errors["reveal_again"] = float((x.get_plain_text() - a).abs().max())
    # Rank 0 never draws the components the dealer corrects: reading one is refused.
    triple = current().provider.get("triple", [(3,), (3,)], "mul")
    refused = ""
    try:
        triple[2]
    except ProtocolError as e:
        refused = str(e)
    corrected = triple.corrected()[2].shape
    return errors, unchanged, refused, tuple(corrected)


def test_products_and_reveals_leave_operands_untouched(pool2):
    for rank, (errors, unchanged, refused, corrected) in enumerate(pool2.run(_products_leave_operands_alone)):
        assert unchanged, f"party {rank}: a product changed an operand's share"
        assert max(errors.values()) < 1e-3, errors
        assert corrected == (3,)
        if rank == 0:
            assert "corrected()" in refused
        else:
            assert refused == ""
