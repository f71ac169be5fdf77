"""The encodings of the kept weight ciphertexts (he_kept.py): which blocks of B are kept,
which plaintexts of A multiply them and where the outputs lie, per op, from the public shapes
only (both parties derive the same).

- matmul / linear A [m, k] x B [k, n] (A's leading dimensions folded into m): Cheetah's
  coefficient blocks (he._positions: A block (i, c) at i kw nw + c, B block (c, j) at
  j kw + kw - 1 - c), A the plaintext, the blocks chosen by the cost model (_matmul_blocks);
- conv2d: he_conv's direct layout, the kernel blocks kept, the input blocks as plaintexts
  (_conv_layout); conv1d as a conv2d of height 1; conv_transpose2d as the conv2d of its
  stride-dilated, padded input by its flipped, channel-swapped kernel;
- a grouped convolution, or a weight past KEEP_MAX_CTS kept ciphertexts (B's column slices,
  A's plaintexts shared): a _Stack of one encoding, where its work per inference is below a
  fresh A's product.

Anything else (another op, a layout whose flood would not fit, a stack that costs more)
gives None and the caller makes the product as any triple's.
"""

from __future__ import annotations

import functools

import numpy as np

from . import he, he_conv, he_pow2
from .correlations import _conv_params

KEEP_MAX_CTS = 64        # kept ciphertexts per weight layout (NTT form: 512 KB each in memory)
KEEP_TOTAL_CTS = 512     # kept per provider (256 MB); past it, products are made as before


