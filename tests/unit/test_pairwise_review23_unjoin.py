"""Review of session 23's _unjoin views (pairwise.py, issue 29): a prefetched group of small
OT requests of one kind hands each request views of the joined components instead of
clones. For every batched kind: no two components of the prefetched correlations share a
byte of memory (within a request or across requests), an in-place change of one request's
components (as an online op may make) leaves every other request's untouched, and each
request still combines to its relation."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("tenseal")
pytest.importorskip("nacl")

from crypten_lite.provider import correlations as C  # noqa: E402
from crypten_lite.provider import ot  # noqa: E402
from tests.protocol.test_pairwise_provider import _check  # noqa: E402
from tests.unit.test_pairwise_security import _both, _pair, _providers  # noqa: E402

MONO = C.monomial_params([-1, 0, 1], [0b011, 0b111, 0b110, 0b001])
KINDS = [("binary_triple", "", (), 1), ("trunc", "", (16,), 1), ("trunc_exact", "", (12,), 1),
         ("bit", "", (), 1), ("bit_mul", "", (), 2), ("binary_monomials", "", MONO, 1)]


def _plan():
    plan = []
    for kind, op, params, ncomp in KINDS:
        for n in (5, 3, 7):
            shapes = [(n, 1)] * ncomp if kind == "bit_mul" else [(n,)]
            plan.append((kind, op, shapes, params))
    return plan


def _spans(parts):
    return [(t.untyped_storage().data_ptr() + t.storage_offset() * t.element_size(),
             t.numel() * t.element_size()) for t in parts if t.numel()]


def test_prefetched_groups_hand_out_disjoint_memory(monkeypatch):
    monkeypatch.setattr(ot, "SILENT_MIN", 8)
    plan = _plan()
    ps = _providers(_pair())

    def run(p):
        p.get("bit_mul", [(2, 1), (2, 1)]).corrected()            # both pools start here
        p.by_kind.clear()
        p.prefetch(plan)
        batched = sum(row[0] for name, row in p.by_kind.items() if "batch" in name or "bins" in name)
        got = [list(p.get(k, s, op, par).corrected()) for k, op, s, par in plan]
        spans = sorted(s for parts in got for s in _spans(parts))
        overlaps = [(a, b) for a, b in zip(spans, spans[1:]) if a[0] + a[1] > b[0]]
        before = [[t.clone() for t in parts] for parts in got]
        for t in got[0]:                                          # an online op's in-place change
            t.add_(1)
        untouched = all(torch.equal(t, u) for parts, was in zip(got[1:], before[1:])
                        for t, u in zip(parts, was))
        return before, batched, overlaps, untouched

    out = _both([lambda p=p: run(p) for p in ps])
    assert out[0][1] is None and out[1][1] is None, out
    (g0, batched, overlaps0, ok0), (g1, _, overlaps1, ok1) = out[0][0], out[1][0]
    assert batched == len(plan), batched          # every request made in a joined group
    assert not overlaps0 and not overlaps1, (overlaps0, overlaps1)
    assert ok0 and ok1
    for (kind, op, _, params), a, b in zip(plan, g0, g1):
        _check(kind, op, params, a, b)
