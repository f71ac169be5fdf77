"""Key separation and request-bound correlated randomness (issue 11, findings 1, 2 and 6).

Pure functions, no network: per-purpose subkeys, the canonical encoding of requests, the
derivation of correlated values (two different requests never share a stream, a smaller draw
is not a prefix of a larger one), what the dealer accepts, its counter ledger and the MAC of
rank 0's batches.
"""

from __future__ import annotations

import pytest
import torch

from crypten_lite.comm.dealer_rpc import CounterLedger, Request, batch_mac
from crypten_lite.errors import ProtocolError
from crypten_lite.provider import correlations, dealer_handler
from crypten_lite.random import PURPOSES, canonical, correlation_key, fresh_seed, subkey

SEED = bytes(range(32))


def independent(a: torch.Tensor, b: torch.Tensor) -> bool:
    """No position in common (each is 2^-64 likely for independent uniform words)."""
    n = min(a.numel(), b.numel())
    return bool((a.reshape(-1)[:n] != b.reshape(-1)[:n]).all())


def test_subkeys_are_distinct_per_purpose_and_deterministic():
    keys = {p: subkey(SEED, p) for p in PURPOSES}
    assert len(set(keys.values())) == len(PURPOSES)
    assert SEED not in keys.values()
    assert all(len(k) == 32 and subkey(SEED, p) == k for p, k in keys.items())
    assert subkey(fresh_seed(), "przs") != keys["przs"]
    with pytest.raises(ValueError, match="unknown key purpose"):
        subkey(SEED, "prz")
    with pytest.raises(ValueError, match="32 bytes"):
        subkey(b"short", "przs")


def test_canonical_encoding_is_unambiguous():
    pairs = [
        (("ab", "c"), ("a", "bc")),
        (((1, 2),), ((1,), (2,))),                # one shape of 2 dims vs two 1-dim shapes
        (((), (3,)), ((3,), ())),
        (("1",), (1,)),
        ((2 ** 64 - 1,), (-1,)),                  # a uint64 counter vs an int64 parameter
        (("",), ()),
    ]
    for a, b in pairs:
        assert canonical(*a) != canonical(*b), (a, b)
    assert canonical("x", 3, [4, 5]) == canonical("x", 3, (4, 5))


KEY = subkey(SEED, "correlations")
BASE = dict(counter=5, kind="triple", op="mul", shapes=((4, 8), (4, 8)), params=())
VARIANTS = {
    "counter": dict(BASE, counter=6),
    "kind": dict(BASE, kind="square", op="", shapes=((4, 8),)),
    "op": dict(BASE, op="matmul", shapes=((4, 8), (8, 4))),
    "shape": dict(BASE, shapes=((4, 8), (1, 8))),
    "params": dict(counter=5, kind="trunc", op="", shapes=((4, 8),), params=(17,)),
}


def draw(req: dict) -> list[torch.Tensor]:
    return correlations.derive(KEY, req["counter"], req["kind"], req["op"], req["shapes"], req["params"])


@pytest.mark.parametrize("field", sorted(VARIANTS))
def test_requests_differing_in_one_field_have_independent_streams(field):
    base, other = draw(BASE), draw(VARIANTS[field])
    assert torch.equal(base[0], draw(BASE)[0])  # deterministic
    for a in base:
        for b in other:
            assert independent(a, b), field


def test_trunc_params_and_kinds_at_one_counter_are_independent():
    # The attack of finding 2 needed trunc's r at a triple's counter to equal the triple's a.
    t16 = correlations.derive(KEY, 9, "trunc", "", ((64,),), (16,))
    t17 = correlations.derive(KEY, 9, "trunc", "", ((64,),), (17,))
    triple = correlations.derive(KEY, 9, "triple", "mul", ((64,), (64,)), ())
    square = correlations.derive(KEY, 9, "square", "", ((64,),), ())
    # The attack of finding 1 needed square's c (component 1) to equal the triple's b.
    assert independent(square[1], triple[1]) and independent(square[0], triple[0])
    assert independent(t16[0], triple[0]) and independent(t16[0], t17[0])


def test_a_smaller_draw_is_not_a_prefix_of_a_larger_one():
    small = correlations.derive(KEY, 3, "square", "", ((8,),), ())
    large = correlations.derive(KEY, 3, "square", "", ((16,),), ())
    flat = correlations.derive(KEY, 3, "square", "", ((2, 4),), ())  # same numel, other shape
    for j in range(2):
        assert independent(small[j], large[j][:8])
        assert independent(small[j], flat[j].reshape(-1))


