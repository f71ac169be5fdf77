"""Direct (Cheetah-style) convolution triples for the pairwise provider: the input tensor and
the kernel as polynomials, so that one plaintext-ciphertext product gives a whole block of
a convolution, without unfolding the input (im2col would spread kh*kw copies of every input
value over sparse plaintexts).

Layout (ring degree N, padded input [B, C, H, W], kernel [M, C, kh, kw], dilation (dh, dw),
stride 1, valid). A channel block of cb channels of nb images is the polynomial
    x(X) = Sum x[b, c, i, j] X^(b D + c H W + i W + j),          D = cb H W, nb D <= N
(the block's values in their own order: the encrypted operand is dense), a kernel block the
polynomial
    w_o(X) = Sum w[o, c, i, j] X^(O - c H W - i dh W - j dw),     O = (cb-1) H W + (kh-1) dh W + (kw-1) dw,
and the coefficient b D + O + i' W + j' of x w_o is output (b, o, i', j') for i' < H - (kh-1) dh,
j' < W - (kw-1) dw: every term landing there has i' + i dh < H and j' + j dw < W, so it is a
value of image b, and a product's terms past N (negacyclic wrap) land below O, where no
output lies, since nb D <= N. Channel blocks are summed in the ciphertexts.

Several output channels per returned ciphertext: mo kernels in one plaintext, kernel o at
X^(o S), S = nb D + O (the span of one channel's product), w(X) = Sum_o X^(o S) w_o(X).
x w_o occupies degrees [o S, o S + S), so output (b, o, i', j') lies at o S + b D + O + i' W
+ j', apart from every other channel's product; the last one's wrap lands below
(mo - 1) S + nb D + O - N <= O, where channel 0 has no output, when (mo - 1) S + nb D <= N
(mo = 1 is the condition above). A LeNet conv1 at batch 1 (6 channels of 24 x 24) comes
back in one ciphertext instead of six. A product costs ciphertexts in proportion to the
input (sent) plus the outputs (returned), not to the unfolded input, nor to the number of
output channels.

Each party owns conv(its input, the peer's kernel): it encrypts its own input; the peer
multiplies by its kernel's plaintexts and returns flooded, masked ciphertexts (the Z_2^64
engine, he_pow2.Pow2Unit.finish); both parties do so at once (he.CrossEngine._two_way).
A weight triple's kernel (a fixed weight mask) is instead encrypted once in this layout and
kept by the peer, the input then the plaintext (he_kept.py).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import ProtocolError
from . import he, he_pow2

LAYOUT = "cb-mo-v2"   # the layout's version (named in provider pairwise's handshake)


@dataclass(frozen=True)
class ConvLayout:
    """The block structure of one direct convolution (public: both parties derive it)."""

    bsz: int
    channels: int
    height: int
    width: int
    out_channels: int
    kh: int
    kw: int
    dilation: tuple[int, int]
    cb: int          # channels per block
    cblocks: int     # channel blocks (summed in the ciphertexts)
    nb: int          # images per block
    gblocks: int     # image groups
    mo: int = 1      # output channels per returned ciphertext (kernel o at X^(o S))

    @property
    def oblocks(self) -> int:
        """Output-channel groups (returned ciphertexts per image group)."""
        return -(-self.out_channels // self.mo)

    @property
    def span(self) -> int:
        """S: the degrees one output channel's product occupies (nb D + O)."""
        return self.nb * self.block + self.offset

    @property
    def hout(self) -> int:
        return self.height - (self.kh - 1) * self.dilation[0]

    @property
    def wout(self) -> int:
        return self.width - (self.kw - 1) * self.dilation[1]

    @property
    def block(self) -> int:
        return self.cb * self.height * self.width

    @property
    def offset(self) -> int:
        dh, dw = self.dilation
        return (self.cb - 1) * self.height * self.width + (self.kh - 1) * dh * self.width + (self.kw - 1) * dw

    def positions(self) -> tuple[np.ndarray, np.ndarray]:
        """(kernel positions [mo, cb*kh*kw], output positions [mo*nb*hout*wout]) in a
        polynomial: kernel o of a group at X^(o S), its outputs after those of kernel o - 1."""
        dh, dw = self.dilation
        c, i, j = np.meshgrid(np.arange(self.cb), np.arange(self.kh), np.arange(self.kw), indexing="ij")
        pos_w = self.offset - (c * self.height * self.width + i * dh * self.width + j * dw)
        b, io, jo = np.meshgrid(np.arange(self.nb), np.arange(self.hout), np.arange(self.wout), indexing="ij")
        pos_out = b * self.block + self.offset + io * self.width + jo
        shift = self.span * np.arange(self.mo).reshape(-1, 1)
        return pos_w.reshape(1, -1) + shift, (pos_out.reshape(1, -1) + shift).reshape(-1)

    def ciphertexts(self) -> tuple[int, int]:
        """(sent, returned) ciphertexts of one one-sided product."""
        return self.gblocks * self.cblocks, self.gblocks * self.oblocks

    def plaintexts(self) -> int:
        """Kernel plaintexts of one one-sided product (products: returned x cblocks)."""
        return self.oblocks * self.cblocks

    def cost(self) -> int:
        """The work of one one-sided product in he._blocks_cost's units (a ciphertext sent or
        returned 72, a plaintext 14, a product 2)."""
        up, back = self.ciphertexts()
        return 72 * up + 72 * back + 14 * self.plaintexts() + 2 * back * self.cblocks


