"""Binary circuits (crypten_lite.mpc.circuits) on simulated XOR shares, no transport.

Every party's share is one row of a tensor with a leading party axis; AND is simulated by
reconstructing and resharing (the protocol's binary-triple AND is tested over gRPC in
tests/protocol/test_comparisons.py). Test randomness only: never used by the library.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from crypten_lite.mpc import circuits

INT64 = st.integers(min_value=-(2 ** 63), max_value=2 ** 63 - 1)
EDGES = [0, -1, 1, -(2 ** 63), 2 ** 63 - 1, 2 ** 62, -(2 ** 62), 2 ** 16, -(2 ** 16)]


def _rand(gen: torch.Generator, *shape) -> torch.Tensor:
    return torch.randint(-(2 ** 63), 2 ** 63 - 1, shape, dtype=torch.int64, generator=gen)


def _xor_all(shares: torch.Tensor) -> torch.Tensor:
    out = shares[0].clone()
    for s in shares[1:]:
        out ^= s
    return out


def _share_xor(value: torch.Tensor, parties: int, gen: torch.Generator) -> torch.Tensor:
    rest = [_rand(gen, *value.shape) for _ in range(parties - 1)]
    first = value.clone()
    for r in rest:
        first ^= r
    return torch.stack([first] + rest)


class Sim:
    """Simulated parties: shares are (parties, ...) tensors."""

    def __init__(self, parties: int, seed: int = 0):
        self.parties = parties
        self.gen = torch.Generator().manual_seed(seed)
        self.rounds = 0
        self.sizes: list[int] = []
        self.poly_sizes: list[list] = []

    def lead(self, like: torch.Tensor) -> torch.Tensor:
        out = torch.zeros_like(like)
        out[0] = -1
        return out

    def and_fn(self, pairs):
        self.rounds += 1
        self.sizes.append(sum(torch.broadcast_shapes(x.shape, y.shape)[-1] for x, y in pairs))
        return [_share_xor(_xor_all(x) & _xor_all(y), self.parties, self.gen) for x, y in pairs]

    def poly_fn(self, jobs):
        """circuits.PolyFn: every job's inputs XOR-shared; all jobs in one round."""
        self.rounds += 1
        self.poly_sizes.append([(inputs[0].shape[-1], len(inputs), [list(o) for o in outputs])
                                for inputs, outputs in jobs])
        return [self.eval_terms(outputs, list(inputs), [-1] * len(inputs)) for inputs, outputs in jobs]

    def eval_terms(self, outputs, inputs, owners):
        """Level-1 style evaluation: masked openings + dealt monomials, like binary.eval_polys."""
        masks_plain = [_rand(self.gen, *inputs[0].shape[1:]) for _ in inputs]
        mask_shares = []
        for m, o in zip(masks_plain, owners):
            if o == -1:
                mask_shares.append(_share_xor(m, self.parties, self.gen))
            else:
                sh = torch.zeros(self.parties, *m.shape, dtype=torch.int64)
                sh[o] = m
                mask_shares.append(sh)
        opened = [_xor_all(x) ^ m for x, m in zip(inputs, masks_plain)]
        monos = circuits.monomials([t for out in outputs for t in out])
        mono_shares = {}
        for mono in monos:
            v = masks_plain[mono[0]].clone()
            for k in mono[1:]:
                v &= masks_plain[k]
            mono_shares[mono] = _share_xor(v, self.parties, self.gen)
        lead = self.lead(inputs[0])
        results = []
        for out in outputs:
            per_party = [circuits.expand_terms(out, opened, [m[p] for m in mask_shares],
                                               {k: v[p] for k, v in mono_shares.items()}, lead[p])
                         for p in range(self.parties)]
            results.append(torch.stack(per_party))
        return results


def _plain_terms(terms, xs):
    out = torch.zeros_like(xs[0])
    for t in terms:
        v = torch.full_like(xs[0], -1)
        for k in t:
            v &= xs[k]
        out ^= v
    return out


def _owned(values: list[torch.Tensor], parties: int) -> list[torch.Tensor]:
    """Operand r held entirely by party r (the others hold 0), as share tensors."""
    out = []
    for r, v in enumerate(values):
        sh = torch.zeros(parties, *v.shape, dtype=torch.int64)
        sh[r] = v
        out.append(sh)
    return out


