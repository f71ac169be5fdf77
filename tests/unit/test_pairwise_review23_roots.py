"""Review of session 23's GGM roots stream (ferret.SilentCOT, issue 29): the sender's tree
roots come from an AES-256-CTR stream of the pool's own. Every sender pool (each direction,
each pair of parties) keys its stream with a key of its own, and no root block is drawn
twice across pools, directions, iterations and steps made ahead or on demand."""

from __future__ import annotations

import pytest

pytest.importorskip("tenseal")
pytest.importorskip("nacl")

from crypten_lite.provider import ferret  # noqa: E402
from tests.unit.test_pairwise_ferret import _ots, _take  # noqa: E402


class _Recorder:
    """An encryptor that records what it outputs (the roots), else the real one."""

    def __init__(self, inner, blocks: list):
        self._inner, self._blocks = inner, blocks

    def update(self, data):
        out = self._inner.update(data)
        self._blocks.extend(out[i:i + 16] for i in range(0, len(out), 16))
        return out

    def __getattr__(self, name):
        return getattr(self._inner, name)


def test_each_sender_pool_has_its_own_roots_stream_and_no_root_repeats(monkeypatch):
    streams = []
    real = ferret.Cipher

    class Cipher:
        def __init__(self, algorithm, mode):
            self._c = real(algorithm, mode)
            self._ctr = isinstance(mode, ferret.modes.CTR) and len(algorithm.key) == 32 \
                and mode.nonce == bytes(16) and bytes(algorithm.key) != ferret._LPN_SEED
            self._key = bytes(algorithm.key)

        def encryptor(self):
            enc = self._c.encryptor()
            if not self._ctr:
                return enc
            streams.append((self._key, []))
            return _Recorder(enc, streams[-1][1])

    monkeypatch.setattr(ferret, "Cipher", Cipher)
    for _ in range(2):                               # two pairs of parties (two providers)
        pair = _ots()
        for direction in (0, 1):
            for m in (1000, ferret.N, 5000):         # an iteration boundary, steps made ahead
                _take(pair, direction, m)
        for p in pair:
            for d in (0, 1):
                if p._silent[d] is not None:
                    p._silent[d].close()
    used = [(key, blocks) for key, blocks in streams if blocks]
    assert len(used) == 4, len(used)                 # one sender pool per direction per pair
    assert len({key for key, _ in used}) == 4, "two pools' roots under one key"
    every = [b for _, blocks in used for b in blocks]
    assert len(every) == len(set(every)), "a GGM root drawn twice"
