"""Streamed prefetch (comm/dealer_prefetch.py): chunking, single delivery, bounded pulls, and
the same corrections as one unchunked answer; the dealer's shortcuts (rank 0's corrected
components never drawn, weight masks cached) give the same corrections as the plain math."""

from __future__ import annotations

import os

import pytest
import torch

from crypten_lite._proto import crypten_lite_pb2 as pb
from crypten_lite.comm.dealer_prefetch import ChunkPuller, PreparedBatch, chunk_counts
from crypten_lite.comm.dealer_rpc import Request, tensor_from_proto, tensor_to_proto
from crypten_lite.errors import ProtocolError
from crypten_lite.provider import DealerHandler, correlations


def test_chunk_counts_cut_whole_requests_in_order():
    assert chunk_counts([], 10) == []
    assert chunk_counts([4, 4, 4, 4], 10) == [2, 2]
    assert chunk_counts([4, 30, 4], 10) == [1, 1, 1]  # a large request alone
    assert chunk_counts([0, 0, 10, 0], 10) == [4]
    sizes = [3, 7, 1, 9, 2, 2, 2, 8, 5]
    counts = chunk_counts(sizes, 10)
    assert sum(counts) == len(sizes) and all(n > 0 for n in counts)
    i = 0
    for n in counts:
        assert n == 1 or sum(sizes[i:i + n]) <= 10
        i += n


KEYS = {0: os.urandom(32), 1: os.urandom(32)}


def _requests(start: int = 100) -> list[Request]:
    specs = [("triple", "matmul", ((3, 4), (4, 5)), ()), ("square", "", ((7,),), ()),
             ("trunc", "", ((6,),), (16,)), ("bit", "", ((5,),), ()),
             ("weight_mask", "", ((4, 2),), ()), ("binary_triple", "", ((3,),), ()),
             ("bit_mul", "", ((4, 1), (4, 3)), ()), ("trunc_exact", "", ((2,),), (12,)),
             ("binary_monomials", "", ((3,),), correlations.monomial_params([-1, 0, 1], [3, 5, 7]))]
    out = [Request(kind, start + i, op, shapes, params) for i, (kind, op, shapes, params) in enumerate(specs)]
    mask = out[4].counter
    out += [Request("weight_triple", start + len(out) + j, "matmul", ((2, 3, 4), (4, 2)), (mask,))
            for j in range(3)]
    return out


def _reply(handler, requests) -> pb.CorrelationReply:
    tensors, counts = [], []
    for r in requests:
        answer = handler(KEYS, r)
        counts.append(len(answer))
        tensors.extend(tensor_to_proto(t) for t in answer)
    return pb.CorrelationReply(tensors=tensors, counts=counts)


def _decode(reply) -> list[list[torch.Tensor]]:
    tensors = [tensor_from_proto(t, 1 << 30) for t in reply.tensors]
    out, i = [], 0
    for n in reply.counts:
        out.append(tensors[i:i + n])
        i += n
    return out


def _sizes(requests) -> list[int]:
    return [correlations.check_request(r.kind, r.op, r.shapes, r.params, 2, 1 << 30) for r in requests]


def _streamed(requests, chunk_bytes: int, budget: int, ahead: int, order=None):
    """Answers through PreparedBatch (the dealer) and ChunkPuller (rank 0); the pulls made."""
    handler = DealerHandler()
    sizes = _sizes(requests)
    batch = PreparedBatch(requests[0].counter, requests, chunk_counts(sizes, chunk_bytes), sizes,
                          lambda chunk: _reply(handler, chunk))
    batch.compute_ahead(budget)
    pulls: list[int] = []

    def pull(chunk: int):
        pulls.append(chunk)
        reply = batch.take(chunk)
        return lambda: _decode(reply)
    puller = ChunkPuller(batch.counts, pull, ahead)
    puller.start()
    order = range(len(requests)) if order is None else order
    return {i: puller.answer(i) for i in order}, pulls, batch, puller


@pytest.mark.parametrize("chunk_bytes,budget,ahead", [(1 << 30, 1 << 30, 4), (64, 1 << 30, 1),
                                                      (200, 300, 2), (1, 0, 3)])
