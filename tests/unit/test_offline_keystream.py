"""Issue 32, LeNet b1's offline phase: one keystream per request, the dealer's vectorised
monomials, the plan check's split all-gather (tests/protocol/test_offline.py keeps the
multi-party checks: diverging plans are an error on every party)."""

from __future__ import annotations

import random

import pytest
import torch

from crypten_lite import random as prg
from crypten_lite.provider import correlations
from crypten_lite.random import PRG, canonical, fresh_seed, keystream_parts, request_encoding, subkey


@pytest.mark.parametrize("shapes", [
    [(3,), (5, 2), (7,)],                       # odd byte counts: parts cross AES blocks
    [(1,), (0,), (9, 3)],                       # an empty part
    [(70_000,), (3,), (70_001,)],               # over JOINT_PARTS_BYTES: a tensor each
])
def test_keystream_parts_are_consecutive_parts_of_one_draw(shapes):
    key = fresh_seed()
    parts = keystream_parts(key, shapes)
    assert [tuple(p.shape) for p in parts] == [tuple(s) for s in shapes]
    total = sum(p.numel() for p in parts)
    # one stream, from the counter block where PRG's domain-0, counter-0 draw starts
    assert torch.equal(torch.cat([p.reshape(-1) for p in parts]), PRG(key).draw((total,), counter=0, domain=0))
    assert all(p.dtype == torch.int64 for p in parts)


def test_small_parts_share_one_buffer_large_ones_do_not():
    key = fresh_seed()
    small = keystream_parts(key, [(4,), (4,)])
    assert small[0].untyped_storage().data_ptr() == small[1].untyped_storage().data_ptr()
    n = prg.JOINT_PARTS_BYTES // 8
    large = keystream_parts(key, [(n,), (4,)])
    assert large[0].untyped_storage().data_ptr() != large[1].untyped_storage().data_ptr()
    assert large[0].untyped_storage().nbytes() < 8 * (n + 16)  # its own memory, not the request's


def test_derive_prefix_is_what_the_dealer_draws_for_rank0():
    key = subkey(fresh_seed(), "correlations")
    whole = correlations.derive(key, 4, "trunc", "", ((33,),), (12,))
    prefix = correlations.derive(key, 4, "trunc", "", ((33,),), (12,), upto=1)
    assert len(prefix) == 1 and torch.equal(prefix[0], whole[0])
    assert not torch.equal(whole[0], whole[1]) and not torch.equal(whole[1], whole[2])


def test_request_encoding_is_canonical_bytes():
    rng = random.Random(5)
    for _ in range(500):
        counter = rng.randrange(0, 1 << 62)
        kind = rng.choice(["triple", "bit", "binary_monomials"])
        shapes = [[rng.randrange(0, 999) for _ in range(rng.randrange(0, 4))] for _ in range(rng.randrange(0, 3))]
        params = [rng.randrange(-2, 300) for _ in range(rng.randrange(0, 30))]
        assert request_encoding(counter, kind, "mul", shapes, params) == canonical(
            "correlation/v1", counter, kind, "mul", shapes, params)


def _reference_monomials(keys, counter, shapes, params):
    """The dealer's monomials as defined: each monomial the AND of its masks (XOR-shared masks
    summed over every party, an owned one its owner's component), minus others' shares."""
    world = sorted(keys)
    k, owners, subsets = correlations._split_monomial_params(params)
    parts = {r: correlations.derive(keys[r], counter, "binary_monomials", "", shapes, params) for r in world}
    masks = []
    for j, o in enumerate(owners):
        if o >= 0:
            masks.append(parts[o][j])
        else:
            m = torch.zeros_like(parts[world[0]][j])
            for r in world:
                m ^= parts[r][j]
            masks.append(m)
    out = []
    for i, subset in enumerate(subsets):
        mono = torch.full_like(masks[0], -1)
        for j in range(k):
            if subset >> j & 1:
                mono &= masks[j]
        for r in world[1:]:
            mono ^= parts[r][k + i]
        out.append(mono)
    return out


@pytest.mark.parametrize("world", [1, 2, 3])
def test_vectorised_monomial_corrections_match_their_definition(world):
    rng = random.Random(world)
    keys = {r: subkey(fresh_seed(), "correlations") for r in range(world)}
    for trial in range(40):
        k = rng.randrange(1, 9)
        owners = [rng.choice([-1] + list(range(world))) for _ in range(k)]
        subsets = [rng.randrange(1, 1 << k) for _ in range(rng.randrange(1, 25))]
        shape = rng.choice([(rng.randrange(0, 70),), (3, 5)])
        params = correlations.monomial_params(owners, subsets)
        got = correlations.corrections(keys, trial, "binary_monomials", "", [shape], params)
        want = _reference_monomials(keys, trial, [shape], params)
        assert len(got) == len(subsets)
        for g, w in zip(got, want):
            assert g.shape == w.shape and torch.equal(g, w)


def test_rank0_cuts_a_joint_answer_and_refuses_a_wrong_one():
    from crypten_lite.comm.dealer_rpc import Request
    from crypten_lite.errors import CommunicationError
    from crypten_lite.provider import _unjoin
    params = correlations.monomial_params([-1, -1, -1], [3, 5, 6, 7])
    req = Request("binary_monomials", 9, "", ((2, 3),), params)
    keys = {r: subkey(fresh_seed(), "correlations") for r in range(2)}
    fixes = correlations.corrections(keys, 9, req.kind, req.op, req.shapes, req.params)
    joint = torch.cat([f.reshape(-1) for f in fixes])  # as DealerServer.answer sends them
    for got in (_unjoin(req, [joint]), _unjoin(req, fixes)):
        assert len(got) == 4 and all(torch.equal(g, f) for g, f in zip(got, fixes))
    for wrong in ([joint[:-1]], [joint.view(4, 6)], fixes[:3], [joint.to(torch.int32)]):
        with pytest.raises(CommunicationError, match="dealer's answer to request 9"):
            _unjoin(req, wrong)
    single = Request("triple", 3, "mul", ((4,), (4,)), ())
    with pytest.raises(CommunicationError, match="expected 1 corrections of shapes"):
        _unjoin(single, [torch.zeros(5, dtype=torch.int64)])
    assert _unjoin(single, [torch.zeros(4, dtype=torch.int64)])[0].shape == (4,)
