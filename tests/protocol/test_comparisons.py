"""Comparisons, piecewise-linear functions, max/argmax and pooling against torch.

2 and 3 parties over gRPC (session pools from tests/conftest.py), exact results, exact
round and byte counts. Party functions are module level (spawned parties import them).
"""

from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F

import crypten_lite
import crypten_lite.functions as cf
from crypten_lite import comm

SCALE = 2 ** 16


def _q(t: torch.Tensor) -> torch.Tensor:
    """The fixed-point value a float input is encoded to (what MPC actually compares)."""
    return torch.round(t.double() * SCALE) / SCALE


def _same(enc, ref) -> bool:
    got = enc.get_plain_text()
    return got.dtype == ref.dtype and got.shape == ref.shape and bool(torch.equal(got, ref))


def _close(enc, ref, tol: float = 2e-5) -> bool:
    got = enc.get_plain_text().double()
    return got.shape == ref.shape and (got - ref.double()).abs().max().item() <= tol


def _data(seed: int):
    g = torch.Generator().manual_seed(seed)  # test inputs only
    a = torch.randn(6, 7, generator=g) * 10
    b = torch.randn(6, 7, generator=g) * 10
    b[0] = a[0]                                             # ties
    a[1, :4] = torch.tensor([0.0, -0.0, 1e-5, -1e-5])       # zero crossings below one ulp
    b[1, :4] = torch.tensor([-0.0, 0.0, -1e-5, 2e-5])
    a[2, :4] = torch.tensor([2.0 ** 45, -(2.0 ** 45), 2.0 ** 45, -7e13])    # near the range (2^46)
    b[2, :4] = torch.tensor([-(2.0 ** 45), 2.0 ** 45, 2.0 ** 45 - 1, -7e13])
    return a, b


# ------------------------------------------------------------------ party functions
def comparison_results():
    a, b = _data(1)
    x, y = crypten_lite.cryptensor(a, src=0), crypten_lite.cryptensor(b, src=1)
    qa, qb = _q(a), _q(b)
    g = torch.Generator().manual_seed(11)
    col, row = torch.randn(6, 1, generator=g), torch.randn(1, 7, generator=g)
    xc = crypten_lite.cryptensor(col, src=1)
    ia = torch.randint(-5, 5, (20,), generator=g)
    ib = torch.randint(-5, 5, (20,), generator=g)
    xi, yi = crypten_lite.cryptensor(ia, src=0), crypten_lite.cryptensor(ib, src=1)
    out = {}
    for op in ("lt", "le", "gt", "ge", "eq", "ne"):
        ref = getattr(qa, op)(qb)
        out[op] = _same(getattr(x, op)(y), ref)
        out[op + "_public"] = _same(getattr(x, op)(b), ref)
        out[op + "_scalar"] = _same(getattr(x, op)(0.0), getattr(qa, op)(0.0))
        out[op + "_bcast"] = _same(getattr(xc, op)(x), getattr(_q(col), op)(qa))
        out[op + "_bcast_public"] = _same(getattr(x, op)(row), getattr(qa, op)(_q(row)))
        out[op + "_int"] = _same(getattr(xi, op)(yi), getattr(ia, op)(ib))
        out[op + "_torch"] = _same(getattr(torch, op)(x, y), ref)
        out[op + "_public_left"] = _same(getattr(torch, op)(b, x), getattr(qb, op)(qa))
    out["operators"] = all([_same(x < y, qa < qb), _same(x >= 1.5, qa >= 1.5), _same(x == y, qa == qb),
                            _same(2.0 > x, 2.0 > qa), _same(x != y, qa != qb)])
    out["bool_dtype"] = (x < y).dtype == torch.bool and (x < y).precision == 0
    out["to_bool"] = _same(x.to(torch.bool), qa != 0)
    return out


