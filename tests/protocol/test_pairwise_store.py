"""Provider 'pairwise': an offline phase made ahead of time into each party's own store
(offline.make_store) and used once by a later prefetch (provider/store.py). Two real party
processes; tiny shapes. A product from stored correlations matches torch with nothing made
online; a second use, a flipped byte, a missing store and stores of different pairs are
errors on both parties; a store holds only its own party's components, encrypted."""

from __future__ import annotations

import os
import shutil
import stat

import pytest
import torch

pytest.importorskip("tenseal")
pytest.importorskip("nacl")

from tests.conftest import get_pool  # noqa: E402

X = torch.tensor([[1.5, -2.0, 0.25], [3.0, 0.5, -1.0]])
W = torch.tensor([[2.0, -1.0], [0.5, 4.0], [-3.0, 1.0]])
Y = torch.tensor([[2.0, 4.0, -1.0], [0.5, 1.0, 2.0]])


@pytest.fixture(scope="module")
def pw():
    return get_pool(2, provider="pairwise")


def _program(x, w, y):
    return (x.matmul(w).get_plain_text(), (x * y).get_plain_text())


def _inputs():
    import crypten_lite
    return (crypten_lite.cryptensor(X, src=0), crypten_lite.cryptensor(W, src=1),
            crypten_lite.cryptensor(Y, src=1))


def _use_twice(root: str):
    from crypten_lite.errors import ProtocolError
    from crypten_lite.mpc import offline
    from crypten_lite.provider import store as S
    from crypten_lite.session import current
    x, w, y = _inputs()
    with offline.record() as plan:
        _program(x, w, y)
    rank = current().rank
    key, directory = f"{root}/key-{{rank}}", f"{root}/store-{{rank}}"
    store_id = offline.make_store(plan, directory, key_file=key)
    mine = S.resolve_dir(directory, rank)
    files = sorted(os.listdir(mine))
    blobs = b"".join(open(os.path.join(mine, f), "rb").read() for f in files)
    copy = mine + "-copy"
    shutil.copytree(mine, copy)
    _, entries, _ = S.load(copy, S.load_key(key.replace("{rank}", str(rank)), rank, False), rank, {})
    provider = current().provider
    made = provider.stats["pairwise_made"]
    offline.prefetch(plan, store=directory, key_file=key)
    out = _program(x, w, y)
    made_online = provider.stats["pairwise_made"] - made
    left = sorted(os.listdir(mine))
    try:
        offline.prefetch(plan, store=directory, key_file=key)
        second = "accepted"
    except ProtocolError as e:
        second = str(e)
    mode = stat.S_IMODE(os.stat(key.replace("{rank}", str(rank))).st_mode)
    return dict(store_id=store_id, out=out, made_online=made_online, files=files, left=left,
                entries=entries, blobs=blobs, second=second, mode=mode, n=len(plan))


def test_stored_correlations_give_torch_products_and_are_used_once(pw, tmp_path):
    r0, r1 = pw.run(_use_twice, str(tmp_path))
    assert r0["store_id"] == r1["store_id"]
    for r in (r0, r1):
        matmul, mul = r["out"]
        assert torch.allclose(matmul, X @ W, atol=1e-3) and torch.allclose(mul, X * Y, atol=1e-3)
        assert r["made_online"] == 0                        # every correlation came from the store
        assert r["files"] == [f"entry-{i:06d}.bin" for i in range(r["n"])] + ["manifest.json"]
        assert r["left"] == ["manifest.claimed"]            # consumed: only the tombstone left
        assert "already used" in r["second"]
        assert r["mode"] == 0o600
    # Each store holds only its own party's components: together they satisfy the relations,
    # and no tensor of one store appears in the other; on disk they are encrypted.
    assert r0["n"] == r1["n"] == len(r0["entries"]) == 2
    a, b, c = [p0 + p1 for p0, p1 in zip(r0["entries"][0], r1["entries"][0])]
    assert torch.equal(c, a.matmul(b))                      # ring arithmetic wraps in int64
    a, b, c = [p0 + p1 for p0, p1 in zip(r0["entries"][1], r1["entries"][1])]
    assert torch.equal(c, a * b)
    for mine, other in ((r0, r1), (r1, r0)):
        for entry in mine["entries"]:
            for t in entry:
                assert t.numpy().tobytes()[:16] not in mine["blobs"]    # not in plaintext on disk
                assert not any(torch.equal(t, u) for e in other["entries"] for u in e)


def _tampered(root: str, what: str):
    from crypten_lite.errors import CryptenLiteError
    from crypten_lite.mpc import offline
    from crypten_lite.provider import store as S
    from crypten_lite.session import current
    x, w, y = _inputs()
    with offline.record() as plan:
        _program(x, w, y)
    rank = current().rank
    key = f"{root}/key-{{rank}}"
    offline.make_store(plan, f"{root}/a-{{rank}}", key_file=key)
    offline.make_store(plan, f"{root}/b-{{rank}}", key_file=key)
    use = f"{root}/a-{{rank}}"
    if rank == 0:
        if what == "flip":
            path = os.path.join(S.resolve_dir(use, 0), "entry-000001.bin")
            data = bytearray(open(path, "rb").read())
            data[40] ^= 1
            open(path, "wb").write(bytes(data))
        elif what == "missing":
            os.unlink(os.path.join(S.resolve_dir(use, 0), "entry-000000.bin"))
        elif what == "other_pair":
            use = f"{root}/b-{{rank}}"
    try:
        offline.prefetch(plan, store=use, key_file=key)
        result = "accepted"
    except CryptenLiteError as e:
        result = f"{type(e).__name__}: {e}"
    made = current().provider.stats["pairwise_made"]
    matmul, mul = _program(x, w, y)                         # the session goes on, correct
    ok = torch.allclose(matmul, X @ W, atol=1e-3) and torch.allclose(mul, X * Y, atol=1e-3)
    return result, ok, current().provider.stats["pairwise_made"] - made


@pytest.mark.parametrize("what,own,peer", [
    ("flip", "entry 1 fails its authentication", "could not use its offline store"),
    ("missing", "is partial", "could not use its offline store"),
    ("other_pair", "different store ids", "different store ids"),
])
def test_bad_store_refused_on_both_parties(pw, tmp_path, what, own, peer):
    (res0, ok0, made0), (res1, ok1, made1) = pw.run(_tampered, str(tmp_path), what)
    assert res0.startswith("ProtocolError") and own in res0, res0
    assert res1.startswith("ProtocolError") and peer in res1, res1
    assert ok0 and ok1 and made0 == made1 == 2              # made afresh, never from the store


def _make_fails_on_rank_0(root: str):
    from crypten_lite.errors import CryptenLiteError
    from crypten_lite.mpc import offline
    from crypten_lite.session import current
    x, w, y = _inputs()
    with offline.record() as plan:
        _program(x, w, y)
    rank = current().rank
    if rank == 0:                                           # an old store in the way
        os.makedirs(f"{root}/s-0")
        open(f"{root}/s-0/entry-000000.bin", "wb").write(b"old")
    try:
        offline.make_store(plan, f"{root}/s-{{rank}}", key_file=f"{root}/key-{{rank}}")
        return "accepted"
    except CryptenLiteError as e:
        return f"{type(e).__name__}: {e}"


def test_make_store_failing_on_one_party_fails_on_both(pw, tmp_path):
    res0, res1 = pw.run(_make_fails_on_rank_0, str(tmp_path))
    assert res0.startswith("ConfigError") and "is not empty" in res0, res0
    assert res1.startswith("ProtocolError") and "could not write its offline store" in res1, res1