def test_streamed_answers_equal_the_unchunked_answer(chunk_bytes, budget, ahead):
    requests = _requests()
    whole = _decode(_reply(DealerHandler(), requests))
    got, pulls, batch, _ = _streamed(requests, chunk_bytes, budget, ahead)
    assert sorted(pulls) == list(range(len(batch.counts)))  # every chunk pulled exactly once
    for i, answer in enumerate(whole):
        assert len(got[i]) == len(answer) == correlations.correction_count(requests[i].kind, requests[i].params)
        assert all(torch.equal(a, b) for a, b in zip(got[i], answer))


def test_each_chunk_and_each_answer_is_delivered_once():
    requests = _requests()
    _, _, batch, puller = _streamed(requests, 64, 1 << 30, 2)
    with pytest.raises(ProtocolError, match="already delivered"):
        batch.take(0)
    with pytest.raises(ProtocolError, match="does not exist"):
        batch.take(len(batch.counts))
    with pytest.raises(ProtocolError, match="already handed out"):
        puller.answer(0)
    assert batch.held == 0 and puller.held() == 0


def test_pulls_stay_a_bounded_number_of_chunks_ahead():
    requests = _requests()
    handler = DealerHandler()
    sizes = _sizes(requests)
    counts = chunk_counts(sizes, 1)  # one request per chunk
    batch = PreparedBatch(requests[0].counter, requests, counts, sizes, lambda c: _reply(handler, c))
    pulls: list[int] = []

    def pull(chunk):
        pulls.append(chunk)
        reply = batch.take(chunk)
        return lambda: _decode(reply)
    puller = ChunkPuller(counts, pull, ahead=2)
    puller.start()
    assert pulls == [0, 1]
    for i in range(len(requests)):
        puller.answer(i)
        assert max(pulls) <= i + 2 and puller.held() <= 2
    # answers taken out of order: still each once and all correct
    requests2 = _requests(start=500)
    order = list(reversed(range(len(requests2))))
    got, pulls2, _, _ = _streamed(requests2, 1, 1 << 30, 2, order)
    whole = _decode(_reply(DealerHandler(), requests2))
    assert all(torch.equal(a, b) for i in order for a, b in zip(got[i], whole[i]))


def test_chunk_0_comes_with_the_prepare_reply_and_is_never_pulled():
    """The offline phase is one exchange with the dealer: Prepare's reply carries chunk 0
    (dealer_rpc: PrepareReply.first); the puller pulls only the later chunks, each once."""
    requests = _requests()
    handler = DealerHandler()
    sizes = _sizes(requests)
    counts = chunk_counts(sizes, 64)
    assert len(counts) > 2
    batch = PreparedBatch(requests[0].counter, requests, counts, sizes, lambda c: _reply(handler, c))
    batch.compute_ahead(1 << 30)
    first = _decode(batch.take(0))  # what the dealer's Prepare hands out
    pulls: list[int] = []

    def pull(chunk):
        pulls.append(chunk)
        reply = batch.take(chunk)
        return lambda: _decode(reply)
    puller = ChunkPuller(counts, pull, ahead=2, first=first)
    puller.start()
    assert pulls == [1]  # the start waits for no pull: chunk 0 is at hand
    got = [puller.answer(i) for i in range(len(requests))]
    assert pulls == list(range(1, len(counts)))
    whole = _decode(_reply(DealerHandler(), requests))
    assert all(torch.equal(a, b) for g, w in zip(got, whole) for a, b in zip(g, w))
    with pytest.raises(ProtocolError, match="already delivered"):  # a pull of chunk 0 is refused
        batch.take(0)


def test_a_closed_puller_refuses_clearly():
    _, _, _, puller = _streamed(_requests(), 64, 1 << 30, 1, order=[0])
    puller.close()
    with pytest.raises(ProtocolError, match="dropped"):
        puller.answer(1)


