"""torchvision functions that torch.fx keeps as single nodes (`torch.fx.wrap`), for CrypTensors.

crypten_lite does not import torchvision: these implementations are bound by the functions'
qualified names (crypten_lite.nn.from_pytorch.NAMED_FUNCTIONS). Each works on public tensors
and CrypTensors alike, with the operations of torch.Tensor that CrypTensor also has; what
depends only on shapes (padding amounts, window counts, the shifted-window attention mask)
is computed in the clear, as torchvision computes it.

Swin Transformer V1 (`shifted_window_attention`, `_get_relative_position_bias`,
`_patch_merging_pad`). Swin V2's cosine attention (`logit_scale`) is refused by name.
"""

from __future__ import annotations

import torch

from ..errors import UnsupportedError
from . import functional as F

MASK_VALUE = -100.0  # torchvision's value for attention across shifted-window regions


def patch_merging_pad(x):
    """Pad H and W to even sizes, then the four 2x2 phases side by side on the channels."""
    h, w = x.shape[-3], x.shape[-2]
    if h % 2 or w % 2:
        x = F.pad(x, [0, 0, 0, w % 2, 0, h % 2])
    parts = [x[..., i::2, j::2, :] for i, j in ((0, 0), (1, 0), (0, 1), (1, 1))]
    from .from_pytorch import _cat
    return _cat(parts, -1)


def relative_position_bias(table, index: torch.Tensor, window_size):
    """table[index] as (1, heads, N, N), N = window area; `index` is a public buffer."""
    if F.is_private(index):
        raise UnsupportedError("a secret relative position index is not supported")
    n = window_size[0] * window_size[1]
    rows = table.index_select(0, index.reshape(-1).long()) if F.is_private(table) else table[index.reshape(-1)]
    return rows.reshape(n, n, -1).permute(2, 0, 1).unsqueeze(0)


def _region_labels(size: int, window: int, shift: int) -> torch.Tensor:
    """Which of the three shifted regions each position of a padded side belongs to."""
    pos = torch.arange(size)
    return (pos >= size - window).long() + (pos >= size - shift).long()


def _shift_mask(ph: int, pw: int, window, shift) -> torch.Tensor:
    """(windows, N, N): 0 within a region, MASK_VALUE across regions (public)."""
    labels = _region_labels(ph, window[0], shift[0])[:, None] * 3 + _region_labels(pw, window[1], shift[1])[None, :]
    labels = labels.reshape(ph // window[0], window[0], pw // window[1], window[1]).permute(0, 2, 1, 3)
    labels = labels.reshape(-1, window[0] * window[1])
    return torch.where(labels[:, None, :] != labels[:, :, None], MASK_VALUE, 0.0).double()


def shifted_window_attention(x, qkv_weight, proj_weight, relative_position_bias, window_size, num_heads,
                             shift_size, attention_dropout=0.0, dropout=0.0, qkv_bias=None, proj_bias=None,
                             logit_scale=None, training=True):
    """Window multi-head self-attention of Swin V1 on (B, H, W, C), shifted windows masked."""
    if logit_scale is not None:
        raise UnsupportedError("Swin V2's cosine attention (logit_scale) is not supported on CrypTensors")
    if training and (attention_dropout or dropout):
        raise UnsupportedError("shifted_window_attention with dropout in training mode")
    b, h, w, c = x.shape
    wh, ww = window_size
    pad_r, pad_b = (ww - w % ww) % ww, (wh - h % wh) % wh
    if pad_r or pad_b:
        x = F.pad(x, [0, 0, 0, pad_r, 0, pad_b])
    ph, pw = h + pad_b, w + pad_r
    shift = [0 if wh >= ph else shift_size[0], 0 if ww >= pw else shift_size[1]]
    shifted = sum(shift) > 0
    if shifted:
        x = x.roll((-shift[0], -shift[1]), (1, 2))
    windows = (ph // wh) * (pw // ww)
    n = wh * ww
    x = x.reshape(b, ph // wh, wh, pw // ww, ww, c).permute(0, 1, 3, 2, 4, 5).reshape(b * windows, n, c)
    d = c // num_heads
    qkv = F.linear(x, qkv_weight, qkv_bias).reshape(b * windows, n, 3, num_heads, d).permute(2, 0, 3, 1, 4)
    q, k, v = qkv[0], qkv[1], qkv[2]
    attn = q.mul(d ** -0.5).matmul(k.transpose(-2, -1))
    attn = attn + relative_position_bias if F.is_private(attn) else relative_position_bias + attn
    if shifted:
        mask = _shift_mask(ph, pw, window_size, shift).to(torch.float32)
        attn = attn.reshape(b, windows, num_heads, n, n).add(mask.unsqueeze(1).unsqueeze(0))
        attn = attn.reshape(b * windows, num_heads, n, n)
    attn = F.softmax(attn, -1)
    x = attn.matmul(v).transpose(1, 2).reshape(b * windows, n, c)
    x = F.linear(x, proj_weight, proj_bias)
    x = x.reshape(b, ph // wh, pw // ww, wh, ww, c).permute(0, 1, 3, 2, 4, 5).reshape(b, ph, pw, c)
    if shifted:
        x = x.roll((shift[0], shift[1]), (1, 2))
    if pad_r or pad_b:
        x = x[:, :h, :w, :]
    return x


def einsum(equation: str, *operands):
    """torch.einsum of two operands whose every index is a batch index (both operands and the
    output), a contracted one (both operands, not the output) or a free one (one operand and
    the output): one batched matmul between permutations (MaxViT's attention)."""
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if not F.is_private(*operands):
        return torch.einsum(equation, *operands)
    eq = equation.replace(" ", "")
    if "->" not in eq or "." in eq or len(operands) != 2:
        raise UnsupportedError(f"einsum {equation!r} on CrypTensors: only two operands with an explicit "
                               "output and no ellipsis are supported")
    lhs, out = eq.split("->")
    ia, ib = lhs.split(",")
    a, b = operands
    if len(set(ia)) != len(ia) or len(set(ib)) != len(ib) or any(i not in ia + ib for i in out):
        raise UnsupportedError(f"einsum {equation!r}: repeated or unknown indices")
    batch = [i for i in ia if i in ib and i in out]
    contract = [i for i in ia if i in ib and i not in out]
    free_a = [i for i in ia if i not in ib]
    free_b = [i for i in ib if i not in ia]
    if any(i not in out for i in free_a + free_b):
        raise UnsupportedError(f"einsum {equation!r}: summing over an index of one operand only")
    size = {i: n for i, n in [*zip(ia, a.shape), *zip(ib, b.shape)]}

    def prod(idx):
        n = 1
        for i in idx:
            n *= size[i]
        return n
    a = a.permute(*[ia.index(i) for i in batch + free_a + contract]).reshape(
        [size[i] for i in batch] + [prod(free_a), prod(contract)])
    b = b.permute(*[ib.index(i) for i in batch + contract + free_b]).reshape(
        [size[i] for i in batch] + [prod(contract), prod(free_b)])
    y = a.matmul(b).reshape([size[i] for i in batch + free_a + free_b])
    order = batch + free_a + free_b
    return y.permute(*[order.index(i) for i in out])


FUNCTIONS = {
    "torchvision.models.swin_transformer._patch_merging_pad": patch_merging_pad,
    "torchvision.models.swin_transformer._get_relative_position_bias": relative_position_bias,
    "torchvision.models.swin_transformer.shifted_window_attention": shifted_window_attention,
}