def test_correlation_key_binds_every_field():
    args = (5, "triple", "mul", ((4, 8), (4, 8)), ())
    k = correlation_key(KEY, *args)
    assert k != correlation_key(subkey(fresh_seed(), "correlations"), *args)
    assert k != correlation_key(KEY, 5, "triple", "mul", ((4, 8), (4, 8), ()), ())
    assert k == correlation_key(KEY, 5, "triple", "mul", [[4, 8], [4, 8]], [])


def test_shares_still_reconstruct_the_correlation():
    keys = {r: subkey(fresh_seed(), "correlations") for r in range(3)}
    shapes = ((3, 5), (5, 2))
    parts = {r: correlations.derive(keys[r], 1, "triple", "matmul", shapes, ()) for r in keys}
    parts[0][2] = correlations.corrections(keys, 1, "triple", "matmul", shapes, ())[0]
    a, b, c = (sum(parts[r][j] for r in keys) for j in range(3))
    assert torch.equal(c, a @ b)


# --- what the dealer accepts -------------------------------------------------------------

MAX = 1 << 26  # max_message_bytes of these checks: 8 Mi elements per component


def check(kind, op, shapes, params=(), world=2):
    return correlations.check_request(kind, op, shapes, params, world, MAX)


def test_every_kind_the_protocols_use_is_accepted_with_its_answer_size():
    cases = [
        ("triple", "mul", [(4, 1), (1, 5)], (), 4 * 5),
        ("triple", "matmul", [(2, 3, 4), (4, 6)], (), 2 * 3 * 6),
        ("triple", "conv2d", [(1, 2, 8, 8), (3, 2, 3, 3)], (1, 1, 0, 0, 1, 1, 1), 3 * 36),
        ("triple", "conv1d", [(1, 2, 8), (4, 1, 3)], (1, 1, 1, 2), 4 * 8),
        ("square", "", [(7,)], (), 7),
        ("bit", "", [(7,)], (), 7),
        ("binary_triple", "", [(7,)], (), 7),
        ("trunc", "", [(7,)], (16,), 14),
        ("trunc_exact", "", [(7,)], (20,), 21),
        ("bit_mul", "", [(7, 1), (7, 3)], (), 7 + 21),
        ("binary_monomials", "", [(7,)], correlations.monomial_params([-1, 0, 1], [3, 5, 7]), 21),
    ]
    keys = {r: subkey(fresh_seed(), "correlations") for r in range(2)}
    for kind, op, shapes, params, elements in cases:
        nbytes = check(kind, op, shapes, params)
        assert nbytes == 8 * elements, kind
        answer = dealer_handler(keys, Request(kind, 0, op, tuple(map(tuple, shapes)), params))
        assert sum(8 * t.numel() for t in answer) == nbytes, kind


@pytest.mark.parametrize("kind,op,shapes,params,why", [
    ("nope", "", [(4,)], (), "unknown kind"),
    ("triple", "add", [(4,), (4,)], (), "no Beaver triple"),
    ("triple", "mul", [(4,)], (), "operand shapes"),
    ("triple", "mul", [(4,), (5,)], (), "operand shapes"),          # do not broadcast
    ("triple", "mul", [(4,), (4,)], (1,), "parameters"),
    ("triple", "conv2d", [(1, 2, 8, 8), (3, 2, 3, 3)], (0, 1, 0, 0, 1, 1, 1), "parameter 0"),
    ("triple", "conv1d", [(1, 2, 8), (3, 1, 3)], (1, 1, 1, 2), "operand shapes"),  # groups
    ("triple", "conv2d", [(1, 2, 8, 8), (3, 2, 3, 3)], (1, 1, -1, 0, 1, 1, 1), "parameter -1"),
    ("square", "mul", [(4,)], (), "only triples"),
    ("square", "", [(4,)], (3,), "no parameters"),
    ("trunc", "", [(4,)], (64,), "one shift"),
    ("trunc", "", [(4,)], (), "one shift"),
    ("trunc_exact", "", [(4,)], (-1,), "one shift"),
    ("bit_mul", "", [(4, 2), (4, 3)], (), "expected shapes"),
    ("bit_mul", "", [(4, 1), (5, 3)], (), "expected shapes"),
    ("binary_monomials", "", [(4,)], (2, 0, 7, 3), "mask owner"),
    ("binary_monomials", "", [(4,)], (2, 0, 1, 4), "monomial outside"),
    ("binary_monomials", "", [(4,)], (65,), "masks"),
    ("square", "", [(-1,)], (), "negative dimension"),
    ("square", "", [(1 << 40, 0)], (), "exceeds"),
    # broadcast and matmul results too large, from tiny operands: refused before allocating
    ("triple", "mul", [(1 << 16, 1), (1, 1 << 16)], (), "component of shape"),
    ("triple", "matmul", [(1 << 14, 1), (1, 1 << 14)], (), "component of shape"),
    ("triple", "matmul", [(1 << 40, 0), (0, 1 << 40)], (), "exceeds"),
])
def test_requests_no_protocol_makes_are_refused(kind, op, shapes, params, why):
    with pytest.raises(ProtocolError, match=why):
        check(kind, op, shapes, params)