def sim_msb(x: torch.Tensor, parties: int, seed: int = 0) -> tuple[torch.Tensor, int]:
    """The msb_words pipeline of convert.py, simulated: returns (msb bits, AND rounds)."""
    sim = Sim(parties, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    arith = [_rand(gen, *x.shape) for _ in range(parties - 1)]
    arith = [x - sum(arith, torch.zeros_like(x))] + arith          # additive shares of x
    ops = list(zip(_owned(arith, parties), range(parties)))
    while len(ops) > 2:
        (a, oa), (b, ob), (c, oc) = ops[:3]
        (maj,) = sim.eval_terms([circuits.MAJ3], [a, b, c], [oa, ob, oc])
        total, carry = circuits.csa(a, b, c, maj)
        ops = ops[3:] + [(total, -1), (carry, -1)]
    (s, so), (c, co) = ops
    top = circuits.pack_bits(((s ^ c) >> 63) & 1)
    s = s & circuits.LOW63
    c = c & circuits.LOW63
    if co == -1:
        c = c ^ (sim.lead(c) & circuits.TOP)
    else:
        c[co] |= circuits.TOP
    planes = circuits.group2_planes(s, c)
    g, p = sim.eval_terms([circuits.GROUP2_G, circuits.GROUP2_P], planes, [so, so, co, co])
    words = circuits.msb_from_group2(g, p, top, sim.poly_fn)
    assert [c[0] for c in sim.poly_sizes] == circuits.carry_plan(g.shape[-1], 32)
    return circuits.unpack_bits(_xor_all(words), x.numel()), sim.rounds


# ------------------------------------------------------------------------ layout
@settings(deadline=None)
@given(st.lists(INT64, min_size=1, max_size=70), st.sampled_from([1, 2, 4, 8, 16, 32, 64]))
def test_pack_unpack_lanes_roundtrip(values, width):
    x = torch.tensor(values, dtype=torch.int64)
    mask = (1 << width) - 1 if width < 64 else -1
    x = x & mask
    assert torch.equal(circuits.unpack_lanes(circuits.pack_lanes(x, width), width, x.numel()), x)


@settings(deadline=None)
@given(st.lists(INT64, min_size=1, max_size=20))
def test_compress_even_and_halves(values):
    x = torch.tensor(values, dtype=torch.int64)
    c = circuits.compress_even(x)
    bits = ((x.unsqueeze(-1) >> torch.arange(64)) & 1)
    cbits = ((c.unsqueeze(-1) >> torch.arange(64)) & 1)
    assert torch.equal(cbits[:, :32], bits[:, 0::2]) and not cbits[:, 32:].any()
    hi, lo = circuits.halves(x)
    assert torch.equal(circuits.unpack_lanes(lo, 32, x.numel()), circuits.compress_even(x))
    assert torch.equal(circuits.unpack_lanes(hi, 32, x.numel()), circuits.compress_even(x >> 1))


@settings(deadline=None)
@given(st.lists(INT64, min_size=6, max_size=6), st.integers(1, 3))
def test_halves_leading_axes(values, rows):
    """halves (a table lookup) on leading axes, odd and even last axes, a non-contiguous
    input: each row as the shifts and masks of compress_even and pack_lanes give it."""
    x = torch.tensor(values * rows, dtype=torch.int64).view(rows, 6)
    for t in (x, x[:, :5], x[:, :1], x.t()):
        want_hi = circuits.pack_lanes(circuits.compress_even(t >> 1), 32)
        want_lo = circuits.pack_lanes(circuits.compress_even(t), 32)
        hi, lo = circuits.halves(t)
        assert torch.equal(hi, want_hi) and torch.equal(lo, want_lo)


# ------------------------------------------------------------- masked polynomials
@settings(max_examples=30, deadline=None)
@given(st.integers(0, 2 ** 31), st.sampled_from([2, 3]), st.booleans())
def test_expand_terms_matches_plain(seed, parties, owned):
    gen = torch.Generator().manual_seed(seed)
    sim = Sim(parties, seed)
    plain = [_rand(gen, 5) for _ in range(4)]
    if owned and parties == 2:
        owners = [0, 0, 1, 1]
        inputs = []
        for v, o in zip(plain, owners):
            sh = torch.zeros(parties, 5, dtype=torch.int64)
            sh[o] = v
            inputs.append(sh)
    else:
        owners = [-1] * 4
        inputs = [_share_xor(v, parties, gen) for v in plain]
    g, p = sim.eval_terms([circuits.GROUP2_G, circuits.GROUP2_P], inputs, owners)
    assert torch.equal(_xor_all(g), _plain_terms(circuits.GROUP2_G, plain))
    assert torch.equal(_xor_all(p), _plain_terms(circuits.GROUP2_P, plain))
    (m,) = sim.eval_terms([circuits.MAJ3], inputs[:3], owners[:3])
    a, b, c = plain[:3]
    assert torch.equal(_xor_all(m), (a & b) ^ (a & c) ^ (b & c))


def test_group2_terms_are_the_2bit_carry():
    # All 16 assignments of (s0, s1, c0, c1): G = carry out of s + c, P = (s + c == 3).
    for v in range(16):
        s0, s1, c0, c1 = (v >> 0) & 1, (v >> 1) & 1, (v >> 2) & 1, (v >> 3) & 1
        xs = [torch.tensor([-b]) for b in (s0, s1, c0, c1)]   # all-ones words for 1
        total = (s0 + 2 * s1) + (c0 + 2 * c1)
        g = _plain_terms(circuits.GROUP2_G, xs).item() & 1
        p = _plain_terms(circuits.GROUP2_P, xs).item() & 1
        assert g == (total >= 4) and p == ((s0 + 2 * s1) ^ (c0 + 2 * c1) == 3)


# ----------------------------------------------------------------------- carries
@settings(max_examples=40, deadline=None)
@given(st.lists(INT64, min_size=1, max_size=40), st.lists(INT64, min_size=1, max_size=40),
       st.sampled_from([2, 3]))
def test_carry_tree_is_carry_into_bit_63(s_vals, c_vals, parties):
    n = min(len(s_vals), len(c_vals))
    s = torch.tensor(s_vals[:n], dtype=torch.int64)
    c = torch.tensor(c_vals[:n], dtype=torch.int64)
    sim = Sim(parties)
    s_pad, c_pad = s & circuits.LOW63, (c & circuits.LOW63) | circuits.TOP
    planes = [_share_xor(t, parties, sim.gen) for t in circuits.group2_planes(s_pad, c_pad)]
    g, p = sim.eval_terms([circuits.GROUP2_G, circuits.GROUP2_P], planes, [-1] * 4)
    carry = circuits.unpack_bits(_xor_all(circuits.carry_tree(g, p, 32, sim.poly_fn)), n)
    ref = (((s & circuits.LOW63) + (c & circuits.LOW63)) >> 63) & 1
    assert torch.equal(carry, ref)
    assert sim.rounds == 3  # 32 -> 8 -> 2 -> 1 groups (level 1 above is not counted)
    assert [c[0] for c in sim.poly_sizes] == circuits.carry_plan(planes[0].shape[-1], 32)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.one_of(INT64, st.sampled_from(EDGES)), min_size=1, max_size=150),
       st.sampled_from([2, 3, 4]), st.integers(0, 1000))
