"""Frames of the party stream (comm/grpc_comm.py): built with one copy of the payload, parsed
without a protobuf copy of a large one; small frames go through protobuf whole. Either way the
wire is a plain protobuf Frame, and parsing gives back every field and the payload exactly."""

from __future__ import annotations

import pytest
import torch
from google.protobuf.message import DecodeError

from crypten_lite._proto import crypten_lite_pb2 as pb
from crypten_lite.comm import grpc_comm, serde


@pytest.mark.parametrize("numel", [0, 1, 4, grpc_comm.SMALL_FRAME_BYTES // 16, grpc_comm.SMALL_FRAME_BYTES // 16 + 1,
                                   grpc_comm.SMALL_FRAME_BYTES // 8, grpc_comm.SMALL_FRAME_BYTES // 8 + 1, 50_000])
def test_frames_round_trip_on_both_sides_of_the_small_frame_limit(numel):
    tensor = torch.arange(numel, dtype=torch.int64) * 7919 - 3
    dtype, shape, data = serde.to_bytes(tensor)

    def header():
        return pb.Frame(session="s", src=1, seq=42, dtype=dtype, shape=shape, chunk=0, num_chunks=1, tag=b"t" * 16)
    raw = grpc_comm._frame_bytes(header(), data)
    reference = header()
    reference.data = bytes(data)
    assert pb.Frame.FromString(raw) == reference  # a plain protobuf Frame on the wire
    frame = grpc_comm._parse_frame(raw)
    assert (frame.session, frame.src, frame.seq, frame.dtype, frame.shape, frame.chunk, frame.num_chunks,
            frame.tag) == ("s", 1, 42, dtype, tuple(shape), 0, 1, b"t" * 16)
    assert torch.equal(serde.from_bytes(frame.dtype, frame.shape, frame.data), tensor)


def test_a_truncated_frame_is_refused_on_both_paths():
    for numel in (4, 50_000):
        dtype, shape, data = serde.to_bytes(torch.ones(numel, dtype=torch.int64))
        raw = grpc_comm._frame_bytes(pb.Frame(session="s", src=1, seq=1, dtype=dtype, shape=shape), data)
        with pytest.raises((ValueError, DecodeError)):
            grpc_comm._parse_frame(raw[:-3])
