"""Streamed openings (comm/streamed.py, issue 32): the values written straight into the frames,
the peer's chunks summed as they arrive, the caller's work on each summed range. The message on
the wire is the plain one (rounds, bytes and messages as an all_gather), a frame interoperates
with the plain path both ways, a peer whose message differs is refused once its message is in
(the stream stays usable), a wait has its deadline, and the caller's own error stays the
caller's. Two real GrpcCommunicators (gRPC servers and channels, plaintext loopback) in one
process, and products between two party processes (pool2)."""

from __future__ import annotations

import concurrent.futures
import ctypes

import pytest
import torch

from crypten_lite._proto import crypten_lite_pb2 as pb
from crypten_lite.comm import grpc_comm, streamed
from crypten_lite.config import Config
from crypten_lite.errors import CommunicationError
from crypten_lite.mpc.launcher import free_ports

PER = grpc_comm.CHUNK_BYTES // 8  # int64 elements per chunk


def _pair(timeout: float) -> list[grpc_comm.GrpcCommunicator]:
    ports = free_ports(2)
    parties = tuple(f"127.0.0.1:{p}" for p in ports)
    session = f"streamed-{ports[0]}"
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(grpc_comm.GrpcCommunicator,
                               Config(rank=r, world_size=2, session=session, timeout=timeout,
                                      parties=parties)) for r in range(2)]
        return [f.result(timeout=120) for f in futures]


def _values(rank: int, numel: int) -> torch.Tensor:
    return torch.arange(numel, dtype=torch.int64) * (7919 + rank) - (1 << 62) * rank


def _both(comms, fn):
    """fn(comm) on both parties at once; [result or exception] per rank."""
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = [pool.submit(fn, c) for c in comms]
        out = []
        for f in futures:
            try:
                out.append(f.result(timeout=120))
            except Exception as e:  # noqa: BLE001 - the test inspects it
                out.append(e)
        return out


def _filler(values: torch.Tensor):
    def fill(start, end, out):
        out.copy_(values[start:end])
    return fill


def test_a_streamed_sum_is_the_plain_sum_with_the_plain_counts_and_ranges_per_chunk():
    comms = _pair(timeout=120)
    numel = 2 * PER + 1234  # three chunks, the last one short
    try:
        def party(c):
            ranges: list[tuple[int, int]] = []
            c.reset_communication_stats()
            total = c.sum_streamed((numel,), b"t" * 16, _filler(_values(c.rank, numel)),
                                   on_range=lambda s, e, t: ranges.append((s, e)))
            return total, ranges, c.get_communication_stats()
        for total, ranges, stats in _both(comms, party):
            assert torch.equal(total, _values(0, numel) + _values(1, numel))
            assert ranges == [(0, PER), (PER, 2 * PER), (2 * PER, numel)]  # each chunk as it came
            assert (stats["rounds"], stats["bytes_sent"], stats["bytes_received"], stats["messages"]) == \
                (1, numel * 8, numel * 8, 1)
        # A small opening keeps the plain path (its latency): nothing sent, None.
        comms[0].reset_communication_stats()
        assert comms[0].sum_streamed((4,), b"", _filler(_values(0, 4))) is None
        assert comms[0].get_communication_stats()["rounds"] == 0
    finally:
        for c in comms:
            c.close()


def test_streamed_frames_and_plain_messages_interoperate_both_ways():
    comms = _pair(timeout=120)
    numel = PER + 5
    try:
        def party(c):
            mine = _values(c.rank, numel)
            for streaming in ((c.rank == 0), (c.rank == 1)):
                if streaming:
                    yield_ = c.sum_streamed((numel,), b"", _filler(mine))
                else:
                    got = c.exchange({1 - c.rank: mine}, [1 - c.rank])[1 - c.rank]
                    yield_ = got + mine
                assert torch.equal(yield_, _values(0, numel) + _values(1, numel))
            return True
        assert _both(comms, party) == [True, True]
    finally:
        for c in comms:
            c.close()


def test_a_message_that_differs_is_refused_after_it_is_in_and_the_stream_goes_on():
    comms = _pair(timeout=120)
    try:
        def party(c):
            numel = PER + 10 + c.rank  # party 1's program diverged
            try:
                c.sum_streamed((numel,), b"", _filler(_values(c.rank, numel)),
                               mismatch=lambda peer, shape, dtype, tag: ValueError(f"{peer} {shape} {dtype}"))
            except ValueError as e:
                refused = str(e)
            else:
                refused = ""
            # the whole message was taken: the next one is in step
            after = c.sum_streamed((PER,), b"", _filler(_values(c.rank, PER)))
            return refused, torch.equal(after, _values(0, PER) + _values(1, PER))
        (r0, ok0), (r1, ok1) = _both(comms, party)
        assert r0 == f"1 ({PER + 11},) int64" and r1 == f"0 ({PER + 10},) int64"
        assert ok0 and ok1
    finally:
        for c in comms:
            c.close()