def test_msb_is_sign(values, parties, seed):
    x = torch.tensor(values, dtype=torch.int64)
    bits, rounds = sim_msb(x, parties, seed)
    assert torch.equal(bits, (x < 0).long())
    assert rounds == 3  # radix 4: 32 -> 8 -> 2 -> 1 groups


def test_msb_edges_exhaustive():
    x = torch.tensor(EDGES + [i for i in range(-300, 300)], dtype=torch.int64)
    for parties in (2, 3):
        bits, _ = sim_msb(x, parties, 7)
        assert torch.equal(bits, (x < 0).long())


def test_carry4_terms_are_the_4group_carry():
    # All 2^8 assignments of 4 groups' (g, p) with g & p = 0 (as the circuit makes them):
    # G = carry out of the 4 groups, P = all four propagate.
    for v in range(1 << 8):
        g = [(v >> i) & 1 for i in range(4)]
        p = [(v >> (4 + i)) & 1 for i in range(4)]
        if any(a and b for a, b in zip(g, p)):
            continue
        carry = 0
        for i in range(4):
            carry = g[i] | (p[i] & carry)
        ones = lambda bits: [torch.tensor([-b]) for b in bits]
        got_g = (_plain_terms(circuits.CARRY4_G, ones(g[:3] + p)).item() ^ -g[3]) & 1
        got_p = _plain_terms(circuits.CARRY4_P, ones(g[:3] + p)).item() & 1
        got_g_only = (_plain_terms(circuits.CARRY4_G_ONLY, ones(g[:3] + p[1:])).item() ^ -g[3]) & 1
        assert got_g == carry == got_g_only and got_p == (p == [1, 1, 1, 1])


@settings(max_examples=40, deadline=None)
@given(st.lists(INT64, min_size=1, max_size=70), st.sampled_from([2, 4, 8, 16, 32, 64]),
       st.booleans(), st.sampled_from([2, 3]))
