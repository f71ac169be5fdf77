"""Dropout with public masks: dropout, feature_dropout (dropout1d/2d/3d).

Masks come from a PRG whose seed all parties agree on by a coin toss (each party
contributes 32 fresh bytes, one all-gather per session, seed = HKDF of the concatenation):
the mask is *public*. It is independent of every private value, so making it public reveals
nothing about the data or the model; it makes dropout a local multiplication (0 rounds, no
Beaver triple) and its backward the same multiplication. A secret mask would need shared
random bits and comparisons for an arbitrary p and would buy no privacy in the semi-honest
model.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..cryptensor import CrypTensor
from ..errors import UnsupportedError

_COMMON: list = [None, None]  # [session, PRG] of the session-wide public PRG


def common_prg():
    """A PRG whose seed every party knows (coin toss, one all-gather per session).

    For public randomness that no private value depends on (dropout masks); never for
    shares or Beaver masks.
    """
    from ..random import PRG, derive_key, fresh_seed
    from ..session import current

    s = current()
    if _COMMON[0] is not s:
        mine = torch.frombuffer(bytearray(fresh_seed()), dtype=torch.int64).clone()
        parts = s.comm.all_gather(mine)
        joint = b"".join(p.contiguous().numpy().tobytes() for p in parts)
        _COMMON[0], _COMMON[1] = s, PRG(derive_key(joint, "crypten_lite/v1/common-public-prg"))
    return _COMMON[1]


def dropout_mask(shape, p: float) -> torch.Tensor:
    """Public keep-mask scaled by 1/(1-p), identical on every party."""
    words = common_prg().draw(tuple(shape))
    uniform = ((words >> 11) & ((1 << 53) - 1)).double() / float(1 << 53)
    return (uniform >= p).double() / (1.0 - p)


def _apply(x, p: float, training: bool, inplace: bool, mask_shape, plain):
    if p < 0 or p > 1:
        raise UnsupportedError(f"dropout probability must be in [0, 1], got {p}")
    if not training or p == 0:
        return x
    private = isinstance(x, CrypTensor)
    if p == 1:
        out = x.mul(0.0) if private else x * 0.0
    else:
        from ..session import is_initialized
        if not private and not is_initialized():
            return plain(x)  # plain torch, outside any MPC session
        mask = dropout_mask(mask_shape(tuple(x.shape)), p)
        out = x.mul(mask) if private else x * mask.to(x.dtype)
    if inplace and private:
        return x._inplace(out)
    return out


def dropout(x, p: float = 0.5, training: bool = True, inplace: bool = False):
    """Zero each element with probability p, scale the others by 1/(1-p); 0 rounds."""
    return _apply(x, p, training, inplace, lambda shape: shape,
                  lambda t: F.dropout(t, p, True))


def _feature_shape(shape: tuple, batched: bool) -> tuple:
    """Mask shape of channel-wise dropout: one draw per (sample,) channel."""
    keep = 2 if batched else 1
    return shape[:keep] + (1,) * (len(shape) - keep)


def feature_dropout(x, p: float = 0.5, training: bool = True, inplace: bool = False):
    """Zero whole channels (dim 1 of an (N, C, ...) input) with probability p; 0 rounds."""
    if x.dim() < 2:
        raise UnsupportedError(f"feature_dropout expects an (N, C, ...) input, got shape {tuple(x.shape)}")
    return _apply(x, p, training, inplace, lambda shape: _feature_shape(shape, True),
                  lambda t: torch.feature_dropout(t, p, True))


def _channel_dropout(name: str, batched_dim: int):
    """dropout1d/2d/3d: (N, C, *spatial) or, one dim fewer, an unbatched (C, *spatial)."""
    def fn(x, p: float = 0.5, training: bool = True, inplace: bool = False):
        d = x.dim()
        if d not in (batched_dim - 1, batched_dim):
            raise UnsupportedError(f"{name} expects a {batched_dim - 1}-D or {batched_dim}-D input, "
                                   f"got shape {tuple(x.shape)}")
        # torch treats a 3-D input to dropout2d as batched (N, C, L); we follow it.
        batched = d == batched_dim or name == "dropout2d"
        plain = getattr(F, name)
        return _apply(x, p, training, inplace, lambda shape: _feature_shape(shape, batched),
                      lambda t: plain(t, p, True))
    fn.__name__ = name
    fn.__doc__ = (f"Channel-wise dropout like torch.nn.functional.{name} (public mask, one draw "
                  "per channel; 0 rounds).")
    return fn


dropout1d = _channel_dropout("dropout1d", 3)
dropout2d = _channel_dropout("dropout2d", 4)
dropout3d = _channel_dropout("dropout3d", 5)