def piecewise_results():
    a, b = _data(2)
    x, y = crypten_lite.cryptensor(a, src=0), crypten_lite.cryptensor(b, src=1)
    qa, qb = _q(a), _q(b)
    ia = torch.randint(-9, 9, (3, 5), generator=torch.Generator().manual_seed(12))
    xi = crypten_lite.cryptensor(ia, src=1)
    lo, hi = torch.full((7,), -3.0), torch.linspace(-1, 8, 7)
    out = {
        "relu": _close(x.relu(), qa.relu()), "relu_torch": _close(torch.relu(x), qa.relu()),
        "relu_F": _close(F.relu(x), qa.relu()), "relu_int": _same(xi.relu(), ia.relu()),
        "abs": _close(x.abs(), qa.abs()), "abs_torch": _close(torch.abs(x), qa.abs()),
        "abs_int": _same(xi.abs(), ia.abs()), "sign": _close(x.sign(), qa.sign(), 0),
        "sign_int": _same(xi.sign(), ia.sign()),
        "where": _close(cf.where(x < y, x, y), torch.where(qa < qb, qa, qb)),
        "where_public_branch": _close(cf.where(x > 0, x, 0.0), torch.where(qa > 0, qa, 0.0)),
        "where_public_cond": _close(cf.where(a > 0, x, y), torch.where(a > 0, qa, qb)),
        "where_both_public": _close(cf.where(x > 0, a, 1.0), torch.where(qa > 0, a.double(), 1.0), 1e-4),
        "where_torch": _close(torch.where(x < y, x, y), torch.where(qa < qb, qa, qb)),
        "where_method": _close(x.where(x < y, y), torch.where(qa < qb, qa, qb)),
        "clamp": _close(x.clamp(-2, 3), qa.clamp(-2, 3)), "clamp_min": _close(x.clamp(min=1), qa.clamp(min=1)),
        "clamp_max": _close(x.clamp(max=-1), qa.clamp(max=-1)),
        "clamp_tensor": _close(x.clamp(lo, hi), qa.clamp(lo.double(), hi.double())),
        "clamp_private": _close(x.clamp(y.clamp(max=0), None), torch.maximum(qa, qb.clamp(max=0))),
        "clamp_torch": _close(torch.clamp(x, -1, 1), qa.clamp(-1, 1)),
        "clip_int": _same(xi.clamp(-2, 4), ia.clamp(-2, 4)),
        "hardtanh": _close(F.hardtanh(x), F.hardtanh(qa)), "hardtanh_args": _close(x.hardtanh(-2, 2), qa.clamp(-2, 2)),
        "relu6": _close(F.relu6(x), F.relu6(qa)),
        "maximum": _close(torch.maximum(x, y), torch.maximum(qa, qb)),
        "minimum": _close(cf.minimum(x, b), torch.minimum(qa, qb)),
        "max_elementwise": _close(x.max(y), torch.maximum(qa, qb)),
    }
    return out


def reduction_results():
    g = torch.Generator().manual_seed(3)
    a = torch.randint(-4, 4, (5, 6, 7), generator=g).double() / 2       # many ties
    a[0, 0] = 3.0                                                        # a full row of ties
    x = crypten_lite.cryptensor(a, src=0)
    ia = torch.randint(-50, 50, (4, 9), generator=g)
    xi = crypten_lite.cryptensor(ia, src=1)
    out = {}
    for method in ("tree", "pairwise"):
        for name, fn in (("max", torch.max), ("min", torch.min)):
            op = getattr(cf, name)
            out[f"{name}_{method}_all"] = _close(op(x, method=method), fn(a), 0)
            for dim in (0, 1, -1):
                for keep in (False, True):
                    v, i = op(x, dim, keep, method=method)
                    rv, ri = fn(a, dim, keep)
                    out[f"{name}_{method}_{dim}_{keep}"] = _close(v, rv, 0) and _same(i, ri)
            v, oh = op(x, 2, one_hot=True, method=method)
            ref_oh = F.one_hot(fn(a, 2).indices, 7).bool()
            out[f"{name}_{method}_one_hot"] = _same(oh, ref_oh)
            arg = getattr(cf, "arg" + name)
            out[f"arg{name}_{method}_all"] = _same(arg(x, method=method), getattr(torch, "arg" + name)(a))
            out[f"arg{name}_{method}_dim"] = _same(arg(x, 1, True, method=method),
                                                   getattr(torch, "arg" + name)(a, 1, True))
            out[f"arg{name}_{method}_onehot_all"] = _same(arg(x, one_hot=True, method=method),
                                                          F.one_hot(getattr(torch, "arg" + name)(a), a.numel()).view(a.shape).bool())
        out[f"int_{method}"] = _same(cf.max(xi, 1, method=method)[0], ia.max(1).values)
    out["torch_max"] = _close(torch.max(x), a.max(), 0) and _same(torch.max(x, 1)[1], a.max(1).indices)
    out["torch_argmin"] = _same(torch.argmin(x, 2), a.argmin(2))
    out["amax"] = _close(torch.amax(x, (0, 2)), a.amax((0, 2)), 0) and _close(x.amin(1, keepdim=True), a.amin(1, keepdim=True), 0)
    out["amax_all"] = _close(x.amax(), a.amax(), 0)
    out["method_max"] = _close(x.max(2)[0], a.max(2).values, 0) and _same(x.argmax(0), a.argmax(0))
    return out


