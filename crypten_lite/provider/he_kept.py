"""Kept weight ciphertexts: a fixed-weight triple's B encrypted once per loaded model.

A ``weight_triple`` (provider/correlations.py) has a fresh A per inference and the model's
FIXED weight mask B (one ``weight_mask`` counter per weight layout, mpc/fixed.py). Its cross
terms op(a0, b1) + op(a1, b0) were made as any triple's: each party encrypted its fresh A and
the peer multiplied by its B as plaintext. Here instead each party encrypts its own B share
once (seeded symmetric BFV under its own key, the Z_2^64 engine of he_pow2.py, made in NTT
form by he_upload.py) and sends it; the peer keeps those ciphertexts (NTT form, as received:
no NTT) for as long as the provider lives. A plan's weight triples go in one exchange
(provider pairwise's _weight_groups), fresh ones too: their B shares up in one message. Per inference
a party only encodes its fresh A as NTT plaintexts, multiplies the kept ciphertexts of the
peer's B by them, floods, re-randomises (a fresh public-key encryption of zero under the
peer's key), masks with R uniform mod 2^64 and switches down (Pow2Unit.finish, as every
returned ciphertext), and sends the result back: one message each way at once, where the
product of the fresh A took two (A up, the product back), and no encryption, upload or NTT of
an A ciphertext. The peer decrypts op(a_mine, b_peer) + R; this party keeps -R.

Why it is safe to keep them: a ciphertext of a fixed B under its owner's key reveals nothing
to the peer (semantic security of BFV, RLWE): holding it for many inferences is holding one
ciphertext. What goes back to B's owner is, per inference, a fresh flood and a fresh
re-randomisation over the product with a fresh A, masked by a fresh R: the owner learns
op(A, B) + R, uniform. Keys never leave their owners; every A, R, flood and zero encryption
is fresh and used once; the kept B is only ever the model's weight mask (a new mask counter,
as after any weight change, is a new entry).

Encodings (public, both parties derive them from the shapes): he_kept_layouts.py (matmul,
linear, conv1d, conv2d grouped or not, conv_transpose2d, large weights in column slices).
What goes back: only c0's output coefficients (c1 whole), several products side by side in
one ciphertext where their spans fit (_bins), residues at 50 bits (he_pow2.pack50); the kept
B goes up packed the same way. Anything not kept returns None and the caller makes the
product as before.
"""

from __future__ import annotations

import numpy as np

from . import he, he_pow2
from .he_kept_layouts import (KEEP_MAX_CTS, KEEP_TOTAL_CTS, _Conv, _Matmul, _Stack,  # noqa: F401
                              _conv_layout, _fresh_cost, _kept_cost, _matmul_blocks, _plan)

VERSION = "kept-b-v2"    # named in provider pairwise's handshake (v2: extraction, packing)


Item = tuple   # (mask counter, op, a: this party's fresh A, b: its B share, op params)


def _entries(engine: "he.CrossEngine", cache: dict, chunk: int, shapes: list) -> list | None:
    """[(key, plan)] for items of public (mask counter, op, a shape, b shape, params), or None
    where any is not kept: no encoding, the provider's kept total past KEEP_TOTAL_CTS, or the
    exchange's ciphertexts (kept B sent now, products back) past the chunk budget."""
    nd = engine.params.n
    have = sum(len(v) for v in cache.values())
    fresh: set = set()
    out, total = [], 0
    for mask_counter, op, a_shape, b_shape, params in shapes:
        plan = _plan(op, tuple(a_shape), tuple(b_shape), tuple(params), nd)
        if plan is None:
            return None
        key = (mask_counter, op, tuple(a_shape), tuple(b_shape), tuple(params))
        total += plan[0].back
        if key not in cache and key not in fresh:
            fresh.add(key)
            have += plan[0].kept
            total += plan[0].kept
        out.append((key, plan))
    if have > KEEP_TOTAL_CTS or total * he_pow2.CT_BYTES > chunk:
        return None
    return out


def cross_many(engine: "he.CrossEngine", cache: dict, chunk: int, items: list) -> list | None:
    """This party's shares (uint64) of op(a0, b1) + op(a1, b0) for weight triples whose B is
    the weight mask of their mask counter, in one exchange: the B shares not kept yet go up
    in one message (each layout once) and the peer's are kept in `cache` (the provider's,
    the same on both parties), then every product comes back in one message each way. None
    where any item is not kept (the caller makes them as before). Both parties call it at
    the same point of the same exchange with items of the same public shapes."""
    entries = _entries(engine, cache, chunk, [(mc, op, a.shape, b.shape, p) for mc, op, a, b, p in items])
    if entries is None:
        return None
    unit = engine._mm_units()[0]
    files = engine._files
    _upload(engine, unit, cache, entries, items)
    encs = [plan[0] for _, plan in entries]
    bins = _bins(encs, unit.n)
    rows, at_row = [], {}               # A's plaintext rows, once per (item, offset)
    for members in bins:
        for e, _, off in members:
            if (e, off) not in at_row:
                enc, prepare = entries[e][1][0], entries[e][1][1]
                at_row[(e, off)] = (sum(len(x) for x in rows), enc.plains)
                rows.append(_shifted(enc.plain_rows(prepare(items[e][2])), off))
    pts = unit.ntt_plains(files, np.concatenate(rows))
    rs = [engine._mask_words(enc.mask_shape() + (enc.pos_out.size,), 64)[0].reshape(enc.back, -1)
          for enc in encs]              # R at the outputs: the only coefficients sent
    back = []
    for members in bins:
        pairs, noise, keep, mask = [], 0, [], []
        for e, j, off in members:
            first, count = at_row[(e, off)]
            got, nonzero = encs[e].pairs(j, cache[entries[e][0]], pts[first:first + count])
            pairs += got
            noise += encs[e].terms() * nonzero
            keep += (encs[e].pos_out + off).tolist()
            mask.append(rs[e][j])
        bound = unit.noise_bound(1, noise)
        back.append(unit.finish(files, he._dot(unit, pairs), np.concatenate(mask), bound, engine._rand, keep))
    engine._send(he.pack(back))
    got = he.unpack(engine._recv(), len(back), "kept-weight product ciphertexts")
    opened = _open_back(unit, files, encs, bins, got)
    shares = []
    for (key, (enc, _, _, finish)), mine, r in zip(entries, opened, rs):
        with np.errstate(over="ignore"):
            shares.append(finish(enc.out(mine - r)))
    return shares


