"""Saving and loading private values: plaintext at one party, or each party's own shares.

Plaintext owned by one party (CrypTen's API):

    crypten_lite.save_from_party(state_dict, "model.pt", src=0)   # only party 0 writes
    params = crypten_lite.load_from_party("model.pt", src=0)      # party 0 reads, shares

`load_from_party` has party `src` read a torch-saved tensor, or a (nested) dict / list of
tensors such as a state dict, and secret-share every tensor; the other parties pass
nothing. What travels: the structure (keys and non-tensor leaves) as JSON bytes in one
broadcast, then each tensor's shape and dtype (the usual sharing announcement); never a
pickle, never the values.

Secret-shared values (a CrypTensor, an encrypted Module, or a dict / list of CrypTensors):

    crypten_lite.save_from_party(model, "ckpt.pt")                      # every party writes
    model.load_state_dict(crypten_lite.load_from_party("ckpt.pt", encrypted=True))

Each party writes its own file, `share_path(path, rank)` (`path` with `{rank}` replaced,
or `path.party<rank>`), with torch.save of its plain int64 share tensors and their
metadata (precision, dtype, names): local disk only, nothing on the wire. The files of one
save carry a common random id; loading checks in one all-gather that every party loaded
files of the same save (mixing shares of different saves would silently give garbage).
"""

from __future__ import annotations

import json
import os
from typing import Any

import torch

from .cryptensor import CrypTensor
from .errors import ProtocolError, UnsupportedError
from .session import current

FORMAT = "crypten_lite.shares/v1"
_DTYPES = {str(d): d for d in (torch.float32, torch.float64, torch.int64, torch.bool)}


def share_path(path: str, rank: int) -> str:
    """The file of party `rank` for a save at `path`."""
    path = os.fspath(path)
    return path.format(rank=rank) if "{rank}" in path else f"{path}.party{rank}"


