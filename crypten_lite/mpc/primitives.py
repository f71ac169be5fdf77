"""Sharing, opening and zero-sharing of int64 ring tensors (additive shares mod 2^64).

1. share(x, src): every party draws a pseudo-random zero-sharing z_i (PRZS, pairwise seeds);
   `src` adds its encoded value. No traffic beyond the shape announcement.
2. open(shares): one round; every party sends its share to every other and sums. Before
   summing, every receiver checks that each sender's share has its own shape and dtype
   (carried by the message header, no extra byte), else ProtocolError naming both.
3. open_many: several independent openings in ONE message (one round). The message travels
   flat, with a digest of every value's full shape (any rank) in its header
   (comm.communicator.shape_tag: no extra byte of payload, no extra round), which every
   receiver compares with its own.
"""

from __future__ import annotations

import math

import torch

from ..comm import serde
from ..comm.communicator import shape_tag, tag_of, with_tag
from ..errors import ProtocolError
from ..random import zero_share
from ..session import current

# Tensors of more dimensions than a message header holds (comm.serde.MAX_DIMS) travel flat.
MAX_WIRE_DIMS = 16


def przs(shape) -> torch.Tensor:
    """This party's share of a pseudo-random sharing of zero."""
    s = current()
    return zero_share(s.pair_prgs, s.rank, tuple(shape))


def share(encoded: torch.Tensor | None, src: int, shape) -> torch.Tensor:
    """This party's share of `encoded` (held by `src`; None elsewhere)."""
    s = current()
    out = przs(shape)
    if s.rank == src:
        out += encoded
    return out


def open_many(shares: list[torch.Tensor], dst: int | None = None) -> list[torch.Tensor] | None:
    """Reveal several shared tensors in one round (to all, or only to `dst`).

    Every receiver first checks that each sender's share has its own shape and dtype (from the
    message header; no extra byte), else raises ProtocolError naming both (`check_agree`).
    One tensor travels in its own shape; several (or one of more dimensions than a header
    holds) travel as one flat vector. Either way the message's header carries a digest of
    every value's full shape, compared by every receiver (check_agree).
    """
    if len(shares) == 1 and shares[0].dim() <= MAX_WIRE_DIMS:
        flat = shares[0]
    else:
        flat = torch.cat([t.reshape(-1) for t in shares]) if len(shares) > 1 else shares[0].reshape(-1)
    # torch.cat made a fresh tensor: the sum may go into it.
    return _open_flat(flat, [t.shape for t in shares], dst, owned=len(shares) > 1)


def open_differences(pairs: list[tuple[torch.Tensor, torch.Tensor]],
                     dst: int | None = None, on_range=None) -> list[torch.Tensor] | None:
    """open_many([x - m for x, m in pairs]) (same message, same round and bytes) with each
    difference written straight into the one outgoing message and the sum made in place in
    it: no temporary per difference, no concatenation, no copy of the received shares.

    Opened to every party by a transport that streams (Communicator.sum_streamed: two gRPC
    parties, a large message), the differences are written straight into the message's frames
    and each range of the opened values is summed as its chunk arrives. `on_range(start, end,
    total)` (where the values are opened) is called on each range of the flat concatenation
    of the opened values `total` once it is summed, every element exactly once, before this
    returns: while the rest is still on the wire where the transport streams, else once for
    the whole."""
    shapes = [x.shape if x.shape == m.shape else torch.broadcast_shapes(x.shape, m.shape)
              for x, m in pairs]
    if dst is None:
        opened = _open_streamed(pairs, shapes, on_range)
        if opened is not None:
            return opened
    if len(pairs) == 1 and len(shapes[0]) <= MAX_WIRE_DIMS:
        x, m = pairs[0]
        return _open_flat(torch.sub(x, m), shapes, dst, owned=True, on_range=on_range)
    flat = torch.empty(sum(math.prod(s) for s in shapes), dtype=torch.result_type(*pairs[0]))
    offset = 0
    for (x, m), shape in zip(pairs, shapes):
        n = math.prod(shape)
        torch.sub(x, m, out=flat[offset:offset + n].view(shape))
        offset += n
    return _open_flat(flat, shapes, dst, owned=True, on_range=on_range)