# --- the dealer's ledger and request MAC --------------------------------------------------


def test_ledger_answers_each_counter_once():
    ledger = CounterLedger()
    ledger.claim([0, 1, 2, 5])
    ledger.claim([3, 4])
    assert ledger.intervals == 1 and ledger.answered == 6
    with pytest.raises(ProtocolError, match="counter 4 was already answered"):
        ledger.claim([9, 4])
    assert 9 not in ledger  # a refused batch marks nothing
    with pytest.raises(ProtocolError, match="twice in one batch"):
        ledger.claim([10, 10])
    assert 10 not in ledger
    ledger.claim([2 ** 64 - 1, 8, 10])
    assert ledger.intervals == 4 and all(c in ledger for c in (8, 10, 2 ** 64 - 1))
    assert 7 not in ledger and 9 not in ledger and 11 not in ledger
    ledger.claim([9, 7, 6])
    assert ledger.intervals == 2  # [0, 11) and the last counter


def test_batch_mac_binds_session_and_every_request():
    key = subkey(SEED, "dealer-request-mac")
    batch = [Request("triple", 3, "mul", ((4,), (4,))), Request("trunc", 4, "", ((4,),), (16,))]
    mac = batch_mac(key, "s", batch)
    assert mac == batch_mac(key, "s", list(batch)) and len(mac) == 32
    changed = [
        batch_mac(key, "t", batch),
        batch_mac(subkey(SEED, "correlations"), "s", batch),
        batch_mac(key, "s", batch[:1]),
        batch_mac(key, "s", batch[::-1]),
        batch_mac(key, "s", [batch[0], Request("trunc", 4, "", ((4,),), (17,))]),
        batch_mac(key, "s", [batch[0], Request("trunc", 5, "", ((4,),), (16,))]),
        batch_mac(key, "s", [Request("triple", 3, "mul", ((4,), (1,))), batch[1]]),
    ]
    assert mac not in changed and len(set(changed)) == len(changed)


def test_buffered_prg_pairs_agree_and_never_repeat():
    """Two endpoints of a pair (same seed, same draws in the same order) get identical tensors
    from BufferedPRG; no keystream element is handed out twice; large draws and draws at an
    explicit counter are PRG's own."""
    from crypten_lite.random import PRG, BufferedPRG
    seed = bytes(range(32))
    a, b = BufferedPRG(seed), BufferedPRG(seed)
    shapes = [(3,), (2, 5), (4096,), (1,), (5000,), (7, 7), (BufferedPRG.BLOCK // 2,)] + [(999,)] * 40
    seen = []
    for shape in shapes:
        x, y = a.draw(shape), b.draw(shape)
        assert x.shape == torch.Size(shape) and torch.equal(x, y)
        seen.append(x.reshape(-1))
    flat = torch.cat(seen)
    assert torch.unique(flat).numel() == flat.numel()     # 2^-64-ish collisions aside: none reused
    plain = PRG(seed)
    assert torch.equal(a.draw((1,), counter=123), plain.draw((1,), counter=123))
    # a large draw is an ordinary draw at the next counter
    c, d = BufferedPRG(seed), PRG(seed)
    assert torch.equal(c.draw((5000,)), d.draw((5000,)))
    # small draws come from a block that is itself an ordinary draw (a fresh counter)
    block = d.draw((BufferedPRG.BLOCK,))
    assert torch.equal(c.draw((10,)), block[:10]) and torch.equal(c.draw((3,)), block[10:13])
    # the caller may change a draw in place without touching the next one
    e, f = BufferedPRG(seed), BufferedPRG(seed)
    first = e.draw((4,))
    first += 1
    f.draw((4,))
    assert torch.equal(e.draw((4,)), f.draw((4,)))
