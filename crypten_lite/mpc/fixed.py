"""Beaver products with a fixed secret weight: W - B opened once per loaded model.

A model's weight W (a Linear or convolution weight of an encrypted crypten_lite.nn model)
is the same secret at every call. With fresh triples each call opens x - A AND W - B, and
W - B is as large as the weight (768 x 768 for one BERT-base projection: 4.7 MB per party).
Here, per weight (and per layout: a Linear's W^T is its own entry):

1. Once: one ``weight_mask`` correlation gives every party its share of a uniform B (no
   dealer correction; the dealer only records the request's counter: the weight's id), and
   D = W - B is opened, in the same round as the first call's E.
2. Each call: a ``weight_triple`` (A_k, C_k = op(A_k, B)) under its own counter, naming the
   mask counter; open only E_k = x_k - A_k;
   [op(x, W)] = [C_k] + op(E_k, [B]) + op([A_k], D) + op(E_k, D)  (public term on rank 0).
   Since [B] + D = [W] up to a resharing (party i's share of D is w_i - b_i), each party
   computes the same sum from its weight share instead: z_i = C_k,i + op(E_k, w_i) +
   op(A_k,i, D) (one product fewer on rank 0, and B is dropped once D is opened).

Security (the argument in full: provider/correlations.py, ``weight_triple``): D is a
one-time pad of W opened once, each E_k a one-time pad of x_k with a fresh A_k, C_k's shares
fresh: the parties' view is uniform and independent of W and every x_k. A weight whose
shares change (training, load_state_dict, an in-place update) gets a NEW mask before its
next product: the cache keeps the share tensor it masked and that tensor's version counter
(torch bumps it at every in-place change; every party runs the same program, so they decide
alike), never opening W' - B with an old B. Memory: D per weight layout (one more copy of
the weight's shares; B only until D is opened). A weight used as itself and transposed (GPT-2's
tied token embedding, one_hot @ W, and LM head, x @ W^T) keeps ONE mask: once W's own layout
is masked, x @ W^T is the weight_triple of op "linear" (C_k = A_k B^T) under that mask, with
W's share and D (every provider serves "linear"; 309 MB fewer per party for GPT-2 small).

Only under the additive protocol with 2+ parties and a provider (the dealer or TFP).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ..provider.correlations import TRIPLE_OPS
from ..session import current
from .offline import own_mapping
from .primitives import open_many


@dataclass
class _Mask:
    source: torch.Tensor      # the owner's share tensor this mask was drawn for
    version: int              # and its version counter then (in-place changes bump it)
    counter: int              # the weight_mask request's counter: the weight's id
    shape: tuple[int, ...]    # the weight layout's shape
    b: torch.Tensor | None    # this party's share of B, until D is opened
    d: torch.Tensor | None    # W - B once opened


def enabled() -> bool:
    s = current()
    return (getattr(s.config, "protocol", "additive") == "additive" and s.world_size >= 2
            and getattr(s, "provider", None) is not None)


def _mask_for(owner, key: str, w: torch.Tensor) -> _Mask:
    """The mask of `owner`'s weight in layout `key`; a new one whenever the owner's shares
    were replaced or changed in place since (every party decides alike: same program)."""
    cache = owner.__dict__.setdefault("_fixed_masks", {})
    m = cache.get(key)
    src = owner.share
    if (m is not None and m.source is src and m.version == src._version
            and m.shape == tuple(w.shape)):
        return m
    provider = current().provider
    corr = provider.get("weight_mask", [tuple(w.shape)])
    # Rank 0 waits for the dealer's (empty) answer: the dealer answers a weight_triple only
    # for a mask it has answered, and separate requests may reach it in any order.
    corr.corrected()
    m = _Mask(src, src._version, provider.counter - 1, tuple(w.shape), corr[0], None)
    cache[key] = m
    return m


# A transposed layout reuses its weight's mask (the "linear" product) when True; tests turn it
# off to compare against a second mask of the transposed layout.
SHARE_TRANSPOSED_MASK = True


def _base_layout(op: str, w: torch.Tensor, owner, key: str) -> torch.Tensor | None:
    """The weight's own (untransposed) share when `w` is its transpose (layout "t") and
    that own layout already has a mask with D opened, as GPT-2's tied LM head after the token
    embedding: op(x, W^T) is then the "linear" product of x and W under W's mask, and no second
    mask (and no second D, as large as the weight) is drawn. None otherwise."""
    if not SHARE_TRANSPOSED_MASK or op != "matmul" or key != "t" or w.dim() != 2:  # "t": .t()
        return None
    m = owner.__dict__.get("_fixed_masks", {}).get("")
    if m is None or m.d is None:
        return None
    src = owner.share
    if m.source is not src or m.version != src._version or src.dim() != 2 or \
            m.shape != tuple(src.shape) or tuple(w.shape) != tuple(src.shape[::-1]):
        return None
    return src


def product(op: str, x: torch.Tensor, w: torch.Tensor, params: Sequence[int], owner,
            key: str = "") -> torch.Tensor:
    """Shares of op(x, w) for the fixed weight share `w` of `owner` (a CrypTensor whose
    weight it is; `key` names the layout, e.g. "t" for a Linear's transposed weight)."""
    s = current()
    base = _base_layout(op, w, owner, key)
    if base is not None:  # the weight's own layout is masked already: its mask serves W^T too
        op, w, key = "linear", base, key[:-1]
    fn = TRIPLE_OPS[op]
    m = _mask_for(owner, key, w)
    triple = s.provider.get("weight_triple", [tuple(x.shape), tuple(w.shape)], op,
                            (m.counter, *params))
    a = triple[0]
    if m.d is None:
        e, d = open_many([x - a, w - m.b])
        # D kept in its own storage: a view would keep the whole opened message (E too) alive
        # as long as the model (BERT-base: 107 MB more per party)
        # (a mapping of its own: offline.own_mapping says why)
        m.d, m.b = own_mapping(d), None  # from now on [W] stands for [B] + D (module docstring, step 2)
        del d
    else:
        (e,) = open_many([x - a])
    c = triple.corrected()[1]
    return c + fn(e, w, params) + fn(a, m.d, params)
