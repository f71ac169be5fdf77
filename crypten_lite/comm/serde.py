"""Tensor <-> raw bytes with an explicit dtype name and shape (symmetric helpers, no pickle).

Only the dtypes in DTYPES travel; anything else, or a length that does not match the
shape, is refused with a CommunicationError.
"""

from __future__ import annotations

import math

import torch

from ..errors import CommunicationError

DTYPES: dict[str, torch.dtype] = {
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
    "float64": torch.float64,
    "float32": torch.float32,
}
NAMES = {v: k for k, v in DTYPES.items()}
ITEM_BYTES = {k: torch.empty(0, dtype=v).element_size() for k, v in DTYPES.items()}
MAX_DIMS = 16


def to_bytes(tensor: torch.Tensor) -> tuple[str, tuple[int, ...], memoryview]:
    """(dtype name, shape, little-endian bytes) of a CPU tensor."""
    if tensor.dtype not in NAMES:
        raise CommunicationError(f"cannot send tensors of dtype {tensor.dtype}")
    t = tensor
    if t.requires_grad or not t.is_contiguous() or not t.is_cpu:
        t = t.detach().contiguous().cpu()  # a plain contiguous CPU tensor (the usual) is used as is
    data = memoryview(t.numpy()).cast("B") if t.numel() else memoryview(b"")
    return NAMES[t.dtype], tuple(t.shape), data


def check_header(dtype: str, shape: tuple[int, ...], max_bytes: int) -> int:
    """Validate a received header; returns the expected payload length in bytes."""
    if dtype not in DTYPES:
        raise CommunicationError(f"unknown dtype {dtype!r} in message")
    if len(shape) > MAX_DIMS or (shape and min(shape) < 0):
        raise CommunicationError(f"invalid shape {tuple(shape)} in message")
    nbytes = math.prod(shape) * ITEM_BYTES[dtype]
    if nbytes > max_bytes:
        raise CommunicationError(f"message of {nbytes} bytes exceeds the limit of {max_bytes}")
    return nbytes


def from_bytes(dtype: str, shape: tuple[int, ...], data: bytes | bytearray) -> torch.Tensor:
    """Tensor from a validated header and its payload (one copy at most)."""
    nbytes = check_header(dtype, shape, len(data))
    if nbytes != len(data):
        raise CommunicationError(f"payload of {len(data)} bytes does not match shape {tuple(shape)}")
    if nbytes == 0:
        return torch.zeros(shape, dtype=DTYPES[dtype])
    buffer = data if isinstance(data, bytearray) else bytearray(data)
    flat = torch.frombuffer(buffer, dtype=DTYPES[dtype])
    # a 1-D shape is the flat tensor already (nbytes matched it): view(shape) alone costs
    # more than the rest of a small message's conversion (torch's argument parsing)
    return flat if len(shape) == 1 else flat.view(shape)


class PayloadBuffer:
    """The receiving buffer of one message sent in chunks: `data`, a writable memoryview of
    its bytes (uninitialised: the chunks fill every byte), then `tensor()` of it, no copy."""

    def __init__(self, nbytes: int):
        self._storage = torch.empty(nbytes, dtype=torch.uint8)
        self.data = memoryview(self._storage.numpy()).cast("B")

    def tensor(self, dtype: str, shape: tuple[int, ...]) -> torch.Tensor:
        """The received tensor (header validated by check_header, every byte written)."""
        nbytes = check_header(dtype, shape, len(self.data))
        if nbytes != len(self.data):
            raise CommunicationError(f"payload of {len(self.data)} bytes does not match shape {tuple(shape)}")
        self.data.release()
        return self._storage.view(DTYPES[dtype]).view(shape)


def payload_buffer(nbytes: int) -> PayloadBuffer:
    """A buffer of `nbytes` for a message that arrives in chunks (see PayloadBuffer)."""
    return PayloadBuffer(nbytes)
