"""Streamed sums of two parties over gRPC: an opening computed chunk by chunk (issue 32).

`GrpcCommunicator.sum_streamed` (see `Communicator.sum_streamed`) is the all_gather of one
int64 tensor followed by its sum, for the two parties of a session, with the same message on
the wire (same frames, rounds, bytes and messages counted) but fewer passes over memory and
the computation overlapped with the wire:

- sending: each chunk's frame is allocated first (a bytes object whose payload is left
  uninitialised, `room_frame`) and the caller writes its values straight into that payload
  (`fill(start, end, out)`: for a product, the Beaver differences x - a, y - b). The frame is
  queued as soon as it is written, so chunk i is on the wire while chunk i + 1 is computed,
  and the copy-on-send copy disappears: the message is made in the frames themselves, never
  in a tensor the caller could change afterwards.
- receiving: each of the peer's chunks is summed with this party's own values of the same
  range straight from gRPC's buffer (`torch.add(mine, theirs, out=total)`) as it arrives,
  instead of being copied into an assembled message and summed in a second pass; the caller's
  `on_range(start, end, total)` then works on that range (for a product, the Beaver
  recombination) while the rest of the message is still on the wire.

A frame's payload starts at a multiple of 8 bytes of its bytes object (an unknown protobuf
field, number PAD_FIELD, pads the header: any protobuf parser skips it), so that the payload
can be viewed as int64 in place. A received payload that is not aligned (a peer that frames
otherwise) is copied first: correct either way. Whatever the peer sends is checked as any
frame is (grpc_comm._Inbox._accept); a peer whose message differs in shape, dtype or tag is
not summed, and the caller's `mismatch` error is raised once the whole message is in (as
primitives.check_agree does after an all_gather).

The bytes of a frame are written before the frame is shared with anything (queued), which is
what CPython's own C API allows of a bytes object made by PyBytes_FromStringAndSize(NULL, n).
"""

from __future__ import annotations

import ctypes
import threading
from typing import Callable

import numpy
import torch

from .._proto import crypten_lite_pb2 as pb
from ..errors import CommunicationError
from . import serde
from .communicator import tag_of

PAD_FIELD = 15  # unknown to the Frame message: padding, skipped by every parser
_PAD_TAG = (PAD_FIELD << 3) | 2
_DATA_TAG = (8 << 3) | 2  # Frame.data
# Openings of at least this many bytes stream; a smaller one (a reveal of a few elements)
# keeps the plain path and its latency.
STREAM_MIN_BYTES = 1 << 16

_new_bytes = ctypes.pythonapi.PyBytes_FromStringAndSize
_new_bytes.restype = ctypes.py_object
_new_bytes.argtypes = [ctypes.c_char_p, ctypes.c_ssize_t]


def _address(buffer) -> int:
    """Address of the first byte of a bytes object or memoryview (no copy)."""
    return numpy.frombuffer(buffer, dtype=numpy.uint8).ctypes.data if len(buffer) else 0


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | 0x80 if n else byte)
        if not n:
            return bytes(out)


def room_frame(header: pb.Frame, nbytes: int) -> tuple[bytes, int]:
    """A serialized Frame (`header`'s fields, then `nbytes` of data) whose data is left to
    write: (the frame's bytes, the address of its data), to be written before the frame is
    shared. The data starts at an 8-byte boundary of the object (the padding field)."""
    head = header.SerializeToString()
    length = _varint(nbytes)
    pad = -(len(head) + 2 + 1 + len(length)) % 8
    prefix = head + bytes((_PAD_TAG, pad)) + bytes(pad) + bytes((_DATA_TAG,)) + length
    frame = _new_bytes(None, len(prefix) + nbytes)
    base = _address(frame)
    ctypes.memmove(base, prefix, len(prefix))
    return frame, base + len(prefix)


def int64_view(data: memoryview) -> torch.Tensor:
    """The int64 values of a received payload: a view of gRPC's buffer where it is aligned
    (only read), else a copy."""
    if len(data) % 8:
        raise CommunicationError("a payload of int64 values has a length not a multiple of 8")
    if not len(data):
        return torch.empty(0, dtype=torch.int64)
    start = _address(data)
    if start % 8:
        return torch.frombuffer(bytearray(data), dtype=torch.int64)
    return torch.frombuffer((ctypes.c_char * len(data)).from_address(start), dtype=torch.int64)


