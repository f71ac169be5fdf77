"""Provider 'pairwise' with a small working-set budget (PairwiseProvider.set_chunk_bytes, the
CRYPTEN_LITE_PAIRWISE_CHUNK_MB knob): large correlations are made in slices streamed over the
request's framed offline messages. Sliced, every kind still combines to its relation; the
slices really happen (more offline messages); the online phase keeps its rounds and bytes.

Small sizes only (the shared 2-party pairwise pool of tests/conftest.py)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("tenseal")
pytest.importorskip("nacl")

import crypten_lite  # noqa: E402
from crypten_lite import comm  # noqa: E402
from crypten_lite.mpc import offline  # noqa: E402
from crypten_lite.provider import correlations as C  # noqa: E402

from tests.conftest import get_pool  # noqa: E402
from tests.protocol.test_pairwise_provider import _check  # noqa: E402


@pytest.fixture(scope="module")
def pw():
    return get_pool(2, provider="pairwise")


OT_BUDGET = 20_000          # bytes: one to a few elements per slice, 72 OTs per IKNP extension
HE_BUDGET = 1               # bytes: the least HE slices (one ciphertext per prime, one output)
OT_REQUESTS = [
    ("bit", "", [(300,)], ()),
    ("binary_triple", "", [(40,)], ()),
    ("trunc", "", [(21,)], (16,)),
    ("trunc_exact", "", [(2, 9)], (12,)),
    ("bit_mul", "", [(5, 1), (5, 3)], ()),
    ("binary_monomials", "", [(7,)], C.monomial_params([-1, 0, 1], [0b011, 0b111, 0b110, 0b001])),
]
HE_REQUESTS = [
    ("triple", "mul", [(9000,), (9000,)], ()),
    ("triple", "matmul", [(2, 2, 3), (3, 2)], ()),
]


def _made(requests: list, budget: int):
    """Every request's components under `budget`, and the offline messages it took."""
    from crypten_lite.session import current
    p = current().provider
    old = p._chunk
    p.set_chunk_bytes(budget)
    try:
        before = p._seq_out
        out = [[t.clone() for t in p.get(k, s, op, par).corrected()] for k, op, s, par in requests]
        return out, p._seq_out - before
    finally:
        p.set_chunk_bytes(old)


def test_sliced_ot_correlations_hold(pw):
    (r0, sliced), (r1, _) = pw.run(_made, OT_REQUESTS, OT_BUDGET)
    for (kind, op, shapes, params), a, b in zip(OT_REQUESTS, r0, r1):
        _check(kind, op, params, a, b)
        assert a[0].shape == b[0].shape == shapes[0]
    (_, whole), _ = pw.run(_made, OT_REQUESTS, 128 << 20)
    assert sliced > whole, (sliced, whole)   # the slices were made as separate exchanges


def test_sliced_he_correlations_hold(pw):
    (r0, sliced), (r1, _) = pw.run(_made, HE_REQUESTS, HE_BUDGET)
    for (kind, op, shapes, params), a, b in zip(HE_REQUESTS, r0, r1):
        _check(kind, op, params, a, b)
    (_, whole), _ = pw.run(_made, HE_REQUESTS, 128 << 20)
    assert sliced > whole, (sliced, whole)


def _relu_online(budget: int):
    from crypten_lite.session import current
    p = current().provider
    old = p._chunk
    p.set_chunk_bytes(budget)
    try:
        a = torch.linspace(-4, 4, 96).reshape(8, 12)
        x = crypten_lite.cryptensor(a, src=0)
        with offline.record() as plan:
            x.relu()
        before = p._seq_out
        offline.prefetch(plan)
        messages = p._seq_out - before
        c = comm.get()
        c.reset_communication_stats()
        y = x.relu()
        stats = c.get_communication_stats()
        err = float((y.get_plain_text() - a.relu()).abs().max())
        return stats["rounds"], stats["bytes_sent"], err, messages
    finally:
        p.set_chunk_bytes(old)


def test_sliced_offline_phase_keeps_online_rounds_and_bytes(pw):
    small = pw.run(_relu_online, OT_BUDGET)
    default = pw.run(_relu_online, 128 << 20)
    for (rounds, sent, err, messages), (rounds_d, sent_d, err_d, messages_d) in zip(small, default):
        assert (rounds, sent) == (rounds_d, sent_d)
        assert err <= 1e-2 and err_d <= 1e-2
        assert messages > messages_d


MONOMIALS = C.monomial_params([-1, -1, 0], [0b011, 0b111, 0b101])
SMALL_PLAN = [
    ("trunc", "", [(5,)], (16,)),
    ("binary_monomials", "", [(3,)], MONOMIALS),
    ("trunc", "", [(2, 4)], (16,)),
    ("binary_monomials", "", [(4,)], MONOMIALS),
    ("trunc", "", [(3,)], (12,)),
]


def _small_plan(prefetch: bool):
    """SMALL_PLAN's correlations, prefetched (small ones of one kind and parameters batched
    into one exchange) or made on demand; and the offline messages they took."""
    from crypten_lite.session import current
    p = current().provider
    before, used = p._seq_out, p.stats["prefetched"]
    if prefetch:
        p.prefetch(SMALL_PLAN)
    out = [[t.clone() for t in p.get(k, s, op, par).corrected()] for k, op, s, par in SMALL_PLAN]
    return out, p._seq_out - before, p.stats["prefetched"] - used


def test_small_ot_correlations_are_batched_in_prefetch(pw):
    (r0, batched, used), (r1, _, _) = pw.run(_small_plan, True)
    assert used == len(SMALL_PLAN)
    for (kind, op, shapes, params), a, b in zip(SMALL_PLAN, r0, r1):
        _check(kind, op, params, a, b)
        assert a[0].shape == b[0].shape == shapes[0]
    (_, alone, used), _ = pw.run(_small_plan, False)
    assert used == 0 and batched < alone, (batched, alone)
