"""Linear ops with a public index or layout: scatter, index_select, index_add, take, unfold,
trace, ger, conv_transpose1d.

Every op here is local (0 rounds, 0 bytes): it rearranges or adds shares by a PUBLIC index,
which is what CrypTen supports too. A CrypTensor index raises UnsupportedError: a private
index needs an oblivious selection (one-hot products), which the caller can build from
`eq` and a product explicitly (x * (idx == arange)).sum(dim).
"""

from __future__ import annotations

import torch

from ..cryptensor import CrypTensor, _record
from ..errors import UnsupportedError
from ._common import as_private, public_share


def public_index(index, op: str) -> torch.Tensor:
    """`index` as an int64 torch tensor; a CrypTensor or a float index is refused."""
    if isinstance(index, CrypTensor):
        raise UnsupportedError(
            f"{op}: the index is a CrypTensor; only public indices are supported. Reveal the "
            "index, or select obliviously with a one-hot product: (x * onehot).sum(dim)")
    t = torch.as_tensor(index)
    if t.is_floating_point() or t.is_complex():
        raise UnsupportedError(f"{op}: the index must be an integer tensor, got {t.dtype}")
    return t.long()


def _dim(x: CrypTensor, dim) -> int:
    d = x._dim(dim)
    n = max(1, x.dim())
    if not -n <= d < n:
        raise IndexError(f"dimension {dim} out of range for a CrypTensor of shape {tuple(x.shape)}")
    return d % n


def _src_share(x: CrypTensor, src) -> torch.Tensor:
    """src at x's scale: a CrypTensor's share, or a public tensor / number as a share."""
    if isinstance(src, CrypTensor):
        return src._rescaled(x.precision, x.dtype)
    from .. import encoding
    return public_share(encoding.encode(torch.as_tensor(src), x.precision))


def _operands(x, src):
    """(x, src) with x private (a public x takes src's scale)."""
    if not isinstance(x, CrypTensor):
        x = as_private(torch.as_tensor(x), src)
    return x, src


# --------------------------------------------------------------------------- scatter
def scatter(x, dim, index, src) -> CrypTensor:
    """x with x[..., index[i], ...] = src[i] along `dim` (torch.Tensor.scatter semantics);
    src is a CrypTensor, a public tensor or a number. Local (0 rounds)."""
    x, src = _operands(x, src)
    d, idx = _dim(x, dim), public_index(index, "scatter")
    s = _src_share(x, src)
    if s.dim() == 0:  # a number: its share, spread over the index (no scalar read of a share)
        s = s.expand(idx.shape)
    share = x.share.scatter(d, idx, s)
    out = x._new(share, names=x._names)
    return _record(out, "scatter", (x, src), dim=d, index=idx)


def scatter_add(x, dim, index, src) -> CrypTensor:
    """x with src[i] added at x[..., index[i], ...] along `dim` (duplicates accumulate)."""
    x, src = _operands(x, src)
    d, idx = _dim(x, dim), public_index(index, "scatter_add")
    s = _src_share(x, src)
    if s.dim() == 0:
        s = s.expand(idx.shape)
    out = x._new(x.share.scatter_add(d, idx, s), names=x._names)
    return _record(out, "scatter_add", (x, src), dim=d, index=idx)


def index_select(x: CrypTensor, dim, index) -> CrypTensor:
    """The slices of x along `dim` at the (1-D, public) `index`, like torch.index_select."""
    d, idx = _dim(x, dim), public_index(index, "index_select")
    out = x._new(x.share.index_select(d, idx.reshape(-1)) if idx.dim() else
                 x.share.index_select(d, idx.reshape(1)), names=x._names)
    return _record(out, "index_select", (x,), dim=d, index=idx.reshape(-1),
                   input_shape=tuple(x.shape))


def index_add(x, dim, index, source, alpha=1) -> CrypTensor:
    """x with alpha * source[i] added to the slice index[i] along `dim` (torch.index_add)."""
    if alpha != 1:
        source = source.mul(alpha) if isinstance(source, CrypTensor) else torch.as_tensor(source) * alpha
    x, source = _operands(x, source)
    d, idx = _dim(x, dim), public_index(index, "index_add")
    s = _src_share(x, source)
    out = x._new(x.share.index_add(d, idx.reshape(-1), s), names=x._names)
    return _record(out, "index_add", (x, source), dim=d, index=idx.reshape(-1))


def take(x: CrypTensor, index, dimension=None) -> CrypTensor:
    """torch.take (x flattened, result of index's shape); with `dimension` (CrypTen's
    extension, ONNX gather): x indexed by `index` along that dimension."""
    idx = public_index(index, "take")
    if dimension is not None and x.dim() > 0:
        d = _dim(x, dimension)
        return x[(slice(None),) * d + (idx,)]
    n = x.numel()
    if idx.numel() and not bool(((idx >= -n) & (idx < n)).all()):
        raise IndexError(f"take: index out of range for a CrypTensor with {n} elements")
    flat = idx % max(n, 1)
    out = x._new(x.share.reshape(-1)[flat], names=None)
    return _record(out, "take", (x,), index=flat, input_shape=tuple(x.shape))


def unfold(x: CrypTensor, dimension, size: int, step: int) -> CrypTensor:
    """All slices of length `size` along `dimension`, `step` apart (torch.Tensor.unfold)."""
    d = _dim(x, dimension)
    out = x._new(x.share.unfold(d, size, step), names=None)
    return _record(out, "unfold", (x,), dim=d, size=size, step=step)


def trace(x: CrypTensor) -> CrypTensor:
    """Sum of the main diagonal of a 2-D CrypTensor."""
    if x.dim() != 2:
        raise UnsupportedError(f"trace expects a 2-D CrypTensor, got shape {tuple(x.shape)}")
    out = x._new(x.share.diagonal().sum(), names=None)
    if x.dtype == torch.bool:
        out.dtype = torch.int64
    return _record(out, "trace", (x,))


def ger(x: CrypTensor, y) -> CrypTensor:
    """Outer product of two 1-D tensors (one Beaver round if both are private)."""
    ydim = y.dim() if isinstance(y, CrypTensor) else torch.as_tensor(y).dim()
    if x.dim() != 1 or ydim != 1:
        raise UnsupportedError(f"ger/outer expects two 1-D tensors, got {x.dim()}-D and {ydim}-D")
    return x.outer(y)


def _one(v) -> int:
    return int(v[0]) if isinstance(v, (tuple, list)) else int(v)


def conv_transpose1d(x: CrypTensor, weight, bias=None, stride=1, padding=0, output_padding=0,
                     groups: int = 1, dilation=1) -> CrypTensor:
    """1-D transposed convolution (torch.nn.functional.conv_transpose1d) as a 2-D one over a
    height of 1: one Beaver round when x and weight are both private, local otherwise."""
    w = weight.unsqueeze(2) if isinstance(weight, CrypTensor) else torch.as_tensor(weight).unsqueeze(2)
    out = x.unsqueeze(2).conv_transpose2d(
        w, None, (1, _one(stride)), (0, _one(padding)), (0, _one(output_padding)), groups,
        (1, _one(dilation))).squeeze(2)
    if bias is None:
        return out
    return out.add(bias.reshape(-1, 1) if isinstance(bias, CrypTensor) else
                   torch.as_tensor(bias).reshape(-1, 1))


def __imatmul__(x: CrypTensor, other) -> CrypTensor:
    """x @= other: a new tensor (like torch and CrypTen, not in place)."""
    return x.matmul(other)
