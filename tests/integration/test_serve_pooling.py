"""The serving path's pooling (functions.pooling.fewer_comparisons): values-only trees, on 64
bits or on the low 32 bits, give torch's max pool (with and without the fused ReLU, odd and
padded windows, ties and negatives) at 2 and 3 additive parties and under rss; its exact
rounds and bytes beside the default all-pairs form (2 parties); and the serving batch sizes."""

from __future__ import annotations

import torch
import torch.nn.functional as F

import crypten_lite
from crypten_lite import comm
from crypten_lite.cryptensor import no_grad
from crypten_lite.functions.pooling import fewer_comparisons
from crypten_lite.serve.batching import bucket

# (kernel, stride, padding): the 2x2 of LeNet, an odd window (3 candidates a row), padding.
CASES = ((2, 2, 0), (3, 2, 0), (3, 2, 1))


def _input() -> torch.Tensor:
    g = torch.Generator().manual_seed(3)  # test data only
    a = torch.randint(-8, 8, (2, 2, 6, 6), generator=g).double() / 4   # many ties, negatives
    a[0, 0, :2, :2] = -1.25                                             # a window of ties < 0
    a[1, 1] = -3.0                                                      # a plane < 0 (ReLU: 0)
    return a


def pooled():
    a = _input()
    x = crypten_lite.cryptensor(a, src=0)
    out = {}
    for bits in (None, 64, 32):
        for k, s, p in CASES:
            with no_grad(), fewer_comparisons(bits is not None, bits or 64):
                got = x.max_pool2d(k, s, p).get_plain_text().double()
                got_relu = x.relu_max_pool2d(k, s, p).get_plain_text().double()
            want = F.max_pool2d(a, k, s, p)
            out[f"{bits}/{k}{s}{p}"] = bool(torch.equal(got, want))
            out[f"{bits}/{k}{s}{p}/relu"] = bool(torch.equal(got_relu, want.clamp(min=0)))
    return out


def pool_costs():
    c = comm.get()
    x = crypten_lite.cryptensor(torch.zeros(2, 6, 24, 24), src=0)   # LeNet's first pool, batch 2
    out = {}
    for name, ctx in (("pairwise", fewer_comparisons(False)), ("tree64", fewer_comparisons()),
                      ("tree32", fewer_comparisons(bits=32))):
        c.reset_communication_stats()
        with no_grad(), ctx:
            x.relu_max_pool2d(2)
        st = c.get_communication_stats()
        out[name] = (int(st["rounds"]), int(st["bytes_sent"]))
    return out


def lenet_costs():
    """LeNet (the service's demo weights) on 2 samples: rounds and bytes of one private forward
    in each pooling setting, and whether it matches torch's forward."""
    from crypten_lite import nn
    from crypten_lite.serve.server import build_model
    c = comm.get()
    model, shape = build_model("lenet")
    private = nn.from_pytorch(model if c.rank == 0 else None, (1, *shape), src=0).encrypt(src=0).eval()
    a = torch.randn(2, *shape, generator=torch.Generator().manual_seed(1))  # test data only
    x = crypten_lite.cryptensor(a, src=0)
    with torch.no_grad():
        want = model(a)
    out = {}
    for name, ctx in (("pairwise", fewer_comparisons(False)), ("tree64", fewer_comparisons()),
                      ("tree32", fewer_comparisons(bits=32))):
        with no_grad(), ctx:
            private(x)  # the first run makes the fixed-weight masks
            c.reset_communication_stats()
            y = private(x)
            st = c.get_communication_stats()
            ok = bool((y.get_plain_text() - want).abs().max() < 1e-2)
        out[name] = (int(st["rounds"]), int(st["bytes_sent"]), ok)
    return out


def test_lenet_forward_costs(pool2):
    """The serving forward of LeNet, 2 samples (2 parties): docs/serving.md quotes these."""
    r = pool2.run(lenet_costs)
    assert r[0] == r[1]
    assert r[0] == {"pairwise": (27, 522864, True), "tree64": (45, 269184, True),
                    "tree32": (39, 190784, True)}


def test_fewer_comparisons_match_torch(pool_all):
    for party in pool_all.run(pooled):
        assert all(party.values()), [k for k, ok in party.items() if not ok]


def test_fewer_comparisons_costs(pool2):
    """A 2x2 pool with its ReLU over 2 x 6 x 24 x 24 values: the all-pairs form (10 MSBs a
    window, 6 rounds), the tree on 64 bits (4 MSBs, 3 x 5 rounds), the tree on 32 bits (4
    short MSBs of 3 rounds each and their product round: 3 x 4 rounds)."""
    r = pool2.run(pool_costs)
    assert r[0] == r[1]
    assert r[0] == {"pairwise": (6, 369360), "tree64": (15, 173664), "tree32": (12, 113184)}


def test_serving_batch_sizes():
    assert [bucket(n, 64) for n in (1, 2, 3, 5, 8, 9, 17, 33, 63, 64)] == \
        [1, 2, 4, 8, 8, 16, 24, 40, 64, 64]
    assert bucket(5, 5) == 5 and bucket(7, 6) == 7   # never above max_batch, never below n