def _open_streamed(pairs, shapes: list, on_range) -> list[torch.Tensor] | None:
    """open_differences to every party through Communicator.sum_streamed; None (nothing sent)
    where the transport does not stream or an operand is not a contiguous int64 tensor of
    the difference's own shape."""
    flats = []
    for (x, m), shape in zip(pairs, shapes):
        if (x.shape != shape or m.shape != shape or x.dtype != torch.int64 or m.dtype != torch.int64
                or not x.is_contiguous() or not m.is_contiguous()):
            return None
        flats.append((x.reshape(-1), m.reshape(-1)))
    offsets = [0]
    for x, _ in flats:
        offsets.append(offsets[-1] + x.numel())
    one = len(pairs) == 1 and len(shapes[0]) <= MAX_WIRE_DIMS
    wire_shape = tuple(shapes[0]) if one else (offsets[-1],)
    tag = shape_tag(shapes)

    def fill(start: int, end: int, out: torch.Tensor) -> None:
        for (x, m), offset in zip(flats, offsets):
            lo, hi = max(start, offset), min(end, offset + x.numel())
            if lo < hi:
                torch.sub(x[lo - offset:hi - offset], m[lo - offset:hi - offset],
                          out=out[lo - start:hi - start])

    def mismatch(peer: int, shape: tuple, dtype: str, their_tag: bytes) -> Exception:
        # check_agree's own error, from stand-ins of the two messages (no memory: expanded)
        mine = with_tag(torch.empty((), dtype=torch.int64).expand(wire_shape), tag)
        theirs = with_tag(torch.empty((), dtype=serde.DTYPES[dtype]).expand(shape), their_tag)
        try:
            check_agree(mine, [mine, theirs] if peer else [theirs, mine],
                        "reveal" if len(shapes) == 1 else f"opening of {len(shapes)} values")
        except ProtocolError as e:
            return e
        return ProtocolError(f"party {current().rank}: party {peer}'s message differs from this "
                             "party's (the parties' programs diverged)")

    total = current().comm.sum_streamed(wire_shape, tag, fill, on_range, mismatch)
    if total is None:
        return None
    if one:
        return [total]
    flat = total.view(-1)
    return [flat[offsets[i]:offsets[i + 1]].view(shape) for i, shape in enumerate(shapes)]


def _open_flat(flat: torch.Tensor, shapes: list, dst: int | None, owned: bool,
               on_range=None) -> list[torch.Tensor] | None:
    """Open `flat` (the values of `shapes`, one after the other, or one value in its own
    shape); `owned`: flat is this call's own fresh tensor, so the sum is made in it;
    `on_range(0, n, total)` is called on the opened flat total (open_differences)."""
    comm = current().comm
    rank = current().rank
    mine = flat
    flat = with_tag(flat, shape_tag(shapes))
    if dst is None:
        parts = comm.all_gather(flat)
    else:
        parts = comm.gather(flat, dst)
        if parts is None:
            return None
    check_agree(flat, parts, "reveal" if len(shapes) == 1 else f"opening of {len(shapes)} values")
    others = [p for r, p in enumerate(parts) if r != rank]
    if owned:
        total = mine
    elif others:
        # A received share is this party's own fresh tensor (every transport delivers a
        # copy): the sum goes into it (detach: a tensor object without the message's tag).
        total, others = others[0].detach(), others[1:]
        total += parts[rank]
    else:
        total = mine.clone()
    for p in others:
        total += p
    if on_range is not None:
        on_range(0, total.numel(), total.view(-1))
    if len(shapes) == 1 and flat.shape == shapes[0]:
        return [total]
    out, offset = [], 0
    for shape in shapes:
        n = math.prod(shape)
        out.append(total[offset:offset + n].view(shape))
        offset += n
    return out


def open_(share_: torch.Tensor, dst: int | None = None) -> torch.Tensor | None:
    """Reveal one shared tensor (one round)."""
    got = open_many([share_], dst)
    return None if got is None else got[0]


def open_xor(share_: torch.Tensor) -> torch.Tensor:
    """Reveal a binary (xor) shared tensor to every party (one round)."""
    share_ = with_tag(share_, shape_tag([share_.shape]))
    parts = current().comm.all_gather(share_)
    check_agree(share_, parts, "reveal")
    total = parts[0].clone()
    for p in parts[1:]:
        total ^= p
    return total


def check_agree(mine: torch.Tensor, parts: list[torch.Tensor], what: str) -> None:
    """Raise ProtocolError unless every party's part has this party's shape and dtype.

    A party whose program diverged (another shape, a reshape the others did not do) would
    otherwise make the sum silent garbage or a raw broadcasting error. Every receiving party
    sees each sender's shape in what it received, and the digest of the full shapes of what
    a flat message carries (its tag, comm.communicator.shape_tag), so every receiver raises.
    """
    rank = current().rank
    for r, part in enumerate(parts):
        if r != rank and (part.shape != mine.shape or part.dtype != mine.dtype):
            raise ProtocolError(
                f"party {rank}: {what} of a share of shape {tuple(mine.shape)} ({mine.dtype}) here, "
                f"but party {r} sent shape {tuple(part.shape)} ({part.dtype}); every party must "
                "reveal the same tensor (the parties' programs diverged: check shapes and inputs)")
        if r != rank and tag_of(part) != tag_of(mine):
            raise ProtocolError(
                f"party {rank}: {what} of {mine.numel()} values here, but party {r}'s message "
                "says they have other shapes (the digest of the full shapes in its header "
                f"differs{'' if tag_of(part) else ': it sent none'}); every party must reveal "
                "the same tensors (the parties' programs diverged: check shapes and inputs)")