def send_filled(outbox, session: str, src: int, shape: tuple[int, ...], tag: bytes,
                fill: Callable[[int, int, torch.Tensor], None], chunk_bytes: int) -> list[torch.Tensor]:
    """Queue one int64 message of `shape` to `outbox`'s peer, each chunk's values written by
    `fill(start, end, out)` straight into its frame; returns this party's values, one tensor
    per chunk (views of the frames, which nothing changes once queued)."""
    if outbox.failed:
        raise CommunicationError(f"party {src}: cannot send to party {outbox.peer} ({outbox.failed})",
                                 peer=outbox.peer)
    numel = 1
    for d in shape:
        numel *= d
    nbytes = numel * 8
    n = max(1, -(-nbytes // chunk_bytes))
    per = chunk_bytes // 8
    mine = []
    for i in range(n):
        start, end = i * per, min(numel, (i + 1) * per)
        header = pb.Frame(session=session, src=src, seq=outbox.seq, dtype="int64", shape=shape,
                          chunk=i, num_chunks=n, tag=tag)
        frame, start_address = room_frame(header, (end - start) * 8)
        if start_address % 8 == 0 and end > start:  # CPython's layout: the values go in place
            view = torch.frombuffer((ctypes.c_char * ((end - start) * 8)).from_address(start_address),
                                    dtype=torch.int64)
            fill(start, end, view)
        else:  # written beside, then copied in
            view = torch.empty(end - start, dtype=torch.int64)
            fill(start, end, view)
            ctypes.memmove(start_address, view.data_ptr(), (end - start) * 8)
        view._crypten_lite_frame = frame  # the frame lives as long as the view of it
        outbox.queue.put([frame])
        mine.append(view)
    outbox.seq += 1
    return mine


class SumSink:
    """Takes the chunks of the peer's message `seq` in place of the inbox's assembly: each is
    summed with this party's values of the same range into `total`, then `on_range` runs on
    it. Errors of `on_range` are kept for the caller (raised once the message is in), never
    taken for the peer's."""

    def __init__(self, seq: int, shape: tuple[int, ...], tag: bytes, mine: list[torch.Tensor],
                 total: torch.Tensor, on_range, chunk_bytes: int):
        self.seq = seq
        self.shape, self.tag = tuple(shape), tag
        self.mine, self.total, self.on_range = mine, total, on_range
        self.chunk_bytes = chunk_bytes
        self.done = False
        self.thread = threading.get_ident()  # the thread that reads into this sink
        self.mismatch: tuple | None = None  # (shape, dtype name, tag) of a message that differs
        self.error: BaseException | None = None

    def first(self, dtype: str, shape: tuple[int, ...], tag: bytes) -> None:
        """The message's header (its chunk 0): does it carry what this party opens?"""
        if dtype != "int64" or tuple(shape) != self.shape or tag != self.tag:
            self.mismatch = (tuple(shape), dtype, tag)

    def take(self, chunk: int, data: memoryview) -> None:
        """The peer's chunk `chunk` (validated by the inbox: in order, of the right size)."""
        if self.mismatch is None and self.error is None:
            self.take_tensor(chunk, int64_view(data))

    def whole(self, tensor: torch.Tensor) -> None:
        """The peer's message arrived whole, through the mailbox (it was read before the sink
        was set): sum it all at once."""
        self.first(serde.NAMES.get(tensor.dtype, str(tensor.dtype)), tuple(tensor.shape),
                   tag_of(tensor))
        flat = tensor.reshape(-1)
        per = self.chunk_bytes // 8
        for i in range(len(self.mine)):
            self.take_tensor(i, flat[i * per:(i + 1) * per])
        self.done = True

    def take_tensor(self, chunk: int, theirs: torch.Tensor) -> None:
        """take() of a chunk already viewed as int64 values."""
        if self.mismatch is not None or self.error is not None:
            return
        start = chunk * (self.chunk_bytes // 8)
        end = start + theirs.numel()
        torch.add(self.mine[chunk], theirs, out=self.total[start:end])
        if self.on_range is not None:
            try:
                self.on_range(start, end, self.total)
            except BaseException as e:
                self.error = e
