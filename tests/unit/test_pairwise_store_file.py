"""The pairwise offline store's file format alone (provider/store.py, no parties): the key
file's permissions, entries bound to their position, a tampered manifest, another plan, and
no pickle anywhere."""

from __future__ import annotations

import json
import os

import pytest
import torch

from crypten_lite.errors import ConfigError, ProtocolError
from crypten_lite.provider import store as S

HEADER = {"rank": 0, "peer": 1, "plan": "ab" * 32, "parties": ["party0", "party1"], "store_id": "00" * 16}
TOKEN = b"t" * 32


def _entries():
    return [[torch.tensor([1, -2, 3]), torch.tensor([[4, 5]])], [torch.tensor([7, 2 ** 62])]]


def _make(tmp_path, name="s"):
    key = S.load_key(str(tmp_path / "key"), 0, create=True)
    S.save(str(tmp_path / name), key, HEADER, _entries(), TOKEN)
    return key, str(tmp_path / name)


def test_round_trip_and_key_file_mode(tmp_path):
    key, d = _make(tmp_path)
    assert oct(os.stat(tmp_path / "key").st_mode & 0o777) == "0o600"
    header, entries, token = S.load(d, key, 0, {"plan": HEADER["plan"]})
    assert token == TOKEN and header["entries"] == 2
    for got, want in zip(entries, _entries()):
        assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert sorted(os.listdir(d)) == [S.CLAIMED]
    with pytest.raises(ProtocolError, match="already used"):
        S.load(d, key, 0, {})
    with pytest.raises(ConfigError, match="no offline store"):
        S.load(str(tmp_path / "nowhere"), key, 0, {})
    with pytest.raises(ConfigError, match="not empty"):
        S.save(d, key, HEADER, _entries(), TOKEN)


def test_loose_key_file_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "key"
    path.write_bytes(b"k" * 32)
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="chmod 600"):
        S.load_key(str(path), 1, create=False)
    monkeypatch.delenv(S.KEY_ENV, raising=False)
    with pytest.raises(ConfigError, match="CRYPTEN_LITE_OFFLINE_KEY"):
        S.load_key(None, 1, create=False)
    short = tmp_path / "short"
    short.write_bytes(b"k" * 16)
    os.chmod(short, 0o600)
    with pytest.raises(ConfigError, match="must hold 32 bytes"):
        S.load_key(str(short), 1, create=False)


def test_swapped_entries_tampered_manifest_other_plan_and_wrong_key(tmp_path):
    key, d = _make(tmp_path, "swap")
    a, b = os.path.join(d, "entry-000000.bin"), os.path.join(d, "entry-000001.bin")
    os.rename(a, a + ".x")
    os.rename(b, a)
    os.rename(a + ".x", b)
    with pytest.raises(ProtocolError, match="entry 0 fails its authentication"):
        S.load(d, key, 0, {})
    key, d = _make(tmp_path, "manifest")
    path = os.path.join(d, S.MANIFEST)
    doc = json.loads(open(path).read())
    doc["header"]["rank"] = 1                         # claim to be the other party's store
    open(path, "w").write(json.dumps(doc))
    with pytest.raises(ProtocolError, match="manifest fails its authentication"):
        S.load(d, key, 0, {})
    key, d = _make(tmp_path, "plan")
    with pytest.raises(ProtocolError, match="made for plan"):
        S.load(d, key, 0, {"plan": "cd" * 32})
    key, d = _make(tmp_path, "key2")
    with pytest.raises(ProtocolError, match="manifest fails its authentication"):
        S.load(d, b"x" * 32, 0, {})


def test_no_pickle_in_the_store_module():
    src = open(S.__file__).read()
    assert "pickle" not in src.split('"""', 2)[2] and "torch.load" not in src and "np.load" not in src