DTYPE_CODES = {torch.float32: 0, torch.float64: 1, torch.int64: 2, torch.bool: 3, torch.float16: 4,
               torch.bfloat16: 5, torch.int32: 6, torch.int16: 7, torch.int8: 8, torch.uint8: 9}
CODES_DTYPE = {v: k for k, v in DTYPE_CODES.items()}


# Dtype code of an announcement by which the source refuses its own input (out of range):
# same length as a normal one, so refusing costs no extra byte and every party learns of it.
REFUSED = -1
# Most dimensions an announced shape may have (torch's own limit for most operations).
MAX_ANNOUNCED_DIMS = 64


def share_bytes(shape) -> int:
    """Bytes of this party's share of a tensor of `shape` (8 per element and component:
    one component under the additive protocol, two under rss)."""
    components = 2 if current().config.protocol == "rss" else 1
    return math.prod(shape) * 8 * components


def check_share_size(shape, src: int, what: str = "input") -> None:
    """ProtocolError unless a share of `shape` fits the session's limit (max_message_bytes),
    checked BEFORE anything of that size is allocated: a peer's few-byte announcement must
    not make this party allocate more than a message of the session may hold."""
    s = current()
    limit = s.config.max_message_bytes
    if not all(isinstance(d, int) and 0 <= d <= limit for d in shape) or share_bytes(shape) > limit:
        raise ProtocolError(
            f"party {s.rank}: party {src} announced a{'n' if what[0] in 'aeiou' else ''} {what} of shape "
            f"{tuple(shape)[:MAX_WIRE_DIMS]}, whose share would take more than the session's limit of "
            f"{limit} bytes (CRYPTEN_LITE_MAX_MESSAGE_BYTES); refused before allocating it: raise "
            "the limit on every party if the input is meant to be that large")


def announce(tensor: torch.Tensor | None, src: int, refuse: str = "") -> tuple[tuple[int, ...], torch.dtype]:
    """`src` tells every party the shape and dtype of its input (a one-way message).

    Every other party checks what it passed (if anything) against the announcement, so that
    a shape mismatch at sharing time is a clear error on every party. `refuse` (at `src`): why
    its input cannot be shared (e.g. outside the supported range, found while it is still
    plaintext); the announcement then says so, and every party raises ProtocolError: `src`
    with `refuse`, the others naming `src` (no value leaves `src`).
    """
    s = current()
    if not 0 <= src < s.world_size:
        raise ProtocolError(f"src={src} is out of range: ranks are 0..{s.world_size - 1}")
    if s.rank == src:
        if tensor is None:
            # refused through the announcement, so the others do not wait for it
            refuse = f"party {src} is the source but passed no tensor to share"
            header = torch.tensor([REFUSED, 0], dtype=torch.int64)
        else:
            if not refuse and share_bytes(tensor.shape) > s.config.max_message_bytes:
                refuse = (f"an input of shape {tuple(tensor.shape)} takes more than the session's "
                          f"limit of {s.config.max_message_bytes} bytes per share "
                          "(CRYPTEN_LITE_MAX_MESSAGE_BYTES); raise it on every party")
            code = REFUSED if refuse else DTYPE_CODES.get(tensor.dtype, 0)
            header = torch.tensor([code, tensor.dim(), *tensor.shape], dtype=torch.int64)
    else:
        header = None
    # A one-way message of public metadata, not a protocol round (nobody answers it).
    header = s.comm.broadcast(header, src, rounds=0)
    if (header.dtype != torch.int64 or header.dim() != 1 or not 2 <= header.numel() <= 2 + MAX_ANNOUNCED_DIMS
            or header.numel() != 2 + max(0, int(header[1]))
            or int(header[0]) not in CODES_DTYPE and int(header[0]) != REFUSED):
        raise ProtocolError(f"party {s.rank}: party {src} sent a malformed shape announcement "
                            f"({header.dtype}, {header.numel()} values); its program diverged")
    if int(header[0]) == REFUSED:
        if s.rank == src:
            raise ProtocolError(f"party {src}: {refuse}")
        raise ProtocolError(f"party {s.rank}: party {src} refused to share its input (outside the "
                            f"supported range, too large, or no tensor passed; party {src}'s "
                            "error says which)")
    shape = tuple(int(v) for v in header[2:2 + int(header[1])])
    dtype = CODES_DTYPE[int(header[0])]
    # Before anything of the announced size is allocated (the shares below, a PRZS draw).
    check_share_size(shape, src)
    if tensor is not None and s.rank != src and tuple(tensor.shape) != shape:
        # The source goes on and draws its share of the zero sharing: draw ours too, so that
        # this party's PRZS stream stays in step with the others' after the error.
        przs(shape)
        raise ProtocolError(f"party {s.rank} passed shape {tuple(tensor.shape)} but the source "
                            f"party {src} shares shape {shape}; pass None or the same shape")
    return shape, dtype