def pooling_results():
    g = torch.Generator().manual_seed(4)
    img = torch.randint(-6, 6, (2, 3, 9, 8), generator=g).double() / 4   # ties in windows
    sig = torch.randn(2, 3, 11, generator=g)
    x, xs = crypten_lite.cryptensor(img, src=0), crypten_lite.cryptensor(sig, src=1)
    qi, qs = _q(img), _q(sig)
    out = {}
    cases = [dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
             dict(kernel_size=(3, 2), stride=(2, 1), dilation=(1, 2)), dict(kernel_size=3, stride=2, ceil_mode=True),
             dict(kernel_size=2, stride=3, padding=1, ceil_mode=True)]
    for i, kw in enumerate(cases):
        v, idx = F.max_pool2d(x, return_indices=True, **kw)
        rv, ridx = F.max_pool2d(qi, return_indices=True, **kw)
        out[f"max_pool2d_{i}"] = _close(v, rv, 0) and _same(idx, ridx)
    out["max_pool2d_method"] = _close(x.max_pool2d(3, stride=1, padding=1), F.max_pool2d(qi, 3, 1, 1), 0)
    out["max_pool2d_3d"] = _close(x[0].max_pool2d(2), F.max_pool2d(qi[0], 2), 0)
    for i, kw in enumerate([dict(kernel_size=3), dict(kernel_size=2, stride=1, padding=1, dilation=2)]):
        v, idx = F.max_pool1d(xs, return_indices=True, **kw)
        rv, ridx = F.max_pool1d(qs, return_indices=True, **kw)
        out[f"max_pool1d_{i}"] = _close(v, rv, 0) and _same(idx, ridx)
    for i, kw in enumerate([dict(kernel_size=2), dict(kernel_size=3, stride=2, padding=1),
                            dict(kernel_size=3, stride=2, padding=1, count_include_pad=False),
                            dict(kernel_size=3, stride=2, padding=1, ceil_mode=True),
                            dict(kernel_size=2, divisor_override=3)]):
        out[f"avg_pool2d_{i}"] = _close(F.avg_pool2d(x, **kw), F.avg_pool2d(qi, **kw), 1e-4)
    for size in ((3, 3), (4, 5), (1, 1), (9, 8), (2, None)):
        out[f"adaptive_avg_{size}"] = _close(F.adaptive_avg_pool2d(x, size), F.adaptive_avg_pool2d(qi, size), 1e-4)
        v, idx = F.adaptive_max_pool2d(x, size, return_indices=True)
        rv, ridx = F.adaptive_max_pool2d(qi, size, return_indices=True)
        out[f"adaptive_max_{size}"] = _close(v, rv, 0) and _same(idx, ridx)
    return out


def binary_results():
    from crypten_lite.mpc import protocol
    from crypten_lite.mpc.binary import BinaryShared
    g = torch.Generator().manual_seed(6)
    a = torch.randint(-(2 ** 62), 2 ** 62, (40,), generator=g)
    b = torch.randint(-(2 ** 62), 2 ** 62, (40,), generator=g)
    x, y = crypten_lite.cryptensor(a, src=0), crypten_lite.cryptensor(b, src=1)
    bx, by = BinaryShared(protocol.a2b(x.share)), BinaryShared(protocol.a2b(y.share))
    m = 0x0F0F0F0F0F0F0F0F
    v = torch.randn(300, generator=g) * 1000
    xv = crypten_lite.cryptensor(v, src=1)
    enc = torch.round(v.double() * SCALE).long()
    rounded = protocol.round_exact(xv.share, 7)
    open_ = protocol.open_
    return {
        "a2b": bool(torch.equal(bx.get_plain_text(), a)),
        "xor": bool(torch.equal((bx ^ by).get_plain_text(), a ^ b)),
        "and": bool(torch.equal((bx & by).get_plain_text(), a & b)),
        "or": bool(torch.equal((bx | by).get_plain_text(), a | b)),
        "not": bool(torch.equal((~bx).get_plain_text(), ~a)),
        "xor_public": bool(torch.equal((bx ^ m).get_plain_text(), a ^ m)),
        "and_public": bool(torch.equal((bx & m).get_plain_text(), a & m)),
        "or_public": bool(torch.equal((bx | m).get_plain_text(), a | m)),
        "lshift": bool(torch.equal((bx << 5).get_plain_text(), a << 5)),
        "rshift": bool(torch.equal((bx >> 5).get_plain_text(), (a >> 5) & ((1 << 59) - 1))),
        "round_exact": bool(torch.equal(open_(rounded), torch.div(enc + 64, 128, rounding_mode="floor"))),
    }