def _upload(engine: "he.CrossEngine", unit, cache: dict, entries: list, items: list) -> None:
    """The B shares of the layouts not kept yet: this party's up in one message (each layout
    once), the peer's kept in `cache` (NTT form, checked as any ciphertext from the peer)."""
    uploads: dict = {}
    for (key, plan), item in zip(entries, items):
        if key not in cache and key not in uploads:
            uploads[key] = (plan[0], plan[2](item[3]))
    if not uploads:
        return
    mine = []
    for enc, b in uploads.values():
        mine += he.encrypt_at(unit, engine._files, enc.kept_rows(b))
    engine._send(he.pack(mine))
    got = he.unpack(engine._recv(), sum(enc.kept for enc, _ in uploads.values()), "kept weight ciphertexts")
    at = 0
    for key, (enc, _) in uploads.items():
        cache[key] = [engine._load_ntt(unit, d) for d in got[at:at + enc.kept]]
        at += enc.kept


def _open_back(unit, files: "he._Files", encs: list, bins: list, got: list) -> list[np.ndarray]:
    """The peer's returned ciphertexts opened at their products' output coefficients: per
    item, [its returned blocks, outputs] (op(A, B) + the peer's R there)."""
    opened = [np.zeros((enc.back, enc.pos_out.size), dtype=np.uint64) for enc in encs]
    for members, data in zip(bins, got):
        keep = np.concatenate([encs[e].pos_out + off for e, _, off in members]).tolist()
        values, at = unit.open_extracted(files, data, keep), 0
        for e, j, _ in members:
            opened[e][j] = values[at:at + encs[e].pos_out.size]
            at += encs[e].pos_out.size
    return opened


def _shifted(rows: np.ndarray, off: int) -> np.ndarray:
    """The plaintext rows times X^off (their degrees stay below N: _bins placed them so)."""
    if off == 0:
        return rows
    if rows[:, rows.shape[1] - off:].any():
        raise AssertionError("he_kept: a shifted plaintext would wrap")   # _bins forbids it
    out = np.zeros_like(rows)
    out[:, off:] = rows[:, :rows.shape[1] - off]
    return out


def _bins(encs: list, nd: int) -> list[list[tuple[int, int, int]]]:
    """The returned ciphertexts of an exchange: each the sum of one or several products
    (item e's returned block j, its plaintext times X^off), [(e, j, off)] per ciphertext.
    A product occupies degrees [off, off + span) (its output coefficients and the rest of
    its terms), so products side by side never meet, nor wrap; the noise terms (products x
    A's nonzero coefficients) of one ciphertext stay within he_pow2.MAX_TERMS, so its flood
    fits as every returned ciphertext's. First fit by decreasing span, from the public
    shapes only: the same on both parties. A layout whose terms wrap (span > N) is alone."""
    units = sorted(((enc.span(), e, j) for e, enc in enumerate(encs) for j in range(enc.back)),
                   key=lambda u: (-u[0], u[1], u[2]))
    bins: list = []                     # [degrees used, noise terms, members]
    for span, e, j in units:
        _, nonzero = encs[e].pairs(j, [None] * encs[e].kept, [None] * encs[e].plains)
        noise = encs[e].terms() * nonzero
        for b in bins:
            if b[0] + span <= nd and b[1] + noise <= he_pow2.MAX_TERMS:
                b[2].append((e, j, b[0]))
                b[0] += span
                b[1] += noise
                break
        else:
            bins.append([span if span <= nd else nd + 1, noise, [(e, j, 0)]])
    return [b[2] for b in bins]


def cross(engine: "he.CrossEngine", cache: dict, chunk: int, mask_counter: int, op: str,
          a: np.ndarray, b: np.ndarray, params: tuple) -> np.ndarray | None:
    """cross_many of one weight triple: its share, or None where it is not kept."""
    got = cross_many(engine, cache, chunk, [(mask_counter, op, a, b, tuple(params))])
    return None if got is None else got[0]


def keeps(engine: "he.CrossEngine", cache: dict, chunk: int, shapes: list) -> bool:
    """Whether cross_many would keep every item of these public (mask counter, op, a shape,
    b shape, params) (provider pairwise groups a plan's weight triples by it)."""
    return _entries(engine, cache, chunk, shapes) is not None


def fits(engine: "he.CrossEngine", op: str, a_shape: tuple, b_shape: tuple, params: tuple,
         chunk: int) -> bool:
    """Whether cross() would keep this product's B (tests, benchmarks)."""
    plan = _plan(op, tuple(a_shape), tuple(b_shape), tuple(params), engine.params.n)
    return plan is not None and (plan[0].kept + plan[0].back) * he_pow2.CT_BYTES <= chunk

