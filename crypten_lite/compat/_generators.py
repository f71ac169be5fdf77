"""CrypTen's `crypten.generators`: torch generators "prev", "next", "local" and "global", per device.

CrypTen draws its shares and masks from these torch generators. crypten_lite never does: every
share, mask and correlated value comes from its AES-256-CTR PRG (crypten_lite/random.py), and no
protocol reads these generators. They exist for user code written against CrypTen that draws
its own values from them, with CrypTen's relations between parties:

* "next" of party r and "prev" of party r+1 (mod world size) have the same seed, derived by
  HKDF from the seed those two parties agreed in their handshake (never that seed itself);
* "global" has the same seed at every party: party 0's fresh seed, broadcast (one round, on
  first use of `crypten.generators` in a session);
* "local" is this party's own fresh seed.

A torch generator is not a cryptographic PRG: do not use these for secrets.
"""

from __future__ import annotations

import torch

from .. import session
from ..random import derive_key, fresh_seed

_CACHE: dict = {}


def _seed63(secret: bytes, info: str) -> int:
    return int.from_bytes(derive_key(secret, f"crypten_lite/compat/generators/{info}")[:8], "little") >> 1


def _generator(seed: int):
    g = torch.Generator()  # insecure-ok: CrypTen's API for user code, never used by a protocol
    g.manual_seed(seed)
    return g


def current() -> dict:
    """This session's generators, {name: {device: generator}} (built on first use; the
    "global" seed costs one broadcast)."""
    s = session.current()
    if _CACHE.get("session") is s:
        return _CACHE["generators"]
    rank, world = s.rank, s.world_size
    own = fresh_seed()

    def pair(sender: int, receiver: int) -> int:
        """The seed of sender's "next" and receiver's "prev" (from their handshake's seed)."""
        peer = receiver if sender == rank else sender
        if peer == rank:  # one party: its own seed
            return _seed63(own, "self")
        return _seed63(s.pair_seeds[peer], f"{sender}->{receiver}")

    word = torch.tensor([_seed63(own, "global")], dtype=torch.int64) if rank == 0 else None
    global_seed = int(s.comm.broadcast(word, 0)[0]) if world > 1 else _seed63(own, "global")
    cpu = torch.device("cpu")
    generators = {
        "prev": {cpu: _generator(pair((rank - 1) % world, rank))},
        "next": {cpu: _generator(pair(rank, (rank + 1) % world))},
        "local": {cpu: _generator(_seed63(own, "local"))},
        "global": {cpu: _generator(global_seed)},
    }
    _CACHE.update(session=s, generators=generators)
    return generators


def manual_seed(next_seed: int, local_seed: int, global_seed: int) -> None:
    """CrypTen's manual_seed (debug mode only): this party's "next" seed is sent to the next
    party, whose "prev" takes it; "local" and "global" are set as given. Only these torch
    generators change, never crypten_lite's cryptographic randomness."""
    from .config import cfg
    if not cfg.debug.debug_mode:
        raise ValueError("crypten.manual_seed is only allowed in debug mode (cfg.debug.debug_mode = True)")
    s = session.current()
    rank, world = s.rank, s.world_size
    generators = current()
    cpu = torch.device("cpu")
    if world > 1:
        got = s.comm.exchange({(rank + 1) % world: torch.tensor([int(next_seed)], dtype=torch.int64)},
                              [(rank - 1) % world])
        prev_seed = int(got[(rank - 1) % world][0])
    else:
        prev_seed = int(next_seed)
    generators["next"][cpu].manual_seed(int(next_seed))
    generators["prev"][cpu].manual_seed(prev_seed)
    generators["local"][cpu].manual_seed(int(local_seed))
    word = torch.tensor([int(global_seed)], dtype=torch.int64) if rank == 0 else None
    shared = int(s.comm.broadcast(word, 0)[0]) if world > 1 else int(global_seed)
    generators["global"][cpu].manual_seed(shared)  # party 0's, as CrypTen keeps one global seed