def autograd_records():
    x = crypten_lite.cryptensor(torch.randn(4, 5), src=0, requires_grad=True)
    y = crypten_lite.cryptensor(torch.randn(4, 5), src=1)
    img = crypten_lite.cryptensor(torch.randn(1, 2, 4, 4), src=0, requires_grad=True)
    out = {}
    r = x.relu()
    out["relu"] = (r.grad_fn.op, sorted(k for k in r.grad_fn.saved if k != "out"))
    out["relu_mask"] = bool(torch.equal(r.grad_fn.saved["mask"].get_plain_text(), x.get_plain_text() > 0))
    for name, t in (("abs", x.abs()), ("sign", x.sign()), ("clamp", x.clamp(-1, 1)),
                    ("where", cf.where(y > 0, x, y)), ("max", x.max()), ("max_dim", x.max(1)[0]),
                    ("min_dim", x.min(0)[0]), ("max_pool2d", img.max_pool2d(2)),
                    ("avg_pool2d", img.avg_pool2d(2)), ("adaptive_avg_pool2d", img.adaptive_avg_pool2d(1)),
                    ("adaptive_max_pool2d", img.adaptive_max_pool2d(2))):
        out[name] = (t.grad_fn.op, sorted(k for k in t.grad_fn.saved if k != "out"))
    oh = x.max(1)[0].grad_fn.saved["one_hot"].get_plain_text()
    out["one_hot"] = bool(torch.equal(oh, F.one_hot(x.get_plain_text().argmax(1), 5).bool()))
    return out


def counts(n: int):
    c = comm.get()
    x = crypten_lite.cryptensor(torch.zeros(n), src=0)
    y = crypten_lite.cryptensor(torch.zeros(n), src=1)
    out = {}
    for name, fn in (("lt", lambda: x < y), ("ltz", lambda: x.lt(0)), ("ge", lambda: x >= y),
                     ("eq", lambda: x == y), ("relu", lambda: x.relu()), ("abs", lambda: x.abs()),
                     ("max", lambda: x[:64].max())):
        c.reset_communication_stats()
        fn()
        st = c.get_communication_stats()
        out[name] = (st["rounds"], st["bytes_sent"])
    return out


def million_exact():
    """10^6 random values in [-1000, 1000]: every comparison and relu exact (0 mismatches)."""
    n = 1_000_000
    g = torch.Generator().manual_seed(5)
    a = (torch.rand(n, generator=g, dtype=torch.float64) * 2000 - 1000)
    b = (torch.rand(n, generator=g, dtype=torch.float64) * 2000 - 1000)
    b[:1000] = a[:1000]
    x, y = crypten_lite.cryptensor(a, src=0), crypten_lite.cryptensor(b, src=1)
    qa, qb = _q(a), _q(b)
    c = comm.get()
    c.reset_communication_stats()
    lt = x < y
    st_lt = c.get_communication_stats()
    c.reset_communication_stats()
    r = x.relu()
    st_relu = c.get_communication_stats()
    return {"lt_mismatch": int((lt.get_plain_text() != (qa < qb)).sum()),
            "ltz_mismatch": int(((x < 0).get_plain_text() != (qa < 0)).sum()),
            "relu_mismatch": int((r.get_plain_text().double() != qa.relu()).sum()),
            "lt_stats": (st_lt["rounds"], st_lt["bytes_sent"]),
            "relu_stats": (st_relu["rounds"], st_relu["bytes_sent"])}


# ---------------------------------------------------------------------------- tests
@pytest.mark.parametrize("fn", [comparison_results, piecewise_results, reduction_results, pooling_results,
                                binary_results])
def test_matches_torch(pool, fn):
    results = pool.run(fn)
    assert results[0] == results[-1]
    bad = sorted(k for k, ok in results[0].items() if not ok)
    assert not bad, f"mismatches with torch: {bad}"


@pytest.mark.parametrize("fn", [comparison_results, piecewise_results, reduction_results, pooling_results,
                                binary_results])
def test_matches_torch_rss(pool3_rss, fn):
    """The same checks under rss (3 parties, no dealer)."""
    test_matches_torch(pool3_rss, fn)


def test_autograd_op_names(pool2):
    r = pool2.run(autograd_records)[0]
    assert r["relu"] == ("relu", ["mask"]) and r["relu_mask"]
    assert r["abs"] == ("abs", ["neg"]) and r["sign"] == ("sign", [])
    assert r["clamp"] == ("clamp", ["above", "below"]) and r["where"] == ("where", ["condition"])
    assert r["max"] == ("max", ["dim", "keepdim", "one_hot"]) and r["one_hot"]
    assert r["max_dim"][0] == "max" and r["min_dim"][0] == "min"
    assert r["max_pool2d"][0] == "max_pool2d" and "one_hot" in r["max_pool2d"][1]
    assert r["avg_pool2d"][0] == "avg_pool2d" and r["adaptive_avg_pool2d"][0] == "adaptive_avg_pool2d"
    assert r["adaptive_max_pool2d"][0] == "adaptive_max_pool2d"


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


