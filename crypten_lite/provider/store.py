"""A party's offline store: the pairwise provider's correlations of one plan, made ahead of
time and kept on this party's own disk, encrypted, authenticated and used once.

    DIR/manifest.json        public header (JSON) + AES-GCM tag over it (no plaintext)
    DIR/entry-000000.bin     AES-256-GCM(JSON header + the entry's tensors as raw int64 bytes)

Only this party's own components are written (the list `Correlation.parts` it would have used
online; never anything received from the other party). The key is 32 bytes from a key file
that only this party can read (created with mode 0600 if absent; a file readable by group or
others is refused). It cannot come from the party's PRG seed: that seed is fresh in every
session (never written anywhere), and the store must outlive the session that made it.

Every entry's associated data binds it to the store id (agreed by both parties: derived from
the pair seed of the session that made it, which only those two parties know), this party's
rank and its peer's, the plan's digest (kinds, ops, shapes, parameters, order) and the
entry's position, so an entry cannot be moved to another position, store, party or plan.

Used once: `load` first renames the manifest to manifest.claimed (one atomic rename claims
the store: a second load finds no manifest, only that tombstone, and is refused), then reads and deletes every entry file before any is
verified or used; a crash at any point leaves a store that can only be refused.
No pickle: JSON headers and numpy raw bytes only.
"""

from __future__ import annotations

import json
import os
import stat
import struct

import numpy as np
import torch
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from ..errors import ConfigError, ProtocolError
from ..random import fresh_seed

FORMAT = "crypten_lite/pairwise-offline-store/v1"
KEY_ENV = "CRYPTEN_LITE_OFFLINE_KEY"
STORE_ENV = "CRYPTEN_LITE_OFFLINE_STORE"
MANIFEST, CLAIMED = "manifest.json", "manifest.claimed"
_LEN = struct.Struct("<I")


def resolve_dir(directory: str, rank: int) -> str:
    """The store directory of this party ('{rank}' in it is replaced: two parties on one
    machine, as in tests, keep separate stores)."""
    return os.path.abspath(directory.replace("{rank}", str(rank)))


def load_key(path: str | None, rank: int, create: bool) -> bytes:
    """This party's 32-byte store key from its key file (CRYPTEN_LITE_OFFLINE_KEY when `path`
    is None; '{rank}' replaced). Created with mode 0600 when `create` and absent."""
    path = path or os.environ.get(KEY_ENV, "")
    if not path:
        raise ConfigError(f"party {rank}: an offline store needs a key file that only this party "
                          f"can read: set {KEY_ENV}=FILE (created with mode 0600 by the first "
                          "make_store) or pass key_file=")
    path = os.path.abspath(path.replace("{rank}", str(rank)))
    if create and not os.path.exists(path):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(fresh_seed())
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ConfigError(f"party {rank}: offline store key file {path} does not exist; use the "
                          "key file the store was made with") from None
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"party {rank}: offline store key file {path} is accessible by group or "
                          f"others (mode {oct(st.st_mode & 0o777)}); chmod 600 it")
    with open(path, "rb") as f:
        key = f.read()
    if len(key) != 32:
        raise ConfigError(f"party {rank}: offline store key file {path} must hold 32 bytes, "
                          f"holds {len(key)}")
    return key


def _aad(header: dict, index: int) -> bytes:
    return json.dumps({"store": header, "entry": index}, sort_keys=True).encode()


def save(directory: str, key: bytes, header: dict, entries: list[list[torch.Tensor]],
         token: bytes) -> None:
    """Write a new store (the directory must not hold one). `header`: format, store_id, rank,
    peer, plan digest (public values only). `token`: the pair's secret (both parties hold the
    same; encrypted in the manifest), for proving at load that the peer holds the matching
    store."""
    header = dict(header, format=FORMAT, entries=len(entries))
    os.makedirs(directory, mode=0o700, exist_ok=True)
    if os.listdir(directory):
        raise ConfigError(f"party {header['rank']}: offline store directory {directory} is not "
                          "empty; give each store a new directory")
    aes = AESGCM(key)
    for i, parts in enumerate(entries):
        arrays = [p.detach().contiguous().numpy() for p in parts]
        meta = json.dumps({"shapes": [list(a.shape) for a in arrays]}).encode()
        plain = _LEN.pack(len(meta)) + meta + b"".join(a.astype("<i8").tobytes() for a in arrays)
        nonce = fresh_seed()[:12]
        _write(os.path.join(directory, f"entry-{i:06d}.bin"), nonce + aes.encrypt(nonce, plain, _aad(header, i)))
    nonce = fresh_seed()[:12]
    sealed = aes.encrypt(nonce, token, _aad(header, -1))
    _write(os.path.join(directory, MANIFEST),
           json.dumps({"header": header, "nonce": nonce.hex(), "sealed": sealed.hex()}).encode())
    _sync_dir(directory)