def layout(x_shape: tuple, w_shape: tuple, dilation: tuple[int, int], degree: int,
           cb: int | None = None, mo: int | None = None) -> ConvLayout | None:
    """The layout of a direct conv of a padded input [B, C, H, W] with a kernel [M, C, kh, kw]
    (`cb` channels per block and `mo` output channels per returned ciphertext, default: the
    cheapest by ConvLayout.cost; fewer channels per block put more images or more output
    channels in a polynomial, so fewer ciphertexts come back: the channel blocks are summed in
    the ciphertexts); None where one channel of one image does not fit a polynomial, or the
    kernel's extent exceeds the input (the caller unfolds instead)."""
    bsz, channels, height, width = (int(v) for v in x_shape)
    out_channels, cin, kh, kw = (int(v) for v in w_shape)
    if cin != channels or min(bsz, channels, out_channels, kh, kw) < 1:
        return None
    if height * width > degree or height - (kh - 1) * dilation[0] < 1 or width - (kw - 1) * dilation[1] < 1:
        return None
    if cb is None or mo is None:
        return _cheapest((bsz, channels, height, width), (out_channels, cin, kh, kw),
                         tuple(dilation), degree, cb, mo)
    cblocks = -(-channels // cb)
    cb = -(-channels // cblocks)                    # balanced blocks, fewest zero channels
    oblocks = -(-out_channels // mo)
    mo = -(-out_channels // oblocks)                # balanced groups, fewest zero kernels
    block = cb * height * width
    offset = (cb - 1) * height * width + (kh - 1) * dilation[0] * width + (kw - 1) * dilation[1]
    # (mo - 1) S + nb D <= N with S = nb D + O: nb <= (N - (mo - 1) O) / (mo D)
    nb = min(bsz, (degree - (mo - 1) * offset) // (mo * block))
    if nb < 1:
        return None
    lay = ConvLayout(bsz, channels, height, width, out_channels, kh, kw, tuple(dilation),
                     cb, cblocks, nb, -(-bsz // nb), mo)
    if cblocks * mo * cb * kh * kw > he.MAX_NOISE_TERMS:
        return None
    return lay


@functools.lru_cache(maxsize=256)
def _cheapest(x_shape: tuple, w_shape: tuple, dilation: tuple, degree: int, cb: int | None,
              mo: int | None) -> ConvLayout | None:
    """layout()'s choice: every channel block size, and every output group size that gives
    a distinct number of groups and fits a polynomial (memoised: both parties, every call)."""
    channels, height, width = x_shape[1], x_shape[2], x_shape[3]
    out_channels = w_shape[0]
    options = []
    for c in ([cb] if cb else range(1, min(channels, degree // (height * width)) + 1)):
        fits = degree // (c * height * width)
        groups = [mo] if mo else sorted({-(-out_channels // g) for g in range(1, out_channels + 1)})
        options += [layout(x_shape, w_shape, dilation, degree, c, o) for o in groups if o <= fits]
    options = [o for o in options if o is not None]
    return min(options, key=lambda o: (o.cost(), o.cb, o.mo)) if options else None


def _input_rows(lay: ConvLayout, x: np.ndarray, t: int, nd: int) -> np.ndarray:
    """[gblocks * cblocks, nd] coefficient rows (mod t) of the input blocks."""
    pad = np.zeros((lay.gblocks * lay.nb, lay.cblocks * lay.cb, lay.height, lay.width), dtype=np.uint64)
    pad[:lay.bsz, :lay.channels] = x
    blk = pad.reshape(lay.gblocks, lay.nb, lay.cblocks, lay.cb * lay.height * lay.width)
    blk = blk.transpose(0, 2, 1, 3).reshape(lay.gblocks * lay.cblocks, lay.nb * lay.block)
    rows = np.zeros((blk.shape[0], nd), dtype=np.uint64)
    rows[:, :blk.shape[1]] = he.residues(blk, t)
    return rows


def _kernel_rows(lay: ConvLayout, w: np.ndarray, pos_w: np.ndarray, t: int, nd: int) -> np.ndarray:
    """[oblocks * cblocks, nd] coefficient rows (mod t) of the kernel blocks (pos_w
    [mo, cb*kh*kw]: the mo kernels of an output group in one row)."""
    pad = np.zeros((lay.oblocks * lay.mo, lay.cblocks * lay.cb, lay.kh, lay.kw), dtype=np.uint64)
    pad[:lay.out_channels, :lay.channels] = w
    blk = pad.reshape(lay.oblocks, lay.mo, lay.cblocks, lay.cb * lay.kh * lay.kw).transpose(0, 2, 1, 3)
    blk = blk.reshape(lay.oblocks * lay.cblocks, lay.mo * lay.cb * lay.kh * lay.kw)
    rows = np.zeros((blk.shape[0], nd), dtype=np.uint64)
    rows[:, pos_w.reshape(-1)] = he.residues(blk, t)
    return rows


def _from_blocks(lay: ConvLayout, blocks: np.ndarray) -> np.ndarray:
    """[gblocks, oblocks, mo*nb*hout*wout] -> [B, M, hout, wout]."""
    out = blocks.reshape(lay.gblocks, lay.oblocks * lay.mo, lay.nb, lay.hout, lay.wout)
    out = out.transpose(0, 2, 1, 3, 4).reshape(lay.gblocks * lay.nb, lay.oblocks * lay.mo, lay.hout, lay.wout)
    return out[:lay.bsz, :lay.out_channels]


def conv2d(engine: "he.CrossEngine", x: np.ndarray, w: np.ndarray, dilation: tuple[int, int],
           bound_bits: int) -> np.ndarray:
    """This party's share (uint64 [B, M, hout, wout]) of conv(x0, w1) + conv(x1, w0), stride 1,
    no padding (pad the inputs first), for x [B, C, H, W] and w [M, C, kh, kw] this party's
    own (uint64). bound_bits: public, conv(x0, w1) + conv(x1, w0) < 2^bound_bits elementwise.
    Each party owns the product of its own input (encrypted) with the peer's kernel and
    evaluates the peer's at the same time."""
    nd = engine.params.n
    lay = layout(x.shape, w.shape, dilation, nd)
    if lay is None:
        raise ProtocolError(f"pairwise: no direct conv layout for input {tuple(x.shape)} and "
                            f"kernel {tuple(w.shape)}; unfold it instead")
    primes = engine._mm_units()
    pos_w, pos_out = lay.positions()
    up, back = lay.ciphertexts()
    xs = np.ascontiguousarray(x, dtype=np.uint64)
    ws = np.ascontiguousarray(w, dtype=np.uint64)

    def encrypt(i: int, p, rand: Callable) -> list[bytes]:
        return he.encrypt_at(p, engine._files, _input_rows(lay, xs, p.t, nd))

    where = pos_out.tolist()

    def decrypt(i: int, p, got: list[bytes]) -> np.ndarray:
        coeffs = np.stack([he.open_at(p, engine._files, got[j], where) for j in range(back)])
        return _from_blocks(lay, coeffs)

    r = engine._mask_words((lay.gblocks, lay.oblocks, pos_out.size), 64)

    def evaluate(pi: int, p, rand: Callable, got: list[bytes]) -> list[bytes]:
        cts = [engine._load_ntt(p, got[j]) for j in range(up)]
        pts = p.ntt_plains(engine._files, _kernel_rows(lay, ws, pos_w, p.t, nd))
        bound = p.noise_bound(lay.cblocks, lay.mo * lay.cb * lay.kh * lay.kw)
        masks = engine._block_masks(p, r, (lay.gblocks, lay.oblocks), pos_out, rand)
        out = []
        for g in range(lay.gblocks):
            for o in range(lay.oblocks):
                acc = he._dot(p, [(cts[g * lay.cblocks + c], pts[o * lay.cblocks + c])
                                  for c in range(lay.cblocks)])
                out.append(he.finish_at(p, engine._files, acc, masks[g * lay.oblocks + o], bound, rand, where))
        return out

    res = engine._two_way(primes, he._Own(encrypt, back, decrypt), he._Eval(up, evaluate))
    mine = res[0]
    with np.errstate(over="ignore"):
        share = np.uint64(0) - r[0]
        return mine + _from_blocks(lay, share)


def padded_shape(x_shape: tuple, padding: tuple[int, int]) -> tuple[int, int, int, int]:
    bsz, channels, height, width = (int(v) for v in x_shape)
    return bsz, channels, height + 2 * padding[0], width + 2 * padding[1]


def preferred(x_shape: tuple, w_shape: tuple, stride: tuple[int, int], padding: tuple[int, int],
              dilation: tuple[int, int], groups: int, degree: int) -> bool:
    """Whether a conv2d triple's cross terms cost less direct than by unfolding (im2col, then
    he.CrossEngine.matmul's best encoding), by he._blocks_cost's model; groups == 1 only."""
    if groups != 1:
        return False
    lay = layout(padded_shape(x_shape, padding), w_shape, dilation, degree)
    if lay is None:
        return False
    m, k = int(w_shape[0]), int(w_shape[1]) * int(w_shape[2]) * int(w_shape[3])
    hs = -(-(lay.hout) // stride[0])
    ws = -(-(lay.wout) // stride[1])
    n = lay.bsz * hs * ws
    unfolded = min(he._blocks_cost(m, k, n, degree, joint=False)[0],
                   he._blocks_cost(n, k, m, degree, joint=False)[0],
                   he._blocks_cost(m, k, n, degree)[0])
    return lay.cost() < unfolded


def ciphertext_bytes(x_shape: tuple, w_shape: tuple, dilation: tuple[int, int], degree: int,
                     primes: int = 1) -> int:
    """Ciphertext bytes (both products, both ways) of one conv2d call (one Z_2^64 set of
    ciphertexts: `primes` is kept for callers of the former CRT engine and is 1)."""
    lay = layout(x_shape, w_shape, dilation, degree)
    up, back = lay.ciphertexts()
    return 2 * primes * (up + back) * he_pow2.CT_BYTES


def cross_conv(engine: "he.CrossEngine", chunk: int, x: np.ndarray, w: np.ndarray,
               stride: tuple[int, int], padding: tuple[int, int], dilation: tuple[int, int],
               bound_bits: int) -> np.ndarray:
    """conv2d's cross terms (this party's share, uint64 [B, M, H_out, W_out]) with stride and
    padding: the input padded with zeros, a stride-1 product, then every stride-th output;
    in slices of at most `chunk` ciphertext bytes (halved along the batch, then the output
    channels: the same on both parties)."""
    ph, pw = padding
    xp = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw))) if ph or pw else x
    primes = 1

    def run(xs: np.ndarray, ws: np.ndarray) -> np.ndarray:
        nbytes = ciphertext_bytes(xs.shape, ws.shape, dilation, engine.params.n, primes)
        if nbytes > chunk and xs.shape[0] > 1:
            h = xs.shape[0] // 2
            return np.concatenate([run(xs[:h], ws), run(xs[h:], ws)], axis=0)
        if nbytes > chunk and ws.shape[0] > 1:
            h = ws.shape[0] // 2
            return np.concatenate([run(xs, ws[:h]), run(xs, ws[h:])], axis=1)
        return conv2d(engine, xs, ws, dilation, bound_bits)
    out = run(xp, w)
    return np.ascontiguousarray(out[:, :, ::stride[0], ::stride[1]])