def _quarter(words: int) -> int:
    return _ceil(_ceil(words, 2), 2)


def msb_words_sent(n: int, parties: int) -> int:
    """Words one party sends for the MSB of n elements (convert.msb_words): level 1 gives 32
    groups per element (n/2 words); radix-4 levels 32 -> 8 -> 2 (7 opened inputs each:
    g0..g2, p0..p3) and 2 -> 1 (2 inputs: g0, p1)."""
    w0 = _ceil(n, 2)
    w1 = _quarter(w0)
    w2 = _quarter(w1)
    tree = 7 * w1 + 7 * w2 + 2 * _ceil(w2, 2)
    peers = parties - 1
    if parties == 2:
        return n + tree                    # level 1: the owner's 2 planes of n/2 words
    # carry-save (own operand, masked) + level 1 (4 shared planes) + tree, to every peer
    return peers * (n + 4 * w0 + tree)


@pytest.mark.parametrize("parties", [2, 3])
def test_exact_counts(pool2, pool3, parties):
    n = 1000
    r = (pool2 if parties == 2 else pool3).run(counts, n)[0]
    peers = parties - 1
    msb = msb_words_sent(n, parties)
    bits = peers * _ceil(n, 64)
    rounds = 5 if parties == 2 else 6   # (carry-save,) level 1, 3 radix-4 levels, B2A
    assert r["lt"] == (rounds, 8 * (msb + bits))
    assert r["ltz"] == r["lt"] and r["ge"] == r["lt"]
    assert r["relu"] == (rounds, 8 * (msb + bits + peers * n))
    assert r["abs"] == r["relu"]
    if parties == 2:
        # zero test: AND tree 64 -> 16 -> 4 -> 1 bits over words of z_0 vs -z_1 (3 rounds of
        # four opened inputs) + B2A
        w = [n]
        for _ in range(3):
            w.append(_quarter(w[-1]))
        assert r["eq"] == (4, 8 * (4 * sum(w[1:]) + _ceil(n, 64)))
    else:
        assert r["eq"] == (6, 8 * (msb_words_sent(2 * n, 3) + 2 * _ceil(n, 64)))
    assert r["max"][0] == 6 * rounds   # 64 candidates: 6 levels of (MSB + fold)


def test_exact_counts_rss(pool3_rss):
    """The same comparisons under rss (rss_binary: MSB with the B2A folded in, 6 rounds)."""
    n = 1000
    got = pool3_rss.run(counts, n)
    # 1000 values = 16 words < SPLIT_WORDS: one chunk, party 2 in role 1 (the most bytes)
    per_rank = {"lt": (19536, 19536, 29056), "eq": (30816, 30816, 50112),
                "relu": (27536, 27536, 37056), "max": (2208, 2208, 3088)}
    for name, sent in per_rank.items():
        # max: 6 levels of 6 rounds (the MSB, the fold in its last round), as at 3 additive parties
        rounds = 6 * 6 if name == "max" else 6
        assert [r[name] for r in got] == [(rounds, b) for b in sent], name
    for r in got:
        assert r["ltz"] == r["ge"] == r["lt"] and r["abs"] == r["relu"]
    # issue 14's per-element bounds (lt <= 24 B, ReLU <= 32 B per party), here averaged over
    # the parties of this one-chunk call; from 3 * SPLIT_WORDS words on every party meets
    # them (tests/protocol/test_rss_binary.py)
    assert sum(r["lt"][1] for r in got) <= 3 * 24 * n and sum(r["relu"][1] for r in got) <= 3 * 32 * n


def test_million_values_exact_2pc(pool2):
    r = pool2.run(million_exact)[0]
    assert r["lt_mismatch"] == 0 and r["ltz_mismatch"] == 0 and r["relu_mismatch"] == 0
    n = 1_000_000
    # Targets: lt <= 7 rounds and <= 48 bytes per element, relu <= 8 rounds and <= 64 bytes.
    assert r["lt_stats"] == (5, 8 * (msb_words_sent(n, 2) + _ceil(n, 64))) == (5, 17_125_000)
    assert r["relu_stats"] == (5, 25_125_000)
    assert r["lt_stats"][1] / n <= 48 and r["relu_stats"][1] / n <= 64