def test_cached_weight_masks_and_skipped_components_give_the_plain_corrections():
    """The dealer's shortcuts against the definition: rank 0's corrections make every
    party's components (rank 0's corrected ones replaced) satisfy the correlation."""
    requests = _requests()
    handler = DealerHandler(mask_cache_bytes=1 << 20)
    for r in requests:
        fixes = handler(KEYS, r)
        plain = correlations.corrections(KEYS, r.counter, r.kind, r.op, r.shapes, r.params)
        assert all(torch.equal(a, b) for a, b in zip(fixes, plain)) and len(fixes) == len(plain)
        if r.kind not in ("triple", "weight_triple", "square", "trunc", "bit", "binary_triple"):
            continue
        parts = [correlations.derive(KEYS[k], r.counter, r.kind, r.op, r.shapes, r.params) for k in (0, 1)]
        parts[0][len(parts[0]) - len(fixes):] = fixes
        total = [p0 + p1 for p0, p1 in zip(*parts)]
        xor = [p0 ^ p1 for p0, p1 in zip(*parts)]
        if r.kind == "triple":
            assert torch.equal(total[2], total[0] @ total[1])
        elif r.kind == "weight_triple":
            b = correlations.weight_mask_of(KEYS, r.params[0], r.shapes[1])
            assert torch.equal(total[1], total[0] @ b)
        elif r.kind == "square":
            assert torch.equal(total[1], total[0] * total[0])
        elif r.kind == "trunc":
            assert torch.equal(total[1], correlations.logical_shift(total[0], r.params[0]))
            assert torch.equal(total[2], correlations.logical_shift(total[0], 63))
        elif r.kind == "bit":
            assert torch.equal(total[1], xor[0]) and bool(((xor[0] == 0) | (xor[0] == 1)).all())
        else:
            assert torch.equal(xor[2], xor[0] & xor[1])
    assert len(handler._masks) == 1  # one weight: its B derived once


def test_first_chunks_grow_from_a_few_requests():
    """Prepare's chunks (issue 32): chunk k holds at most first * 2**k requests, and at most
    chunk_bytes of answers (a larger request alone), in order."""
    assert chunk_counts([1] * 36, 1 << 30, 4) == [4, 8, 16, 8]
    assert chunk_counts([1] * 3, 1 << 30, 4) == [3]
    assert chunk_counts([], 1 << 30, 4) == []
    assert chunk_counts([4] * 10, 10, 4) == [2, 2, 2, 2, 2]   # the byte limit still cuts
    assert chunk_counts([1, 1, 1, 30, 1, 1], 10, 2) == [2, 1, 1, 2]
    assert chunk_counts([1] * 36, 1 << 30) == [36]             # no request limit by default


def test_prepare_computes_chunk_0_only_and_the_rest_when_pulled():
    """The dealer answers Prepare after chunk 0 (the plan's first FIRST_CHUNK_REQUESTS
    requests); every later chunk is computed when rank 0 pulls it (while the parties run),
    each once, and the answers are those of one unchunked reply."""
    import threading

    from crypten_lite.comm import dealer_prefetch
    from crypten_lite.comm.dealer_rpc import DealerServer
    from crypten_lite.config import Config

    requests = _requests() + _requests(start=112)[:9]  # 21 requests, masks before their triples
    handler = DealerHandler()
    computed: list[int] = []

    class Dealer:  # DealerServer.prepare's collaborators, without a gRPC server
        config = Config(world_size=2)
        cond = threading.Condition()
        prepared = None

        def answer(self, keys, chunk):
            computed.extend(r.counter for r in chunk)
            return _reply(handler, chunk)
    dealer = Dealer()
    sizes = _sizes(requests)
    batch = DealerServer.prepare(dealer, KEYS, requests, sizes)
    first = dealer_prefetch.FIRST_CHUNK_REQUESTS
    assert batch.counts == chunk_counts(sizes, dealer_prefetch.CHUNK_BYTES, first) == [first, 2 * first, 9]
    assert computed == [r.counter for r in requests[:first]] and dealer.prepared is batch
    got = _decode(batch.take(0))
    got += _decode(batch.take(1))
    assert computed == [r.counter for r in requests[:3 * first]]  # chunk 1 computed by its pull
    got += _decode(batch.take(2))
    assert computed == [r.counter for r in requests] and batch.held == 0
    whole = _decode(_reply(DealerHandler(), requests))
    assert len(got) == len(whole)
    assert all(torch.equal(a, b) for g, w in zip(got, whole) for a, b in zip(g, w))
    with pytest.raises(ProtocolError, match="already delivered"):
        batch.take(1)