def _is_encrypted(obj) -> bool:
    from .nn.module import Module
    if isinstance(obj, CrypTensor):
        return True
    if isinstance(obj, Module):
        return obj.encrypted
    if isinstance(obj, dict):
        return any(_is_encrypted(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(_is_encrypted(v) for v in obj)
    return False


def save_from_party(obj: Any, path: str, src: int = 0) -> None:
    """Save `obj`: plaintext by party `src` only, or shares by every party.

    Plaintext: a tensor, a (nested) dict / list of tensors, a torch or crypten_lite module
    (its state_dict); only `src` writes `path`, the other parties do nothing. Encrypted: a
    CrypTensor, an encrypted crypten_lite Module (its state_dict) or a container of
    CrypTensors; every party writes `share_path(path, rank)` (`src` is not used).
    """
    s = current()
    if _is_encrypted(obj):
        _save_shares(obj, path, s)
        return
    if s.rank != src:
        return
    if hasattr(obj, "state_dict") and callable(obj.state_dict):
        obj = obj.state_dict()
    torch.save(obj, path)


def load_from_party(path: str | None = None, src: int = 0, encrypted: bool = False,
                    precision: int | None = None) -> Any:
    """Load and secret-share `src`'s torch-saved object, or (encrypted=True) this party's shares.

    Plaintext: only party `src` needs `path` (the others may pass None); returns the same
    structure with every tensor replaced by a CrypTensor. Encrypted: every party reads its
    own `share_path(path, rank)`.
    """
    s = current()
    if encrypted:
        if path is None:
            raise ProtocolError("load_from_party(encrypted=True) needs the path of the saved shares")
        return _load_shares(path, s)
    if s.rank == src:
        if path is None:
            raise ProtocolError(f"party {src} is the source of load_from_party but got no path")
        obj = torch.load(path, weights_only=True)
        skeleton = _skeleton(obj)
        payload = json.dumps(skeleton).encode()
        message = _bytes_to_tensor(payload)
    else:
        obj, message = None, None
    message = s.comm.broadcast(message, src)
    skeleton = json.loads(_tensor_to_bytes(message))
    tensors = _flatten_tensors(obj) if s.rank == src else None
    return _fill(skeleton, tensors, src, precision)


# --------------------------------------------------------------------------- plaintext
def _skeleton(obj):
    """JSON structure of `obj` with tensors replaced by {"tensor": index} in visit order."""
    counter = [0]

    def walk(o):
        if isinstance(o, torch.Tensor):
            counter[0] += 1
            return {"tensor": counter[0] - 1}
        if isinstance(o, dict):
            if not all(isinstance(k, str) for k in o):
                raise UnsupportedError("load_from_party: dict keys must be strings")
            return {"dict": [[k, walk(v)] for k, v in o.items()]}
        if isinstance(o, (list, tuple)):
            return {"list": [walk(v) for v in o], "tuple": isinstance(o, tuple)}
        if o is None or isinstance(o, (bool, int, float, str)):
            return {"value": o}
        raise UnsupportedError(f"load_from_party: cannot share a {type(o).__name__}; save tensors, "
                               "dicts, lists and plain numbers or strings")
    return walk(obj)


def _flatten_tensors(obj) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []

    def walk(o):
        if isinstance(o, torch.Tensor):
            out.append(o)
        elif isinstance(o, dict):
            for v in o.values():
                walk(v)
        elif isinstance(o, (list, tuple)):
            for v in o:
                walk(v)
    walk(obj)
    return out


def _fill(skeleton, tensors, src: int, precision: int | None):
    from collections import OrderedDict

    def walk(node):
        if "tensor" in node:
            t = tensors[node["tensor"]] if tensors is not None else None
            return CrypTensor.from_plain(t, src=src, precision=precision)
        if "dict" in node:
            return OrderedDict((k, walk(v)) for k, v in node["dict"])
        if "list" in node:
            items = [walk(v) for v in node["list"]]
            return tuple(items) if node.get("tuple") else items
        return node["value"]
    return walk(skeleton)


def _bytes_to_tensor(data: bytes) -> torch.Tensor:
    padded = data + b"\0" * (-len(data) % 8)
    body = torch.frombuffer(bytearray(padded), dtype=torch.int64) if padded else torch.zeros(0, dtype=torch.int64)
    return torch.cat([torch.tensor([len(data)], dtype=torch.int64), body.clone()])


def _tensor_to_bytes(t: torch.Tensor) -> bytes:
    n = int(t[0])
    return t[1:].contiguous().numpy().tobytes()[:n]


# --------------------------------------------------------------------------- shares
def _save_shares(obj, path: str, s) -> None:
    from .nn.module import Module
    from .nn.functional import common_prg

    if isinstance(obj, Module):
        obj = obj.state_dict()
    save_id = common_prg().draw((2,))  # the same on every party: ties the files of one save

    def walk(o):
        if isinstance(o, CrypTensor):
            return {"share": o.share.clone(), "precision": o.precision, "dtype": str(o.dtype),
                    "names": list(o._names) if o._names is not None else None,
                    "requires_grad": bool(o.requires_grad)}
        if isinstance(o, torch.Tensor):
            return {"public": o.detach().clone()}
        if isinstance(o, dict):
            return {"dict": [[k, walk(v)] for k, v in o.items()]}
        if isinstance(o, (list, tuple)):
            return {"list": [walk(v) for v in o], "tuple": isinstance(o, tuple)}
        return {"value": o}

    record = {"format": FORMAT, "rank": s.rank, "world_size": s.world_size, "save_id": save_id,
              "tree": walk(obj)}
    torch.save(record, share_path(path, s.rank))


def _load_shares(path: str, s):
    from collections import OrderedDict

    file = share_path(path, s.rank)
    try:
        record = torch.load(file, weights_only=True)
    except FileNotFoundError:
        raise ProtocolError(f"party {s.rank}: no share file {file!r}; was it saved with "
                            "save_from_party on an encrypted object by every party?") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ProtocolError(f"party {s.rank}: {file!r} is not a crypten_lite share file")
    if record["rank"] != s.rank or record["world_size"] != s.world_size:
        raise ProtocolError(f"party {s.rank}: {file!r} holds the shares of party {record['rank']} "
                            f"of {record['world_size']}; this session is party {s.rank} of "
                            f"{s.world_size}")
    ids = s.comm.all_gather(record["save_id"])
    if any(not torch.equal(i, ids[0]) for i in ids):
        raise ProtocolError("load_from_party: the parties loaded share files of different saves; "
                            "every party must load the files written by the same save")

    def walk(node):
        if "share" in node:
            out = CrypTensor(node["share"], node["precision"], _DTYPES[node["dtype"]],
                             tuple(node["names"]) if node["names"] is not None else None)
            out.requires_grad = node["requires_grad"]
            return out
        if "public" in node:
            return node["public"]
        if "dict" in node:
            return OrderedDict((k, walk(v)) for k, v in node["dict"])
        if "list" in node:
            items = [walk(v) for v in node["list"]]
            return tuple(items) if node.get("tuple") else items
        return node["value"]
    return walk(record["tree"])


__all__ = ["save_from_party", "load_from_party", "share_path"]