def _sync_dir(directory: str) -> None:
    """Make the directory's renames and deletions durable (fsync of the directory)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def load(directory: str, key: bytes, rank: int,
         expect: dict) -> tuple[dict, list[list[torch.Tensor]], bytes]:
    """Claim, read, delete and verify a store. Returns (header, entries, pair token). `expect`: header
    fields that must match (rank, peer, plan digest). Raises ConfigError (missing store or
    key) or ProtocolError (used, partial, tampered, another plan or party)."""
    manifest, claimed = os.path.join(directory, MANIFEST), os.path.join(directory, CLAIMED)
    try:
        os.rename(manifest, claimed)          # atomic claim: a second load finds no manifest
        _sync_dir(directory)                  # durable before anything is used (power loss)
    except FileNotFoundError:
        if os.path.exists(claimed):
            raise ProtocolError(f"party {rank}: offline store {directory} was already used (its "
                                "correlations are used once); make a new store") from None
        raise ConfigError(f"party {rank}: no offline store in {directory} (no {MANIFEST}); make "
                          "one with offline.make_store") from None
    with open(claimed, "rb") as f:      # kept as the tombstone that says "used"
        raw = f.read()
    try:
        doc = json.loads(raw)
        header = doc["header"]
        count = int(header["entries"])
        token = AESGCM(key).decrypt(bytes.fromhex(doc["nonce"]), bytes.fromhex(doc["sealed"]),
                                    _aad(header, -1))
    except (ValueError, KeyError, TypeError, InvalidTag):
        raise ProtocolError(f"party {rank}: offline store {directory}: manifest fails its "
                            "authentication (tampered, or another key); make a new store") from None
    blobs = []
    for i in range(count):                   # read and delete every entry before any is used
        path = os.path.join(directory, f"entry-{i:06d}.bin")
        try:
            with open(path, "rb") as f:
                blobs.append(f.read())
            os.unlink(path)
        except FileNotFoundError:
            blobs.append(None)
    _sync_dir(directory)
    if header.get("format") != FORMAT:
        raise ProtocolError(f"party {rank}: offline store {directory} has format "
                            f"{header.get('format')!r}, expected {FORMAT!r}")
    for name, value in expect.items():
        if header.get(name) != value:
            raise ProtocolError(f"party {rank}: offline store {directory} was made for {name} "
                                f"{str(header.get(name))[:80]!r}, this run needs {str(value)[:80]!r}; "
                                "record the same program and load the store made for it")
    missing = [i for i, b in enumerate(blobs) if b is None]
    if missing:
        raise ProtocolError(f"party {rank}: offline store {directory} is partial: {len(missing)} of "
                            f"{count} entries missing (first {missing[0]}); make a new store")
    aes, entries = AESGCM(key), []
    for i, blob in enumerate(blobs):
        try:
            plain = aes.decrypt(blob[:12], blob[12:], _aad(header, i))
        except InvalidTag:
            raise ProtocolError(f"party {rank}: offline store {directory}: entry {i} fails its "
                                "authentication (tampered or moved); make a new store") from None
        (n,) = _LEN.unpack_from(plain)
        shapes = json.loads(plain[4:4 + n])["shapes"]
        offset, parts = 4 + n, []
        for shape in shapes:
            size = int(np.prod(shape, dtype=np.int64)) * 8
            arr = np.frombuffer(plain, dtype="<i8", count=size // 8, offset=offset).reshape(shape)
            parts.append(torch.from_numpy(arr.astype(np.int64)))
            offset += size
        entries.append(parts)
    return header, entries, token
