"""Named and typed CrypTensors over gRPC: names flow through ops and autograd; dtypes promote."""

from __future__ import annotations

import itertools

import pytest
import torch

import crypten_lite
from crypten_lite.names import NamedDimError


def named_ops():
    a = torch.arange(24, dtype=torch.float32).reshape(2, 3, 4) / 10
    x = crypten_lite.cryptensor(a, src=0, names=("N", "C", "L"))
    y = crypten_lite.cryptensor(a[0], src=1, names=("C", "L"))
    out = {}
    out["names"] = x.names
    out["sum_C"] = (x.sum("C").names, torch.allclose(x.sum("C").get_plain_text(), a.sum(1), atol=1e-3))
    out["mean_keep"] = x.mean("L", keepdim=True).names
    out["add"] = (x + y).names
    out["mul_pub"] = (x * torch.ones(4)).names
    out["transpose"] = x.transpose("C", "L").names
    out["align_to"] = (x.align_to("L", "N", "C").names, tuple(x.align_to("L", "N", "C").shape))
    out["align_to_ellipsis"] = x.align_to("L", ...).names
    out["rename"] = x.rename(N="batch").names
    out["rename_pos"] = x.rename("a", "b", "c").names
    out["refine"] = crypten_lite.cryptensor(a, src=0).refine_names(..., "L").names
    out["unsqueeze"] = x.unsqueeze(0).names
    out["index"] = x[0].names
    out["flatten"] = (x.flatten(["C", "L"], "F").names, tuple(x.flatten(["C", "L"], "F").shape))
    out["unflatten"] = x.flatten(["C", "L"], "F").unflatten("F", (("C", 3), ("L", 4))).names
    out["cat"] = crypten_lite.cat([x, x], "C").names
    out["matmul"] = (x @ crypten_lite.cryptensor(torch.ones(4, 5), src=0, names=("L", "K"))).names
    out["plain_named"] = x.get_plain_text(named=True)[1]
    out["plain_type"] = type(x.get_plain_text()).__name__
    try:
        x + crypten_lite.cryptensor(a, src=0, names=("N", "D", "L"))
        out["mismatch"] = "no error"
    except NamedDimError as e:
        out["mismatch"] = str(e)
    g = crypten_lite.cryptensor(a, src=0, names=("N", "C", "L"), requires_grad=True)
    (g * g).sum().backward()
    out["grad_names"] = g.grad.names
    out["grad_ok"] = torch.allclose(g.grad.get_plain_text(), 2 * a, atol=1e-3)
    return out


def test_names_flow_through_ops(pool2):
    r = pool2.run(named_ops)[0]
    assert r["names"] == ("N", "C", "L")
    assert r["sum_C"] == (("N", "L"), True)
    assert r["mean_keep"] == ("N", "C", "L")
    assert r["add"] == ("N", "C", "L") and r["mul_pub"] == ("N", "C", "L")
    assert r["transpose"] == ("N", "L", "C")
    assert r["align_to"] == (("L", "N", "C"), (4, 2, 3))
    assert r["align_to_ellipsis"] == ("L", "N", "C")
    assert r["rename"] == ("batch", "C", "L") and r["rename_pos"] == ("a", "b", "c")
    assert r["refine"] == (None, None, "L")
    assert r["unsqueeze"] == (None, "N", "C", "L")
    assert r["index"] == ("C", "L")
    assert r["flatten"] == (("N", "F"), (2, 12))
    assert r["unflatten"] == ("N", "C", "L")
    assert r["cat"] == ("N", "C", "L")
    assert r["matmul"] == ("N", "C", "K")
    assert r["plain_named"] == ("N", "C", "L") and r["plain_type"] == "Tensor"
    assert "C" in r["mismatch"] and "D" in r["mismatch"]
    assert r["grad_names"] == ("N", "C", "L") and r["grad_ok"]


SAMPLES = {
    torch.bool: torch.tensor([True, False, True]),
    torch.int64: torch.tensor([3, -2, 7]),
    torch.float32: torch.tensor([1.5, -0.25, 2.0]),
}
SCALARS = [True, 3, 2.5]