def test_radix4_carry_trees_match_radix2(values, width, want_p, parties):
    # Random group (g, p) words with g & p = 0: the radix-4 trees (lockstep, two tasks) give
    # the G and P of the radix-2 tree, in ceil(log4 width) rounds, with carry_plan's sizes.
    x = torch.tensor(values, dtype=torch.int64)
    n = x.numel()
    mask = (1 << width) - 1 if width < 64 else -1
    g = circuits.pack_lanes(x & mask, width)
    p = circuits.pack_lanes(((x * 0x9E3779B97F4A7C15) & ~x) & mask, width)
    sim = Sim(parties)
    shares = [(_share_xor(g, parties, sim.gen), _share_xor(p, parties, sim.gen)) for _ in range(2)]
    got = circuits.carry_trees([(shares[0][0], shares[0][1], width, want_p),
                                (shares[1][0], shares[1][1], width // 2 or 1, False)], sim.poly_fn)
    levels = 0
    w = width
    while w > 1:
        w = w // 4 if w >= 4 else 1
        levels += 1
    assert sim.rounds == levels
    assert [c[0] for c in sim.poly_sizes] == circuits.carry_plan(g.numel(), width, want_p)
    # reference: sequential carry over the width groups, plaintext
    gbits = (x.unsqueeze(-1) >> torch.arange(width)) & 1
    pbits = (((x * 0x9E3779B97F4A7C15) & ~x).unsqueeze(-1) >> torch.arange(width)) & 1
    carry = torch.zeros(n, dtype=torch.int64)
    for i in range(width):
        carry = gbits[:, i] | (pbits[:, i] & carry)
    assert torch.equal(circuits.unpack_bits(_xor_all(got[0][0]), n), carry)
    if want_p:
        assert torch.equal(circuits.unpack_bits(_xor_all(got[0][1]), n), pbits.prod(-1))
    else:
        assert got[0][1] is None


@settings(max_examples=30, deadline=None)
@given(st.lists(INT64, min_size=1, max_size=30), st.lists(INT64, min_size=1, max_size=30))
def test_kogge_stone_adder(s_vals, c_vals):
    n = min(len(s_vals), len(c_vals))
    s = torch.tensor(s_vals[:n], dtype=torch.int64)
    c = torch.tensor(c_vals[:n], dtype=torch.int64)
    sim = Sim(2)
    gen = torch.Generator().manual_seed(3)
    total = circuits.kogge_stone_add(_share_xor(s, 2, gen), _share_xor(c, 2, gen), sim.and_fn)
    assert torch.equal(_xor_all(total), s + c)
    assert sim.rounds == 7


@settings(deadline=None)
@given(st.lists(INT64, min_size=1, max_size=50))
def test_and_tree_detects_all_ones(values):
    x = torch.tensor(values, dtype=torch.int64)
    x[::3] = -1
    sim = Sim(2)
    gen = torch.Generator().manual_seed(5)
    got = circuits.unpack_bits(_xor_all(circuits.and_tree(_share_xor(x, 2, gen), 64, sim.and_fn)), x.numel())
    assert torch.equal(got, (x == -1).long())
    assert sim.rounds == 6
    sim = Sim(3)
    got = circuits.unpack_bits(_xor_all(circuits.and_tree(_share_xor(x, 3, gen), 64, poly_fn=sim.poly_fn)),
                               x.numel())
    assert torch.equal(got, (x == -1).long())
    assert sim.rounds == 3  # 64 -> 16 -> 4 -> 1


@pytest.mark.parametrize("words", [5, circuits.SMALL_EXPAND_WORDS + 1])
def test_expand_terms_numpy_and_torch_paths_agree(words):
    """expand_terms runs on numpy views for small inputs, on torch above SMALL_EXPAND_WORDS:
    both give the same shares (radix-4 carry terms, every monomial shape), and the numpy path
    leaves its inputs unchanged."""
    gen = torch.Generator().manual_seed(words)
    terms = circuits.CARRY4_G + circuits.CARRY4_P
    opened = [_rand(gen, words) for _ in range(7)]
    mask = [_rand(gen, words) for _ in range(7)]
    mono = {m: _rand(gen, words) for m in circuits.monomials(terms)}
    lead = torch.full((words,), -1, dtype=torch.int64)
    before = [t.clone() for t in opened + mask + list(mono.values())]
    for out in (circuits.CARRY4_G, circuits.CARRY4_P):
        got = circuits.expand_terms(out, opened, mask, mono, lead)
        want = circuits._expand_terms_torch(out, opened, mask, mono, lead)
        assert got.dtype == torch.int64 and torch.equal(got, want)
    assert all(torch.equal(a, b) for a, b in zip(before, opened + mask + list(mono.values())))


@pytest.mark.parametrize("words", [5, circuits.SMALL_EXPAND_WORDS + 1])
def test_expand_outputs_is_expand_terms_per_output(words):
    """expand_outputs (a job's outputs over shared numpy views and opened products) gives
    each output's expand_terms on torch's operators, and leaves its inputs unchanged."""
    gen = torch.Generator().manual_seed(words + 1)
    outputs = [circuits.CARRY4_G, circuits.CARRY4_P]
    opened = [_rand(gen, words) for _ in range(7)]
    mask = [_rand(gen, words) for _ in range(7)]
    mono = {m: _rand(gen, words) for m in circuits.monomials(outputs[0] + outputs[1])}
    lead = torch.full((words,), -1, dtype=torch.int64)
    before = [t.clone() for t in opened + mask + list(mono.values())]
    got = circuits.expand_outputs(outputs, opened, mask, mono, lead)
    want = [circuits._expand_terms_torch(out, opened, mask, mono, lead) for out in outputs]
    assert len(got) == 2 and all(torch.equal(g, w) for g, w in zip(got, want))
    assert not torch.equal(got[0], got[1])
    assert all(torch.equal(a, b) for a, b in zip(before, opened + mask + list(mono.values())))


@pytest.mark.parametrize("words", [7, circuits.SMALL_EXPAND_WORDS + 3])
def test_halves_numpy_and_torch_paths_agree(words):
    """halves looks up on numpy up to SMALL_EXPAND_WORDS words, on torch above: both as the
    shifts and masks of compress_even and pack_lanes give them, on rows and a transpose."""
    x = _rand(torch.Generator().manual_seed(words), 2 * words).view(2, words)
    for t in (x, x.t()):
        hi, lo = circuits.halves(t)
        assert torch.equal(hi, circuits.pack_lanes(circuits.compress_even(t >> 1), 32))
        assert torch.equal(lo, circuits.pack_lanes(circuits.compress_even(t), 32))


@pytest.mark.parametrize("words", [1, 6, 7, circuits.SMALL_EXPAND_WORDS + 3])
def test_quarters_numpy_and_torch_paths_agree(words):
    """quarters splits on numpy up to SMALL_EXPAND_WORDS words (three splits, one conversion
    back per quarter), through halves above and with a halves_fn: each quarter k is bits
    4j+k of every element, 16 per element, as compress_even twice and pack_lanes give them,
    on rows (word counts not a multiple of 4) and a transpose."""
    x = _rand(torch.Generator().manual_seed(words), 2 * words).view(2, words)
    for t in (x, x.t()):
        want = [circuits.pack_lanes(circuits.compress_even(circuits.compress_even(t >> k)), 16)
                for k in range(4)]
        for got in (circuits.quarters(t), circuits.quarters(t, halves_fn=circuits.halves)):
            assert all(torch.equal(g, w) for g, w in zip(got, want))


@pytest.mark.parametrize("words", [1, 5, circuits.SMALL_EXPAND_WORDS + 3])
def test_unpack_bits_numpy_and_torch_paths_agree(words):
    """unpack_bits (numpy's unpackbits up to SMALL_EXPAND_WORDS words) gives every bit as
    the shifts of a plain loop give it, on rows, a transpose and counts short of, at and
    inside a word; a count beyond the words gives the bits there are, as unpack_lanes does."""
    x = _rand(torch.Generator().manual_seed(words), 2 * words).view(2, words)
    for t in (x, x.t()):
        width = t.shape[-1]
        plain = torch.stack([(t >> i) & 1 for i in range(64)], -1).reshape(*t.shape[:-1], -1)
        for n in sorted({0, 1, 63, 64, 64 * width - 1, 64 * width}):
            assert torch.equal(circuits.unpack_bits(t, n), plain[..., :n])
        assert torch.equal(circuits.unpack_bits(t, 64 * width + 5), circuits.unpack_lanes(t, 1, 64 * width + 5))


def test_broadcast_shape_is_torchs():
    """correlations.broadcast_shape (memoised) gives torch.broadcast_shapes' shape, and
    incompatible shapes raise torch's error on every call (errors are not memoised)."""
    from crypten_lite.provider.correlations import broadcast_shape
    for a, b in [((2, 1, 3), (4, 3)), ((), (5,)), (torch.Size([1, 6]), [7, 1])]:
        assert broadcast_shape(a, b) == tuple(torch.broadcast_shapes(tuple(a), tuple(b)))
    for _ in range(2):
        with pytest.raises(RuntimeError):
            broadcast_shape((2, 3), (4, 3))
