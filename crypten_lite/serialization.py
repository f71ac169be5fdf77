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
or `path.party<rank>`), with torch.save of its plain int64 share tensors (under the rss
protocol, the two components of each replicated share) and their metadata (precision,
dtype, names, the protocol): local disk only, nothing on the wire. A file is loaded only by
a session of the protocol that wrote it. The files of one
save carry a common random id; loading checks in one all-gather that every party loaded
files of the same save (mixing shares of different saves would silently give garbage).
"""

from __future__ import annotations

import json
import os
from collections import OrderedDict
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
    tensors: list[torch.Tensor] = []
    message = None
    if s.rank == src:
        if path is None:
            raise ProtocolError(f"party {src} is the source of load_from_party but got no path")

        def index(o):
            if isinstance(o, torch.Tensor):
                tensors.append(o)
                return {"tensor": len(tensors) - 1}
            return None
        skeleton = _to_tree(torch.load(path, weights_only=True), index)
        message = _bytes_to_tensor(json.dumps(skeleton).encode())
    skeleton = json.loads(_tensor_to_bytes(s.comm.broadcast(message, src)))
    # Every party shares the tensors in the skeleton's order; only `src` has their values.
    return _from_tree(skeleton, lambda node: CrypTensor.from_plain(
        tensors[node["tensor"]] if s.rank == src else None, src=src, precision=precision))


# ---------------------------------------------------------------------- structures
def _to_tree(obj, leaf):
    """A JSON-like tree of nested dicts (string keys), lists and tuples; `leaf(o)` encodes the
    tensor leaves (None: not a leaf); numbers, strings and None are kept as values."""
    encoded = leaf(obj)
    if encoded is not None:
        return encoded
    if isinstance(obj, dict):
        if not all(isinstance(k, str) for k in obj):
            raise UnsupportedError("save/load_from_party: dict keys must be strings")
        return {"dict": [[k, _to_tree(v, leaf)] for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        return {"list": [_to_tree(v, leaf) for v in obj], "tuple": isinstance(obj, tuple)}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return {"value": obj}
    raise UnsupportedError(f"save/load_from_party: cannot store a {type(obj).__name__}; use "
                           "tensors, dicts, lists and plain numbers or strings")


def _from_tree(node, leaf):
    """Inverse of _to_tree; `leaf(node)` decodes the tensor leaves."""
    if "dict" in node:
        return OrderedDict((k, _from_tree(v, leaf)) for k, v in node["dict"])
    if "list" in node:
        items = [_from_tree(v, leaf) for v in node["list"]]
        return tuple(items) if node.get("tuple") else items
    if "value" in node:
        return node["value"]
    return leaf(node)


def _bytes_to_tensor(data: bytes) -> torch.Tensor:
    padded = data + b"\0" * (-len(data) % 8)
    body = torch.frombuffer(bytearray(padded), dtype=torch.int64).clone() if padded else \
        torch.zeros(0, dtype=torch.int64)
    return torch.cat([torch.tensor([len(data)], dtype=torch.int64), body])


def _tensor_to_bytes(t: torch.Tensor) -> bytes:
    return t[1:].contiguous().numpy().tobytes()[:int(t[0])]


# --------------------------------------------------------------------------- shares
def _share_leaf(o):
    if isinstance(o, CrypTensor):
        from .mpc.replicated import Replicated
        share = o.share
        leaf = {"precision": o.precision, "dtype": str(o.dtype),
                "names": list(o._names) if o._names is not None else None,
                "requires_grad": bool(o.requires_grad)}
        if isinstance(share, Replicated):  # rss: both components, as plain int64 tensors
            leaf.update(share=share.a.clone(), share_b=share.b.clone())
        else:
            leaf["share"] = share.clone()
        return leaf
    if isinstance(o, torch.Tensor):
        return {"public": o.detach().clone()}
    return None


def _share_from_leaf(node, rank: int, protocol: str):
    if "public" in node:
        return node["public"]
    share = node["share"]
    if protocol == "rss":
        from .mpc.replicated import Replicated
        share = Replicated(share, node["share_b"], rank)
    out = CrypTensor(share, node["precision"], _DTYPES[node["dtype"]],
                     tuple(node["names"]) if node["names"] is not None else None)
    out.requires_grad = node["requires_grad"]
    return out


def _save_shares(obj, path: str, s) -> None:
    from .nn.functional import common_prg
    from .nn.module import Module

    if isinstance(obj, Module):
        obj = obj.state_dict()
    save_id = common_prg().draw((2,))  # the same on every party: ties the files of one save
    record = {"format": FORMAT, "rank": s.rank, "world_size": s.world_size, "save_id": save_id,
              "protocol": s.config.protocol, "tree": _to_tree(obj, _share_leaf)}
    torch.save(record, share_path(path, s.rank))


def _load_shares(path: str, s):
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
    saved_protocol = record.get("protocol", "additive")
    if saved_protocol != s.config.protocol:
        raise ProtocolError(f"party {s.rank}: {file!r} holds shares of protocol "
                            f"{saved_protocol!r}; this session runs protocol "
                            f"{s.config.protocol!r} (a share of one scheme means nothing in "
                            "the other: load it in a session of the protocol that saved it)")
    ids = s.comm.all_gather(record["save_id"])
    if any(not torch.equal(i, ids[0]) for i in ids):
        raise ProtocolError("load_from_party: the parties loaded share files of different saves; "
                            "every party must load the files written by the same save")
    return _from_tree(record["tree"], lambda node: _share_from_leaf(node, s.rank, saved_protocol))


__all__ = ["save_from_party", "load_from_party", "share_path"]
