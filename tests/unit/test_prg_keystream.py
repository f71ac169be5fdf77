"""PRG draws reuse one AES-CTR context per key (reset_nonce per draw): the keystream must be
byte-for-byte the one of a fresh `Cipher(AES(key), CTR(domain, counter, 0))` per draw, so
parties and the dealer (which may derive with either path) keep agreeing."""

from __future__ import annotations

import random
import struct
import threading

import torch
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from crypten_lite.random import PRG, BufferedPRG, random_bytes


def fresh_context_stream(key: bytes, domain: int, counter: int, nbytes: int) -> bytes:
    nonce = struct.pack("<IQ", domain, counter) + bytes(4)
    return Cipher(algorithms.AES(key), modes.CTR(nonce)).encryptor().update(bytes(nbytes))


def test_reused_context_gives_the_fresh_context_keystream():
    rng = random.Random(7)
    for _ in range(200):
        key = rng.randbytes(32)
        prg = PRG(key, domain=rng.randrange(2 ** 32))
        for _ in range(rng.randrange(1, 6)):
            n = rng.choice([0, 1, 2, 3, 16, 17, 1000, rng.randrange(1, 5000)])
            shape = (n,) if rng.random() < 0.5 else (1, n)
            counter = rng.choice([None, rng.randrange(2 ** 64)])
            domain = rng.choice([None, rng.randrange(2 ** 32)])
            c = prg.counter if counter is None else counter
            d = prg._domain if domain is None else domain
            got = prg.draw(shape, counter=counter, domain=domain)
            ref = fresh_context_stream(key, d, c, 8 * n)
            assert got.shape == torch.Size(shape) and got.dtype == torch.int64
            assert got.numpy().tobytes() == ref
            assert random_bytes(key, struct.pack("<IQ", d, c), 8 * n) == ref
    # a large draw (past the shared zero plaintext's first size) and a repeat of a counter
    key = rng.randbytes(32)
    prg = PRG(key)
    big = prg.draw((3, 100_000), counter=5)
    assert big.numpy().tobytes() == fresh_context_stream(key, 0, 5, 8 * 300_000)
    assert torch.equal(prg.draw((7,), counter=5), big.reshape(-1)[:7])


def test_draws_do_not_alias_and_threads_agree():
    key = bytes(range(32))
    prg = PRG(key)
    a = prg.draw((4,), counter=1)
    b = prg.draw((4,), counter=2)
    a += 1  # writable, own memory: b and later draws are unaffected
    assert torch.equal(b, PRG(key).draw((4,), counter=2))
    results: dict[int, bytes] = {}

    def worker(i: int) -> None:
        for _ in range(50):
            out = prg.draw((33,), counter=i).numpy().tobytes()
            assert out == fresh_context_stream(key, 0, i, 8 * 33)
        results[i] = out

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(results) == [0, 1, 2, 3]
    # BufferedPRG cuts from ordinary draws: two holders of one seed still agree
    x, y = BufferedPRG(key), BufferedPRG(key)
    assert all(torch.equal(x.draw((n,)), y.draw((n,))) for n in (1, 5, 4096, 5000, 3))
