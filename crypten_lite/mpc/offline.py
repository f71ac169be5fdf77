"""Offline phase: fetch a program's correlated randomness before its inputs exist.

    with crypten_lite.mpc.offline.record() as plan:      # run the program once
        model(x)
    crypten_lite.mpc.offline.prefetch(plan)             # offline: one dealer round trip
    model(x2)                                           # online: no dealer latency

The plan is the public list of correlation requests (kinds, ops, shapes, parameters) a run
makes; it depends on the model and the input shapes, not on any value. Rank 0 asks the
dealer for all the corrections of the next run in one batch; other parties derive theirs
from their seeds as always.

Like every crypten_lite call, `prefetch` is collective: every party calls it with the same
plan at the same point of the program (it checks that, in one small all-gather of the plan's
digest, offline). Each party then knows which counters the plan covers.

A run that differs from the plan (another program, or the same model on another batch size:
a last batch of 100 after a plan recorded at 2048 has other shapes and, where large
elementwise requests are split into chunks, another number of requests) is safe and correct:
at the first request that differs from the plan, every party skips the rest of the prefetched
counters and continues after them, fetching each correction as usual. A counter is never
requested twice: the dealer answers each counter once and would refuse a second request
(which, for a different request at the same counter, could otherwise help rank 0 solve for
another party's masks). Unused prefetched corrections are dropped; they reveal nothing alone.
The provider's `stats["diverged"]` counts such skips, and the first divergent request is
logged (INFO) with its kind, op and shapes.

A model's first forward is such another program: it draws each fixed weight's mask once
(mpc.fixed: `weight_mask`, D = W - B opened in its first round), which later forwards of the
same model do not. A plan recorded on it holds for a fresh copy of the model (the bench
rebuilds its model for every run) but leaves every later forward of the same model at its
first request. `draws_weight_masks(plan)` tells; record a later forward to plan those (the
service does: crypten_lite.serve.server).
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import os
import threading
from typing import Iterator

import torch

from ..errors import ConfigError, CryptenLiteError, ProtocolError
from ..provider.store import STORE_ENV
from ..session import current


@contextlib.contextmanager
def record() -> Iterator[list]:
    """Record the correlation requests made inside the block; the list is filled at exit.
    Under protocol "rss" (no dealer) the plan lists the truncation pairs the block uses."""
    if current().config.protocol == "rss":
        from . import rss
        with rss.record() as plan:
            yield plan
        return
    provider = current().provider
    plan: list = []
    provider.start_recording()
    try:
        yield plan
    finally:
        plan.extend(provider.stop_recording())


def draws_weight_masks(plan: list) -> bool:
    """Whether the recorded run drew fixed-weight masks (a model's first forward does): its
    plan then differs from every later forward of the same model (see the module's text)."""
    return any(entry[0] == "weight_mask" for entry in plan)


def prefetch(plan: list, wait: bool = True, store: str | None = None,
             key_file: str | None = None) -> None:
    """Fetch the corrections of the next run of `plan` now (collective: every party calls it
    with the same plan; rank 0 asks the dealer, the others note the planned counters).

    Provider "pairwise" with `store` (else CRYPTEN_LITE_OFFLINE_STORE; "" for none): take the
    plan's correlations from each party's offline store (made by `make_store`; used once)
    instead of making them; a missing, used, tampered or mismatched store is an error on both
    parties.

    Raises ProtocolError if the parties' plans or counters differ (one all-gather of a
    32-byte digest, offline)."""
    _release_free_heap()
    s = current()
    store = os.environ.get(STORE_ENV, "") if store is None else store
    if store:
        provider = _pairwise(s, "prefetch")
        _refuse_session_masks(plan, "prefetch")
        error, store_id = None, ""
        try:
            store_id = provider.load_store(plan, store, key_file)
        except (CryptenLiteError, OSError, ValueError) as e:
            error = _store_error(s, store, e)
        try:
            _agree(s, "prefetch", store_id, error)
        except CryptenLiteError:
            provider.drop_store()
            raise
        _check_plans(s, provider)
        return
    if s.config.protocol == "rss":
        # No dealer: the parties make the plan's truncation pairs themselves, now.
        from . import rss
        rss.prefetch(plan)
        return
    provider = s.provider
    from ..provider import Provider
    if type(provider).prefetch is Provider.prefetch:
        # The base prefetch sends nothing to the other parties: this party's digest leaves as
        # soon as its plan is set, and the others' are read after it has derived its seeded
        # components, so that the check waits for no party's derivation (one round, as an
        # all-gather: the same messages, split around the derivation).
        provider.prefetch(plan, announce=lambda digest: _announce_plan(s, digest))
        _check_plans(s, provider, announced=True)
    else:  # a provider whose prefetch exchanges messages of its own (pairwise)
        provider.prefetch(plan)
        _check_plans(s, provider)
    if wait:
        provider.wait_prefetched()


def _digest_tensor(digest: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(digest), dtype=torch.int64).clone()


def _announce_plan(s, digest: bytes) -> None:
    """Send this party's plan digest to every other party (the sending half of the check's
    all-gather: one round, 32 bytes to each)."""
    s.comm.exchange({p: _digest_tensor(digest) for p in s.comm.peers()}, [])


def _check_plans(s, provider, announced: bool = False) -> None:
    """Raise ProtocolError on every party if the parties' plans (or counters) differ: an
    all-gather of the plan digests, or (`announced`: this party's was sent already by
    _announce_plan) the receiving half of it."""
    mine = _digest_tensor(provider.plan_digest())
    if announced:
        got = s.comm.exchange({}, s.comm.peers(), rounds=0)
        got[s.rank] = mine
        digests = [got[r] for r in range(s.world_size)]
    else:
        digests = s.comm.all_gather(mine)
    differ = [r for r, d in enumerate(digests) if not torch.equal(d, mine)]
    if differ:
        raise ProtocolError(f"offline.prefetch: party {s.rank}'s plan (or request counter) "
                            f"differs from that of parties {differ}; every party must record "
                            "the same program and call prefetch with its plan at the same point")


def make_store(plan: list, store: str, key_file: str | None = None) -> str:
    """Provider "pairwise": make the correlations of the next run of `plan` now and keep them
    on each party's own disk (directory `store`, '{rank}' replaced by the rank), encrypted
    and authenticated under the party's key file (`key_file`, else CRYPTEN_LITE_OFFLINE_KEY;
    created with mode 0600), for a later session's `prefetch(plan, store=...)` (or
    CRYPTEN_LITE_OFFLINE_STORE=DIR). Collective. Returns the store id both parties agree on.
    None of the stored correlations is used in this session. See provider/store.py."""
    s = current()
    provider = _pairwise(s, "make_store")
    _refuse_session_masks(plan, "make_store")
    prefetch(plan, store="")
    error, store_id = None, ""
    try:
        store_id = provider.save_store(plan, store, key_file)["store_id"]
    except (CryptenLiteError, OSError, ValueError) as e:   # tell the peer before raising
        error = _store_error(s, store, e)
    _agree(s, "make_store", store_id, error)
    return store_id


def _refuse_session_masks(plan: list, what: str) -> None:
    """An offline store outlives its session, so its plan may not hold a fixed-weight product
    whose weight mask was drawn before the recording (a weight_triple naming the mask by its
    counter, not by its plan position): that triple is C = A B for the making session's B,
    and a later session masks its weights afresh, so stored it would give wrong results. Every
    party holds the same plan (prefetch checks it), so every party refuses it alike."""
    bound = sum(1 for entry in plan if entry[0] == "weight_triple" and entry[3] and entry[3][0] >= 0)
    if bound:
        raise ConfigError(
            f"offline.{what}: the plan holds {bound} fixed-weight products whose weight masks "
            "were drawn before the recording (a later forward of an already masked model); a "
            "later session masks its weights afresh, so stored correlations for them would be "
            "wrong. To store a model's inference, record the FIRST forward of a freshly loaded "
            "model (its plan draws the masks too), make_store that plan, and in the later "
            "session prefetch it from the store before the model's first forward "
            "(docs/protocols.md, \"Offline stores\")")


def _pairwise(s, what: str):
    provider = s.provider
    if s.config.protocol == "rss" or not hasattr(provider, "load_store"):
        raise ConfigError(f"offline.{what}: an offline store holds the pairwise provider's "
                          f"correlations; this session's provider is {provider.name!r} (with "
                          "the dealer, prefetch at the start of the run instead)")
    return provider


def _store_error(s, store: str, e: Exception) -> CryptenLiteError:
    if isinstance(e, CryptenLiteError):
        return e
    return ConfigError(f"party {s.rank}: offline store {store!r}: {type(e).__name__}: {e}; check "
                       "the directory and key file paths and their permissions")


def _agree(s, what: str, store_id: str, error: Exception | None) -> None:
    """All-gather (ok, store id digest); raise on every party if any failed or ids differ."""
    digest = hashlib.sha256(store_id.encode()).digest() if error is None else bytes(32)
    mine = torch.frombuffer(bytearray(bytes([error is None]) + bytes(7) + digest),
                            dtype=torch.int64).clone()
    gathered = s.comm.all_gather(mine)
    if error is not None:
        raise error
    failed = [r for r, g in enumerate(gathered) if int(g[0]) == 0]
    if failed:
        verb = "write" if what == "make_store" else "use"
        raise ProtocolError(f"offline.{what}: party {s.rank}: party {failed} could not {verb} its "
                            "offline store (its own error says why); this party's store, if any, "
                            "is no longer usable: make a new pair of stores with offline.make_store")
    if any(not torch.equal(g, mine) for g in gathered):
        raise ProtocolError(f"offline.{what}: party {s.rank}: the parties' offline stores have "
                            "different store ids (made in different sessions or for other "
                            "plans); both stores were consumed: make a new pair with "
                            "offline.make_store and give each party its own one")


# glibc mallopt parameters, and the values a party process fixes (tune_malloc).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_ARENA_MAX = -1, -3, -8
# Blocks from this size up are mapped on their own and unmapped when freed (glibc's largest
# dynamic value): a model's big tensors go back to the OS as soon as they are freed.
MMAP_THRESHOLD_BYTES = 32 << 20
# Free memory at the top of a heap that malloc keeps instead of handing back at each free.
TRIM_THRESHOLD_BYTES = 128 << 20
_malloc_tuned = False


def tune_malloc() -> None:
    """Fix glibc's trim and mmap thresholds for this party process (once; a no-op elsewhere).

    glibc adapts both by itself: the trim threshold becomes twice the largest block freed
    so far (at most 64 MiB), so a product of 10^6 elements, whose temporaries (the opening
    message, the received shares, the result: about 40 MB) are freed together at its end,
    handed its pages back to the OS at every product and faulted them in again, page by
    page, in the next one (about 10,000 minor faults per product, a fifth of its CPU time).
    Fixed values keep up to TRIM_THRESHOLD_BYTES of free heap for the next operation and map
    blocks of MMAP_THRESHOLD_BYTES and up on their own, as glibc's own maximum does. Where
    glibc's environment variables set either (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_),
    they are kept.

    Threads started from here on share the main heap (M_ARENA_MAX 1, unless MALLOC_ARENA_MAX
    is set): the thread that receives a peer's message allocates the tensor it assembles it
    in, and in a thread's own arena that memory was faulted in again at almost every product
    of 10^6 elements (about 4,000 minor faults, 16 MB, a tenth of the product's CPU time;
    benchmarks/profile_mul_stages.py counts them per thread). Call it before the transport
    starts its threads (the launcher does)."""
    global _malloc_tuned
    if _malloc_tuned:
        return
    _malloc_tuned = True
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    # glibc's own environment settings (MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_) win
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
    if "MALLOC_TRIM_THRESHOLD_" not in os.environ:
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    if "MALLOC_ARENA_MAX" not in os.environ:
        mallopt(_M_ARENA_MAX, 1)


def _release_free_heap() -> None:
    """Hand the heap pages malloc keeps after frees back to the OS (glibc's malloc_trim; a
    no-op elsewhere) when they exceed KEEP_FREE_HEAP_BYTES. Loading a model (conversion,
    sharing, the first masked products) otherwise leaves hundreds of MB resident, on top of
    what the run needs.

    Large blocks keep glibc's own placement (mapped on their own until blocks of a size
    have been freed, then reused from the heap): forcing every block from 1 MiB up to be
    mapped on its own (mallopt M_MMAP_THRESHOLD) made each large temporary a fresh mapping
    whose pages fault in one by one on first touch, and cost a 10^6-element rss product a
    fifth of its time, to save about 30 MB of a BERT-base run's 3.9 GB peak memory."""
    try:
        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return
    tune_malloc()
    free = _free_heap_bytes(libc)
    if free is not None and free <= KEEP_FREE_HEAP_BYTES:
        return
    trim(0)


# Free heap a prefetch leaves to malloc, for the run to reuse: handing it back too would make
# the run's first touch of each page a fault (a prefetched 10^6-element product faulted in about
# 100 MB again, a third of its CPU time). Above it (a model's load), the free heap goes back.
KEEP_FREE_HEAP_BYTES = 256 << 20


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                     "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]


def _free_heap_bytes(libc) -> int | None:
    """Bytes of free heap malloc holds (glibc 2.33+'s mallinfo2), or None where unknown."""
    try:
        info = libc.mallinfo2
    except AttributeError:
        return None
    info.restype = _MallInfo2
    return int(info().fordblks)


# Tensors from this size up that a party keeps for a model's life (weight shares, fixed masks'
# D) get a mapping of their own (own_mapping).
OWN_MAPPING_BYTES = 1 << 20


def own_mapping(t: torch.Tensor) -> torch.Tensor:
    """A copy of `t` in an anonymous memory mapping of its own, for a tensor kept as long as
    the model (same shape, dtype and values; contiguous; never sharing t's storage). Below
    OWN_MAPPING_BYTES, or off the CPU, a plain copy.

    A BERT-base weight (768 x 768 or 768 x 3072 int64: 4.7-19 MB) is below glibc's mmap
    threshold (MMAP_THRESHOLD_BYTES), so the weights' shares and masks sat in the heap between
    the blocks that loading freed; every operation's temporaries then reused those holes all
    over the heap, whose pages stayed resident (malloc gives back only the heap's top). In
    mappings of their own the weights leave the heap to the temporaries, whose free space
    gathers at its top and goes back to the OS."""
    import mmap

    nbytes = t.numel() * t.element_size()
    if nbytes < OWN_MAPPING_BYTES or t.device.type != "cpu" or type(t) is not torch.Tensor:
        return t.clone(memory_format=torch.contiguous_format)
    buf = mmap.mmap(-1, nbytes)
    out = torch.frombuffer(buf, dtype=t.dtype, count=t.numel()).view(t.shape)
    out.copy_(t)
    return out


# Resident memory a model's forward may gain between two operations before the free heap
# pages are handed back (trim_heap_growth); HEAP_TRIM_ENV sets it in MiB. Off by default (0):
# measured on BERT-base seq128, 256 MiB took the peak from [2918, 2682] to [2750, 2614] MiB
# per party but the forward from 10.3 to 13.4 s (each trim faults the next temporaries in).
HEAP_TRIM_ENV = "CRYPTEN_LITE_HEAP_TRIM_MB"
HEAP_GROWTH_TRIM_MB = 0
_trim_state = {"base": None, "libc": None, "page": 4096, "step": None}


def _trim_step() -> int:
    raw = os.environ.get(HEAP_TRIM_ENV, str(HEAP_GROWTH_TRIM_MB))
    try:
        mb = int(raw)
        if mb < 0:
            raise ValueError
    except ValueError:
        raise ConfigError(f"{HEAP_TRIM_ENV}={raw!r}: expected a whole number of MiB (0 turns "
                          "the forward's heap trimming off)") from None
    return mb << 20


def trim_heap_growth() -> None:
    """Between two operations of a private model's forward: when this process's resident
    memory has grown by HEAP_GROWTH_TRIM_MB (HEAP_TRIM_ENV) since the last trim, hand the heap's free
    pages back to the OS (glibc malloc_trim, which also frees whole pages inside the heap).

    An operation's temporaries are freed at its end, but malloc places the next ones in
    other free holes, so over a forward the pages of every hole of the heap became resident
    (BERT-base: about 1 GB of free heap per party above its live memory). Trimming only on
    growth bounds that to about HEAP_GROWTH_TRIM_MB plus one operation's temporaries,
    while a forward that does not grow pays one read of /proc/self/statm per operation.
    A no-op where glibc or /proc is missing."""
    st = _trim_state
    if st["step"] is None:
        st["step"] = _trim_step()
    if not st["step"]:
        return
    if st["libc"] is None:
        try:
            st["libc"] = ctypes.CDLL(None).malloc_trim
            st["page"] = os.sysconf("SC_PAGE_SIZE")
        except (OSError, AttributeError, ValueError):
            st["libc"] = False
    if st["libc"] is False:
        return
    try:
        resident = _resident_bytes(st["page"])
    except (OSError, ValueError, IndexError):
        st["libc"] = False
        return
    if st["base"] is None or resident < st["base"]:
        st["base"] = resident
        return
    if resident - st["base"] < st["step"]:
        return
    st["libc"](0)
    st["base"] = _resident_bytes(st["page"])


def _resident_bytes(page: int) -> int:
    """This process's resident memory in bytes (/proc/self/statm's second field)."""
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[1]) * page


# While a private model loads or runs (mapped_transients), blocks from this size up get a
# mapping of their own, unmapped when freed, instead of a place in the heap. Measured on
# BERT-base seq 128 per inference (prefetch and forward; peaks from `crypten-lite bench` for
# 32 and 1 MiB, else from 2 inferences; CPU per party from 2 inferences; load 5-12): 32 MiB
# (off) peaks 1.62x / 1.55x the floor, CPU 9.5 / 8.3 s; 4 MiB party 0 at 1.58x, CPU as off;
# 2 MiB 1.48-1.50x / 1.41x, CPU as off (party 0 at the target's edge); 1 MiB 1.45x / 1.41x,
# CPU 10.3 / 10.0 s (each 1.5 MB attention temporary faulted in afresh).
TRANSIENT_MMAP_BYTES = 1 << 20
_transient_state = {"depth": 0, "mallopt": None}
_transient_lock = threading.Lock()


@contextlib.contextmanager
def mapped_transients() -> Iterator[None]:
    """Inside the block (a private model's sharing and forward, a model's load; nested blocks
    count once), malloc maps a block of TRANSIENT_MMAP_BYTES and up on its own (glibc mallopt
    M_MMAP_THRESHOLD) when no free heap block fits it, and unmaps it when it is freed; outside,
    MMAP_THRESHOLD_BYTES (tune_malloc) holds again. A no-op without glibc, or where
    MALLOC_MMAP_THRESHOLD_ is set (glibc's own setting wins).

    Measured on BERT-base seq 128 (docs/ARCHITECTURE.md, "Memory of a private model"): at a
    party's peak its live heap blocks were about 200 MB, but the heap spanned 0.8-1.5 GB
    (the owner's float32 model, the load's autograd graph, weights' shares being made, a
    product's operands: blocks of 1-32 MB placed between long-lived ones) and every hole a
    later operation's temporaries touched stayed resident. Mapped on their own, such blocks
    leave no hole behind. Since malloc still serves a request from a free heap block that
    fits, the heap must stay small from the start: the load belongs in the block too. The
    price is that each mapped block faults its pages in afresh, which the small operations
    of a forward (below 1 MiB) and bare products outside a model (bench's mul_1M,
    matmul_1024) do not pay."""
    st = _transient_state
    with _transient_lock:
        if st["mallopt"] is None:
            st["mallopt"] = False
            if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
                try:
                    st["mallopt"] = ctypes.CDLL(None).mallopt
                except (OSError, AttributeError):
                    pass
        mallopt = st["mallopt"]
        if mallopt:
            tune_malloc()
            st["depth"] += 1
            if st["depth"] == 1:
                mallopt(_M_MMAP_THRESHOLD, TRANSIENT_MMAP_BYTES)
    try:
        yield
    finally:
        if mallopt:
            with _transient_lock:
                st["depth"] -= 1
                if st["depth"] == 0:
                    mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)