@functools.lru_cache(maxsize=1024)
def _matmul_blocks(m: int, k: int, n: int, nd: int) -> tuple[int, int, int] | None:
    """(mw, kw, nw) of the coefficient blocks with A as plaintext and B kept: per inference
    72 per returned ciphertext, 14 per plaintext, 2 per product (he._blocks_cost's units),
    plus the kept B's upload (72 per ciphertext) spread over two inferences, so that a
    model's first inference costs about what a fresh A's product did (LeNet b64's fc1:
    32 kept, 16 back, where the fewest per inference alone would keep 64); fewest kept
    ciphertexts on a tie; the noise of kb products of mw kw nonzero coefficients within
    he_pow2.MAX_TERMS."""
    best = None
    for kw in sorted(he._sizes(k)):
        for nw in sorted(he._sizes(n)):
            mw = min(m, (nd - kw + 1) // (kw * nw))
            if mw < 1:
                continue
            mb, kb, nb = -(-m // mw), -(-k // kw), -(-n // nw)
            if kb * mw * kw > he_pow2.MAX_TERMS or kb * nb > KEEP_MAX_CTS:
                continue
            cost = (72 * mb * nb + 14 * mb * kb + 2 * mb * kb * nb + 36 * kb * nb, kb * nb)
            if best is None or cost < best[0]:
                best = (cost, mw, kw, nw)
    return None if best is None else best[1:]


@functools.lru_cache(maxsize=256)
def _conv_layout(x_shape: tuple, w_shape: tuple, dilation: tuple, nd: int) -> "he_conv.ConvLayout | None":
    """he_conv's direct layout for a kept kernel: every (channels per block, output channels
    per ciphertext), costed as _matmul_blocks does (per inference 72 per returned ciphertext,
    14 per input plaintext, 2 per product, the kept kernel's upload over two inferences), the
    noise of cblocks products of an input block's nb D coefficients within MAX_TERMS."""
    channels, height, width = x_shape[1], x_shape[2], x_shape[3]
    out_channels = w_shape[0]
    best = None
    for cb in range(1, min(channels, nd // (height * width)) + 1):
        for mo in sorted({-(-out_channels // g) for g in range(1, out_channels + 1)}):
            if mo * cb * height * width > nd:
                continue
            lay = he_conv.layout(x_shape, w_shape, dilation, nd, cb, mo)
            if (lay is None or lay.plaintexts() > KEEP_MAX_CTS
                    or lay.cblocks * lay.nb * lay.block > he_pow2.MAX_TERMS):
                continue
            up, back = lay.ciphertexts()
            cost = (72 * back + 14 * up + 2 * back * lay.cblocks + 36 * lay.plaintexts(), lay.plaintexts())
            if best is None or cost < best[0]:
                best = (cost, lay)
    return None if best is None else best[1]


class _Matmul:
    """A [m, k] (plaintext, fresh) x B [k, n] (kept)."""

    def __init__(self, m: int, k: int, n: int, nd: int, blocks: tuple[int, int, int]):
        self.m, self.k, self.n, self.nd = m, k, n, nd
        self.mw, self.kw, self.nw = blocks
        self.mb, self.kb, self.nb = -(-m // self.mw), -(-k // self.kw), -(-n // self.nw)
        self.pos_a, self.pos_b, self.pos_out = he._positions(self.mw, self.kw, self.nw)
        self.kept = self.kb * self.nb
        self.back = self.mb * self.nb
        self.plains = self.mb * self.kb

    def kept_rows(self, b: np.ndarray) -> np.ndarray:
        pad = np.zeros((self.kb * self.kw, self.nb * self.nw), dtype=np.uint64)
        pad[:self.k, :self.n] = b
        blk = pad.reshape(self.kb, self.kw, self.nb, self.nw).transpose(0, 2, 1, 3)
        return he._polys(blk.reshape(self.kb, self.nb, -1), self.pos_b, 1 << 64, self.nd).reshape(-1, self.nd)

    def plain_rows(self, a: np.ndarray) -> np.ndarray:
        pad = np.zeros((self.mb * self.mw, self.kb * self.kw), dtype=np.uint64)
        pad[:self.m, :self.k] = a
        blk = pad.reshape(self.mb, self.mw, self.kb, self.kw).transpose(0, 2, 1, 3)
        return he._polys(blk.reshape(self.mb, self.kb, -1), self.pos_a, 1 << 64, self.nd).reshape(-1, self.nd)

    def pairs(self, j: int, kept: list, pts: list) -> tuple[list, int]:
        """The (kept ciphertext, plaintext) products of returned ciphertext j, its noise terms."""
        mi, nj = divmod(j, self.nb)
        return ([(kept[kk * self.nb + nj], pts[mi * self.kb + kk]) for kk in range(self.kb)],
                self.mw * self.kw)

    def mask_shape(self) -> tuple:
        return (1, self.mb, self.nb)

    def span(self) -> int:
        """Degrees a returned block's product occupies: [0, A's top + B's top]."""
        return int(self.pos_a.max() + self.pos_b.max() + 1)

    def terms(self) -> int:
        return self.kb

    def out(self, blocks: np.ndarray) -> np.ndarray:
        """[back, mw*nw] output coefficients -> [m, n]."""
        blk = blocks.reshape(self.mb, self.nb, self.mw, self.nw).transpose(0, 2, 1, 3)
        return blk.reshape(self.mb * self.mw, self.nb * self.nw)[:self.m, :self.n]


class _Conv:
    """conv2d (stride 1 on the padded input; the caller subsamples) with the kernel kept."""

    def __init__(self, lay: he_conv.ConvLayout, nd: int):
        self.lay, self.nd = lay, nd
        self.pos_w, self.pos_out = lay.positions()
        self.kept = lay.plaintexts()
        self.back = lay.ciphertexts()[1]
        self.plains = lay.gblocks * lay.cblocks

    def kept_rows(self, w: np.ndarray) -> np.ndarray:
        return he_conv._kernel_rows(self.lay, w, self.pos_w, 1 << 64, self.nd)

    def plain_rows(self, x: np.ndarray) -> np.ndarray:
        return he_conv._input_rows(self.lay, x, 1 << 64, self.nd)

    def pairs(self, j: int, kept: list, pts: list) -> tuple[list, int]:
        lay = self.lay
        g, o = divmod(j, lay.oblocks)
        return ([(kept[o * lay.cblocks + c], pts[g * lay.cblocks + c]) for c in range(lay.cblocks)],
                lay.nb * lay.block)

    def mask_shape(self) -> tuple:
        return (self.lay.gblocks, self.lay.oblocks)

    def span(self) -> int:
        """Degrees a returned block's product occupies (past N where the layout wraps)."""
        return int(self.lay.nb * self.lay.block + self.pos_w.max())

    def terms(self) -> int:
        return self.lay.cblocks

    def out(self, blocks: np.ndarray) -> np.ndarray:
        return he_conv._from_blocks(self.lay, blocks.reshape(self.lay.gblocks, self.lay.oblocks, -1))


class _Stack:
    """`parts` products of one encoding `sub` side by side, as one: a grouped convolution
    (group g: the input's channel slice g, the kernel's output-channel slice g) or a weight
    past KEEP_MAX_CTS kept ciphertexts (B's column slices, one A shared: its plaintexts are
    made once). Kept and returned ciphertexts are sub's, part after part; the outputs are
    joined along `axis` of sub's output."""

    def __init__(self, sub, parts: int, split_a: bool, axis: int):
        self.sub, self.parts, self.split_a, self.axis = sub, parts, split_a, axis
        self.nd, self.pos_out = sub.nd, sub.pos_out
        self.kept, self.back = sub.kept * parts, sub.back * parts
        self.plains = sub.plains * (parts if split_a else 1)

    def kept_rows(self, bs: list) -> np.ndarray:
        return np.concatenate([self.sub.kept_rows(b) for b in bs])

    def plain_rows(self, a) -> np.ndarray:
        return np.concatenate([self.sub.plain_rows(x) for x in a]) if self.split_a else self.sub.plain_rows(a)

    def pairs(self, j: int, kept: list, pts: list) -> tuple[list, int]:
        g, jj = divmod(j, self.sub.back)
        at = g * self.sub.plains if self.split_a else 0
        return self.sub.pairs(jj, kept[g * self.sub.kept:(g + 1) * self.sub.kept],
                              pts[at:at + self.sub.plains])

    def mask_shape(self) -> tuple:
        return (self.parts,) + self.sub.mask_shape()

    def span(self) -> int:
        return self.sub.span()

    def terms(self) -> int:
        return self.sub.terms()

    def out(self, blocks: np.ndarray) -> np.ndarray:
        per = blocks.reshape(self.parts, self.sub.back, -1)
        return np.concatenate([self.sub.out(per[g]) for g in range(self.parts)], axis=self.axis)


def _kept_cost(enc) -> int:
    """A kept encoding's work per inference in he._blocks_cost's units (72 per returned
    ciphertext, 14 per plaintext, 2 per product) plus its kept B's upload over two inferences
    (36 per kept ciphertext), as _matmul_blocks and _conv_layout cost theirs."""
    return 72 * enc.back + 14 * enc.plains + 2 * enc.back * enc.terms() + 36 * enc.kept


def _fresh_cost(m: int, k: int, n: int, nd: int) -> int:
    """The same work for A [m, k] x B [k, n] made as any triple's one-sided product."""
    return min(he._blocks_cost(m, k, n, nd, joint=False)[0], he._blocks_cost(n, k, m, nd, joint=False)[0])


def _slices(size: int, parts: int) -> list[slice]:
    step = size // parts
    return [slice(g * step, (g + 1) * step) for g in range(parts)]


def _matmul_plan(m: int, k: int, n: int, nd: int):
    """(encoding, split(b): B's column slices or B) of A [m, k] x B [k, n], B in column slices
    of equal width (a divisor of n) where whole it would pass KEEP_MAX_CTS, or None."""
    for parts in (p for p in range(1, n + 1) if n % p == 0):
        blocks = _matmul_blocks(m, k, n // parts, nd)
        if blocks is None:
            continue
        enc = _Matmul(m, k, n // parts, nd, blocks)
        if parts == 1:
            return enc, lambda b: b
        stack = _Stack(enc, parts, False, 1)
        if stack.kept > KEEP_TOTAL_CTS or _kept_cost(stack) > _fresh_cost(m, k, n, nd):
            return None     # (BERT's 768 x 768 at seq 128: 768 ciphertexts back, not kept)
        return stack, lambda b: [b[:, sl] for sl in _slices(n, parts)]
    return None


def _conv_plan(x_shape: tuple, w_shape: tuple, groups: int, dilation: tuple, nd: int):
    """he_conv's kept layout of a stride-1, padded input x_shape [B, C, H, W] and kernel
    w_shape [M, C/groups, kh, kw]: (encoding, split_x, split_w), one _Conv per group stacked,
    or None."""
    bsz, channels, height, width = x_shape
    cg, og = channels // groups, w_shape[0] // groups
    lay = _conv_layout((bsz, cg, height, width), (og,) + tuple(w_shape[1:]), tuple(dilation), nd)
    if lay is None:
        return None
    enc = _Conv(lay, nd)
    if groups == 1:
        return enc, (lambda x: x), (lambda w: w)
    stack = _Stack(enc, groups, True, 1)
    kdim, cols = int(np.prod(w_shape[1:])), bsz * lay.hout * lay.wout
    if stack.kept > KEEP_TOTAL_CTS or _kept_cost(stack) > groups * _fresh_cost(og, kdim, cols, nd):
        return None         # the groups' im2col products (pairwise._cross_conv) cost less
    return (stack, lambda x: [x[:, sl] for sl in _slices(channels, groups)],
            lambda w: [w[sl] for sl in _slices(w_shape[0], groups)])


def _pad(x: np.ndarray, before: tuple, after: tuple) -> np.ndarray:
    if not any(before) and not any(after):
        return x
    return np.pad(x, ((0, 0), (0, 0), (before[0], after[0]), (before[1], after[1])))


@functools.lru_cache(maxsize=1024)
def _plan(op: str, a_shape: tuple, b_shape: tuple, params: tuple, nd: int):
    """(encoding, prepare(a): A in the encoding's layout, weight(b): B as the kept operand,
    finish(share): the op's output), or None where this product is not kept. conv1d is a
    conv2d of height 1; conv_transpose2d the conv2d of its stride-dilated, padded input by
    its flipped, channel-swapped kernel; groups and weights past KEEP_MAX_CTS are _Stacks.
    Cached (public shapes in, encodings that never change out): provider pairwise asks it
    for every weight triple of a plan several times (_weight_groups, he_kept._entries), and
    each encoding's positions cost a few hundred microseconds to lay out."""
    if op in ("matmul", "linear") and len(b_shape) == 2 and len(a_shape) >= 1:
        k, n = (b_shape if op == "matmul" else b_shape[::-1])
        if a_shape[-1] != k:
            return None
        m = int(np.prod(a_shape[:-1])) if len(a_shape) > 1 else 1
        got = _matmul_plan(m, k, n, nd)
        if got is None:
            return None
        enc, split = got
        out_shape = tuple(a_shape[:-1]) + (n,)
        return (enc, lambda a: a.reshape(m, k),
                (lambda b: split(b)) if op == "matmul" else (lambda b: split(np.ascontiguousarray(b.T))),
                lambda s: s.reshape(out_shape))
    if op == "conv1d" and len(a_shape) == 3 and len(b_shape) == 3:
        cp = _conv_params(params, 1)
        inner = _plan("conv2d", a_shape[:2] + (1, a_shape[2]), b_shape[:2] + (1, b_shape[2]),
                      (1, cp["stride"][0], 0, cp["padding"][0], 1, cp["dilation"][0], cp["groups"]), nd)
        if inner is None:
            return None
        enc, prepare, weight, finish = inner
        return (enc, lambda x: prepare(x[:, :, None, :]), lambda w: weight(w[:, :, None, :]),
                lambda s: finish(s)[:, :, 0, :])
    if op == "conv2d" and len(a_shape) == 4 and len(b_shape) == 4:
        cp = _conv_params(params, 2)
        stride, padding, dilation = tuple(cp["stride"]), tuple(cp["padding"]), tuple(cp["dilation"])
        groups = cp["groups"]
        if groups < 1 or a_shape[1] % groups or b_shape[0] % groups or a_shape[1] != b_shape[1] * groups:
            return None
        got = _conv_plan(he_conv.padded_shape(a_shape, padding), tuple(b_shape), groups, dilation, nd)
        if got is None:
            return None
        enc, split_x, split_w = got
        return (enc, lambda x: split_x(_pad(x, padding, padding)), split_w,
                lambda s: np.ascontiguousarray(s[:, :, ::stride[0], ::stride[1]]))
    if op == "conv_transpose2d" and len(a_shape) == 4 and len(b_shape) == 4 and len(params) == 9:
        return _conv_transpose_plan(a_shape, b_shape, params, nd)
    return None


def _conv_transpose_plan(a_shape: tuple, b_shape: tuple, params: tuple, nd: int):
    """_plan of a conv_transpose2d: the conv2d (stride 1) of its input spread by the stride
    (zeros between), padded by dilation * (k - 1) - padding before and that + output_padding
    after, by its kernel flipped and its in/out channels swapped per group; None where the
    padding passes the kernel's reach (that conv2d would crop: made as before)."""
    stride, padding, out_pad, dilation, groups = (tuple(params[0:2]), tuple(params[2:4]),
                                                  tuple(params[4:6]), tuple(params[6:8]), params[8])
    bsz, cin, h, w = a_shape
    _, og, kh, kw = b_shape
    if groups < 1 or cin % groups or b_shape[0] != cin:
        return None
    before = (dilation[0] * (kh - 1) - padding[0], dilation[1] * (kw - 1) - padding[1])
    if min(before) < 0:
        return None     # padding past the kernel's reach: made as before
    after = (before[0] + out_pad[0], before[1] + out_pad[1])
    hu, wu = (h - 1) * stride[0] + 1, (w - 1) * stride[1] + 1
    x_shape = (bsz, cin, hu + before[0] + after[0], wu + before[1] + after[1])
    w_shape = (og * groups, cin // groups, kh, kw)
    got = _conv_plan(x_shape, w_shape, groups, dilation, nd)
    if got is None:
        return None
    enc, split_x, split_w = got
    cg = cin // groups

    def prepare(x: np.ndarray) -> np.ndarray:
        up = np.zeros((bsz, cin, hu, wu), dtype=np.uint64)
        up[:, :, ::stride[0], ::stride[1]] = x
        return split_x(_pad(up, before, after))

    def weight(wt: np.ndarray) -> np.ndarray:      # [cin, og, kh, kw] -> [cout, cin/g, kh, kw]
        flipped = wt[:, :, ::-1, ::-1].reshape(groups, cg, og, kh, kw).transpose(0, 2, 1, 3, 4)
        return split_w(np.ascontiguousarray(flipped.reshape(groups * og, cg, kh, kw)))
    return enc, prepare, weight, lambda s: s
