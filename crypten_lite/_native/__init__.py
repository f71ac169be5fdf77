"""Native loops for provider pairwise's OT extension, with the numpy path as the fallback.

The C extension ``crypten_lite._native._otkernels`` (otkernels.c, built by ``pip install``
where a C compiler is present; optional, so an install without one still works) does the
hot loops of provider/ot.py and provider/ferret.py byte for byte as their numpy code does:

* ``tccr``: the tweakable correlation-robust hash pi(pi(x) ^ j) ^ pi(x) (ot._Hash), fixed-key
  AES-128 with AES-NI, 8 blocks in flight;
* ``ggm_level``: one level of the GGM trees (MMO under the two fixed keys) in place, fused
  with the level's left/right XOR sums (ferret.SilentCOT._trees and _puncture);
* ``lpn_encode``: the local linear code (ferret.SilentCOT._local), no AES;
* ``transpose``: ot.transpose's bit-matrix transpose (IKNP, CorrelatedOT.prepare), no AES.
* ``tccr_rows``: ``tccr`` fused with prepare's transpose (tccrrows.h): a set's pad rows
  written as its OTs are hashed (ot.CorrelatedOT.random_ots_both's ``pads``), the [m, 16]
  keys never stored and read back.

The AES kernels use VAES (AVX-512, 16 blocks in flight) where the CPU has it, else 128-bit
AES-NI. Each loop runs without the GIL (a pool's step made ahead then overlaps the main thread
for real). Where the CPU has no AES-NI (or is not x86-64) only ``lpn_encode`` and
``transpose`` are native and the AES goes through `cryptography` as before.

``CRYPTEN_LITE_NATIVE=0`` forces the numpy path (read when a hash or a silent-OT pool is made:
the A/B of the kernels in one tree, and the tests of both paths).
"""

from __future__ import annotations

import logging
import os

_log = logging.getLogger(__name__)
ENV = "CRYPTEN_LITE_NATIVE"
_state: dict = {}


def _load():
    if "mod" not in _state:
        try:
            from . import _otkernels as mod
        except ImportError as e:
            mod = None
            _state["why"] = str(e)
            _log.info("crypten_lite: the native OT kernels are not built (%s); provider pairwise "
                      "uses its numpy path (slower). To build them, install a C compiler (e.g. "
                      "apt-get install gcc) and reinstall: pip install -e .", e)
        _state["mod"] = mod
    return _state["mod"]


def disabled() -> bool:
    """Whether CRYPTEN_LITE_NATIVE=0 forces the numpy path."""
    return os.environ.get(ENV, "1").strip() == "0"


def kernels():
    """The native module (its AES-free kernels always usable), or None: the numpy path."""
    return None if disabled() else _load()


def aes():
    """The native module where its AES-NI kernels run on this CPU, else None."""
    mod = kernels()
    return mod if mod is not None and mod.aes_ok() else None


def describe() -> str:
    """Which path provider pairwise's OT loops take here, in words."""
    if disabled():
        return f"numpy ({ENV}=0)"
    mod = _load()
    if mod is None:
        return f"numpy (native kernels not built: {_state.get('why')})"
    if not mod.aes_ok():
        return "native LPN code and transpose; AES through cryptography (no AES-NI on this CPU)"
    aes = "VAES (AVX-512)" if mod.set_wide(None) else "AES-NI"
    return f"native ({aes} hash and GGM trees, LPN code, transpose)"