def test_the_callers_error_stays_the_callers_and_the_peer_stays_well():
    comms = _pair(timeout=120)
    try:
        def party(c):
            def on_range(s, e, t):
                if c.rank == 1:
                    raise KeyError("caller's own")
            try:
                c.sum_streamed((2 * PER,), b"", _filler(_values(c.rank, 2 * PER)), on_range=on_range)
            except KeyError as e:
                first = repr(e)
            else:
                first = ""
            after = c.sum_streamed((PER,), b"", _filler(_values(c.rank, PER)))
            return first, c.mailbox.failure(1 - c.rank), torch.equal(after, _values(0, PER) + _values(1, PER))
        assert _both(comms, party) == [("", None, True), ("KeyError(\"caller's own\")", None, True)]
    finally:
        for c in comms:
            c.close()


def test_a_receive_inside_on_range_is_refused_not_a_hang():
    comms = _pair(timeout=120)
    try:
        def party(c):
            def on_range(s, e, t):
                c.recv(1 - c.rank)  # would wait for a message behind the opening's own chunks
            try:
                c.sum_streamed((PER,), b"", _filler(_values(c.rank, PER)), on_range=on_range)
            except CommunicationError as e:
                return "inside a streamed opening" in str(e)
            return False
        assert _both(comms, party) == [True, True]
    finally:
        for c in comms:
            c.close()


def test_a_streamed_wait_ends_at_its_deadline_and_at_a_goodbye():
    comms = _pair(timeout=1.0)
    try:
        with pytest.raises(CommunicationError, match="CRYPTEN_LITE_TIMEOUT") as err:
            comms[1].sum_streamed((PER,), b"", _filler(_values(1, PER)))  # party 0 sends nothing
        assert err.value.peer == 0 and comms[1].mailbox.failure(0)
    finally:
        for c in comms:
            c.close()
    comms = _pair(timeout=60)
    try:
        comms[0].close()
        # Either its send already fails (party 0's goodbye ended the subscription) or its wait
        # does at once: never the deadline (60 s).
        with pytest.raises(CommunicationError, match="closed its session|subscription to this party ended") as err:
            comms[1].sum_streamed((PER,), b"", _filler(_values(1, PER)))
        assert err.value.peer == 0
    finally:
        for c in comms:
            c.close()


def test_a_frame_with_room_is_a_plain_frame_with_its_payload_aligned():
    for numel in (1, 3, 8192, PER):
        header = pb.Frame(session="s" * (numel % 5), src=1, seq=numel, dtype="int64", shape=(numel,),
                          chunk=0, num_chunks=1, tag=b"t" * (numel % 17))
        frame, address = streamed.room_frame(header, numel * 8)
        assert address % 8 == 0
        values = _values(1, numel)
        ctypes.memmove(address, values.data_ptr(), numel * 8)
        parsed = pb.Frame.FromString(frame)  # the padding is an unknown field: kept aside
        parsed.DiscardUnknownFields()
        reference = pb.Frame()
        reference.CopyFrom(header)
        reference.data = values.numpy().tobytes()
        assert parsed == reference
        raw = grpc_comm._parse_frame(frame)
        assert (raw.seq, raw.shape, raw.tag) == (numel, (numel,), header.tag)
        assert torch.equal(streamed.int64_view(raw.data), values)
    # A payload that is not aligned (a peer framing otherwise) is copied, and read right.
    values = _values(0, 100)
    raw = memoryview(b"x" + values.numpy().tobytes())[1:]
    assert torch.equal(streamed.int64_view(raw), values)
    with pytest.raises(CommunicationError):
        streamed.int64_view(memoryview(b"123"))


def _products_across_chunks():
    import crypten_lite
    from crypten_lite import comm
    from crypten_lite.errors import ProtocolError
    from crypten_lite.mpc import beaver
    from crypten_lite.session import current
    g = torch.Generator().manual_seed(3)  # test data only, never shares
    out = []
    for numel in (8192, PER // 2, PER // 2 + 1, PER + 3):  # one chunk .. three (2 operands)
        a = torch.randint(-(1 << 20), 1 << 20, (numel,), generator=g)
        b = torch.randint(-(1 << 20), 1 << 20, (numel,), generator=g)
        x, y = crypten_lite.cryptensor(a, src=0), crypten_lite.cryptensor(b, src=1)
        c = comm.get()
        c.reset_communication_stats()
        z = x * y
        stats = c.get_communication_stats()
        out.append((torch.equal(z.get_plain_text(), a * b), stats["rounds"], stats["bytes_sent"],
                    stats["messages"]))
    # A diverged program: each party's ProtocolError names the other's shape; the session goes on.
    rank = current().rank
    share = torch.zeros(PER + rank, dtype=torch.int64)
    try:
        beaver.open_differences([(share, share)])
        diverged = ""
    except ProtocolError as e:
        diverged = str(e)
    after = crypten_lite.cryptensor(torch.ones(PER), src=0) * crypten_lite.cryptensor(torch.ones(PER), src=1)
    return out, diverged, float(after.get_plain_text().sum())


def test_products_across_chunk_boundaries_are_exact_with_their_counts(pool2):
    for rank, (products, diverged, after) in enumerate(pool2.run(_products_across_chunks)):
        for numel, (exact, rounds, sent, messages) in zip((8192, PER // 2, PER // 2 + 1, PER + 3), products):
            assert exact and (rounds, sent, messages) == (1, 16 * numel, 1)
        assert f"party {1 - rank} sent shape ({PER + 1 - rank},)" in diverged
        assert after == PER