def promotion_cases():
    c = crypten_lite.comm.get()
    results = []
    for (da, ta), (db, tb) in itertools.product(SAMPLES.items(), SAMPLES.items()):
        x = crypten_lite.cryptensor(ta, src=0)
        y = crypten_lite.cryptensor(tb, src=1)
        for name, fn in (("add", lambda p, q: p + q), ("mul", lambda p, q: p * q)):
            if da == db == torch.bool:
                continue  # bool + bool is logical in torch; crypten_lite keeps int arithmetic
            for kind, other, ref_other in (("private", y, tb), ("public", tb, tb)):
                got = fn(x, other).get_plain_text()
                ref = fn(ta, ref_other)
                results.append((name, kind, str(da), str(db), str(got.dtype), str(ref.dtype),
                                float((got.double() - ref.double()).abs().max())))
        for s in SCALARS:
            if da == torch.bool and isinstance(s, bool):
                continue
            got = (x * s).get_plain_text()
            ref = ta * s
            results.append(("mul", "scalar", str(da), repr(s), str(got.dtype), str(ref.dtype),
                            float((got.double() - ref.double()).abs().max())))
    i = crypten_lite.cryptensor(SAMPLES[torch.int64], src=0)
    got = (i / 2).get_plain_text()
    results.append(("div", "scalar", "int64", "2", str(got.dtype), "torch.float32",
                    float((got - SAMPLES[torch.int64] / 2).abs().max())))
    assert c is not None
    return results


def test_type_promotion_matches_torch(pool2):
    for name, kind, da, db, got, ref, err in pool2.run(promotion_cases)[0]:
        assert got == ref, f"{name} {kind} {da} x {db}: {got} != torch {ref}"
        assert err <= 1e-3, f"{name} {kind} {da} x {db}: error {err}"


def exact_integers():
    a = torch.tensor([2 ** 40 - 3, -(2 ** 40) + 5, 123456789])
    b = torch.tensor([7, -3, 2])
    x, y = crypten_lite.cryptensor(a, src=0), crypten_lite.cryptensor(b, src=1)
    return [torch.equal((x + y).get_plain_text(), a + b), torch.equal((x - y).get_plain_text(), a - b),
            torch.equal((x * b).get_plain_text(), a * b), torch.equal((x.sum()).get_plain_text(), a.sum())]


def test_integer_arithmetic_exact_to_2_40(pool_all):
    pool = pool_all  # 2 and 3 parties additive, 3 parties rss
    assert all(pool.run(exact_integers)[0])


def conversions():
    a = torch.tensor([-2.75, -2.0, -0.5, 0.0, 0.25, 1.0, 3.999, -7.0001, 1000.5])
    x = crypten_lite.cryptensor(a, src=0)
    i = crypten_lite.cryptensor(torch.tensor([0, 3, -2]), src=1)
    return {"long": x.long().get_plain_text(), "ref": a.long(), "to": x.to(torch.int64).get_plain_text(),
            "bool": i.bool().get_plain_text(), "float": i.float().get_plain_text()}


def test_conversions_follow_torch(pool_all):
    pool = pool_all  # 2 and 3 parties additive, 3 parties rss
    r = pool.run(conversions)[0]
    assert torch.equal(r["long"], r["ref"]) and torch.equal(r["to"], r["ref"])
    assert r["long"].dtype == torch.int64
    assert torch.equal(r["bool"], torch.tensor([False, True, True]))
    assert torch.equal(r["float"], torch.tensor([0.0, 3.0, -2.0]))


def names_through_nn():
    from crypten_lite import nn
    x = crypten_lite.cryptensor(torch.randn(2, 1, 6, 6), src=1, names=("N", "C", "H", "W"))
    conv = nn.Conv2d(1, 3, 3)
    conv.expected_names = ("N", "C", "H", "W")
    conv.encrypt(src=0)
    y = conv(x)
    lin = nn.Linear(4, 2).encrypt(src=0)
    z = lin(y.flatten(["H", "W"], "F").rename(F="L")[..., :4])
    try:
        conv(x.align_to("N", "H", "W", "C"))
        err = "no error"
    except Exception as e:  # NamedDimError
        err = f"{type(e).__name__}: {e}"
    return y.names, z.names, err


def test_names_through_nn_modules(pool2):
    conv_names, linear_names, err = pool2.run(names_through_nn)[0]
    assert conv_names == ("N", "C", "H", "W")
    assert linear_names == ("N", "C", None)
    assert "NamedDimError" in err and "expects input dims named" in err
