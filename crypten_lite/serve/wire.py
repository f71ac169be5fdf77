"""Validation of one client's share message, before anything is allocated.

A request carries the input's shape (batch first), the encoding's precision, the dtype name
"ring64" and its components (one for additive sharing, the replicated pair under rss), each
`numel * 8` little-endian int64 bytes. Every size is checked against the model's sample shape
and the service's limits before a tensor is made; a bad request gets a ServeError naming
what is wrong and what to send instead, and nothing else is touched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from .errors import ServeError

DTYPE = "ring64"
REQUEST_ID_BYTES = 16


@dataclass
class Shares:
    """One validated request's share at this party."""

    request_id: bytes
    shape: tuple[int, ...]
    components: list[torch.Tensor]  # int64, `shape`
    timeout_s: float


def validate(msg, sample_shape: tuple[int, ...], precision: int, n_components: int,
             max_batch: int, default_timeout: float, max_timeout: float) -> Shares:
    """The shares of `msg` (a PredictRequest) as tensors, or ServeError("invalid"/"too_large")."""
    rid = bytes(msg.request_id)
    if len(rid) != REQUEST_ID_BYTES:
        raise ServeError("invalid", f"request_id must be {REQUEST_ID_BYTES} random bytes, got "
                                    f"{len(rid)}")
    shape = tuple(int(d) for d in msg.shape)
    want = "(n, " + ", ".join(map(str, sample_shape)) + ")"
    if len(shape) != len(sample_shape) + 1 or shape[1:] != tuple(sample_shape):
        raise ServeError("invalid", f"input shape {shape} does not fit the model: send {want} "
                                    f"with 1 <= n <= {max_batch}")
    if not 1 <= shape[0] <= max_batch:
        raise ServeError("too_large", f"batch of {shape[0]} samples: send 1 to {max_batch} "
                                      f"samples per request (shape {want})")
    if msg.dtype != DTYPE:
        raise ServeError("invalid", f"dtype {msg.dtype!r} is not served: encode the input in "
                                    f"fixed point and send {DTYPE!r} shares (int64 words)")
    if msg.precision != precision:
        raise ServeError("invalid", f"precision {msg.precision} differs from the service's "
                                    f"{precision} fractional bits: encode with precision {precision}")
    if len(msg.components) != n_components:
        raise ServeError("invalid", f"{len(msg.components)} share components sent; this "
                                    f"party takes {n_components} (1 additive, 2 replicated)")
    numel = math.prod(shape)
    components = []
    for i, data in enumerate(msg.components):
        if len(data) != numel * 8:
            raise ServeError("invalid", f"share component {i} has {len(data)} bytes; shape "
                                        f"{shape} needs {numel * 8} (truncated or wrong shape)")
        words = np.frombuffer(data, dtype="<i8").reshape(shape)
        components.append(torch.from_numpy(words.astype(np.int64, copy=True)))
    timeout = msg.timeout_ms / 1000.0 if msg.timeout_ms else default_timeout
    return Shares(rid, shape, components, min(timeout, max_timeout))


def to_bytes(share: torch.Tensor) -> bytes:
    """int64 words of `share`, little-endian, row-major."""
    return share.contiguous().numpy().astype("<i8", copy=False).tobytes()
