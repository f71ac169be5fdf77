"""Each party's own weight shares on disk, to reload the model after a restart.

One file per party (`shares-party{r}.bin`), never read by another party: a magic line, an
8-byte little-endian header length, a JSON header (model digest and id, rank, protocol, and
per tensor its name, kind, logical dtype, precision, shape, component count, offset), the raw
little-endian int64 components, and a SHA-256 of everything before it. No pickle. A file that
is truncated, altered or for another model, rank or protocol is refused with a clear error
(the service then shares the weights afresh).
"""

from __future__ import annotations

import hashlib
import json
import os
import pathlib
import struct

import numpy as np
import torch

from ..cryptensor import CrypTensor
from ..errors import ProtocolError
from ..mpc.replicated import Replicated

MAGIC = b"CRYPTEN-LITE-SHARES/1\n"
MAX_HEADER = 16 << 20


def path_for(state_dir: str | os.PathLike, rank: int) -> pathlib.Path:
    return pathlib.Path(state_dir) / f"shares-party{rank}.bin"


def _tensors(private):
    """(module, table name, key, dotted name, value) of every encrypted tensor, in order."""
    for prefix, m in private.named_modules():
        for table in ("_parameters", "_buffers"):
            for key, v in getattr(m, table).items():
                yield m, table, key, f"{prefix}.{key}" if prefix else key, v


def save(private, path: pathlib.Path, meta: dict) -> None:
    """Write this party's shares of `private`'s encrypted tensors (atomically)."""
    entries, blobs, offset = [], [], 0
    for _, table, _, name, v in _tensors(private):
        if not isinstance(v, CrypTensor):
            continue
        comps = [v.share.a, v.share.b] if getattr(v.share, "is_replicated_share", False) else [v.share]
        entries.append({"name": name, "kind": table, "dtype": str(v.dtype).removeprefix("torch."),
                        "precision": v.precision, "shape": list(v.shape),
                        "components": len(comps), "offset": offset})
        for c in comps:
            data = c.contiguous().numpy().astype("<i8", copy=False).tobytes()
            blobs.append(data)
            offset += len(data)
    header = json.dumps({**meta, "tensors": entries}, sort_keys=True).encode()
    body = MAGIC + struct.pack("<Q", len(header)) + header + b"".join(blobs)
    tmp = path.with_suffix(".tmp")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(tmp, "wb") as f:
        f.write(body + hashlib.sha256(body).digest())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_meta(path: pathlib.Path) -> tuple[dict, bytes] | None:
    """(header, data) of a saved file whose checksum holds, None if there is no file."""
    if not path.exists():
        return None
    raw = path.read_bytes()
    if len(raw) < len(MAGIC) + 8 + 32 or not raw.startswith(MAGIC):
        raise ProtocolError(f"{path} is not a crypten-lite shares file (bad magic or truncated)")
    body, digest = raw[:-32], raw[-32:]
    if hashlib.sha256(body).digest() != digest:
        raise ProtocolError(f"{path} fails its integrity check (truncated or altered): delete it "
                            "to have the weights shared afresh")
    (n,) = struct.unpack_from("<Q", body, len(MAGIC))
    start = len(MAGIC) + 8
    if n > MAX_HEADER or start + n > len(body):
        raise ProtocolError(f"{path}: header length {n} is out of range")
    return json.loads(body[start:start + n]), body[start + n:]


def load(private, header: dict, data: bytes, rank: int) -> None:
    """Install the saved shares into `private` (from_pytorch's placeholders) as its encrypted
    tensors, exactly as encrypt() would have left them."""
    entries = {e["name"]: e for e in header["tensors"]}
    used = set()
    for m, table, key, name, v in _tensors(private):
        e = entries.get(name)
        if e is None:
            if table == "_parameters" and isinstance(v, torch.Tensor):
                raise ProtocolError(f"saved shares have no entry for parameter {name!r}")
            continue
        if list(v.shape) != e["shape"]:
            raise ProtocolError(f"saved share of {name!r} has shape {e['shape']}, the model "
                                f"{list(v.shape)}")
        numel = int(np.prod(e["shape"])) if e["shape"] else 1
        comps = []
        for i in range(e["components"]):
            lo = e["offset"] + i * numel * 8
            if lo + numel * 8 > len(data):
                raise ProtocolError(f"saved share of {name!r} is truncated")
            words = np.frombuffer(data, dtype="<i8", count=numel, offset=lo)
            comps.append(torch.from_numpy(words.astype(np.int64)).reshape(e["shape"]))
        share = Replicated(comps[0], comps[1], rank) if len(comps) == 2 else comps[0]
        ct = CrypTensor(share, int(e["precision"]), getattr(torch, e["dtype"]),
                        requires_grad=table == "_parameters")
        if table == "_parameters":
            ct._fixed_owner = (ct, "")  # as encrypt(): products with it open W - B once
        getattr(m, table)[key] = ct
        used.add(name)
    if used != set(entries):
        raise ProtocolError(f"saved shares name tensors the model lacks: {sorted(set(entries) - used)}")
    for _, m in private.named_modules():
        object.__setattr__(m, "_encrypted", True)
