"""CrypTen's `crypten.communicator`: get() returns this party's communicator.

Tensors only travel between parties: `send_obj` / `broadcast_obj` accept what JSON can carry
(numbers, strings, lists, dicts) and tensors, never pickles.
"""

from __future__ import annotations

import json
from typing import Any

import torch

from .. import comm as core_comm
from .. import session


class ReduceOp:
    """torch.distributed.ReduceOp names accepted by all_reduce."""

    SUM = "sum"
    BXOR = "xor"


class Communicator:
    """CrypTen's communicator methods over crypten_lite's (counts rounds and bytes exactly)."""

    def __init__(self, core):
        self._core = core

    def get_rank(self) -> int:
        return self._core.rank

    def get_world_size(self) -> int:
        return self._core.world_size

    def send(self, tensor: torch.Tensor, dst: int) -> None:
        self._core.send(tensor, dst)

    def recv(self, tensor: torch.Tensor, src: int | None = None) -> torch.Tensor:
        """Receive into `tensor` (CrypTen fills it in place) and return it."""
        got = self._core.recv(src)
        if tensor is not None and isinstance(tensor, torch.Tensor) and tensor.shape == got.shape:
            tensor.copy_(got)
            return tensor
        return got

    def broadcast(self, tensor, src: int, group=None, batched: bool = False):
        """`src`'s tensor at every party, also copied into `tensor` in place (CrypTen)."""
        if isinstance(tensor, (list, tuple)):
            return [self.broadcast(t, src) for t in tensor]
        out = self._core.broadcast(tensor if self._core.rank == src else None, src)
        if self._core.rank != src and isinstance(tensor, torch.Tensor) and tensor.shape == out.shape:
            with torch.no_grad():
                tensor.copy_(out)
            return tensor
        return out

    def all_reduce(self, tensor, op=ReduceOp.SUM, batched: bool = False):
        if isinstance(tensor, (list, tuple)):
            return [self.all_reduce(t, op) for t in tensor]
        return self._core.all_reduce(tensor, op if isinstance(op, str) else "sum")

    def reduce(self, tensor, dst: int, op=ReduceOp.SUM, batched: bool = False):
        total = self.all_reduce(tensor, op)
        return total if self._core.rank == dst else tensor

    def all_gather(self, tensor: torch.Tensor) -> list[torch.Tensor]:
        return self._core.all_gather(tensor)

    def gather(self, tensor: torch.Tensor, dst: int):
        return self._core.gather(tensor, dst)

    def scatter(self, scatter_list, src: int, size=None, async_op: bool = False) -> torch.Tensor:
        """Party `src` sends scatter_list[r] to party r; each gets its own entry."""
        c = self._core
        if c.rank == src:
            got = c.exchange({r: scatter_list[r] for r in c.peers()}, [])
            return scatter_list[src]
        return c.exchange({}, [src])[src]

    def barrier(self) -> None:
        self._core.barrier()

    # -- small Python values, as JSON (never pickle) -------------------------------------
    def broadcast_obj(self, obj: Any, src: int, group=None) -> Any:
        c = self._core
        data = _to_bytes(obj) if c.rank == src else None
        return _from_bytes(c.broadcast(data, src))

    def send_obj(self, obj: Any, dst: int, group=None) -> None:
        self._core.send(_to_bytes(obj), dst)

    def recv_obj(self, src: int, group=None) -> Any:
        return _from_bytes(self._core.recv(src))

    # -- statistics -------------------------------------------------------------------------
    def get_communication_stats(self) -> dict[str, float]:
        """CrypTen's keys (rounds, bytes sent, time in seconds) plus crypten_lite's counters."""
        stats = self._core.get_communication_stats()
        return dict(stats, bytes=stats["bytes_sent"], time=stats["seconds"])

    def reset_communication_stats(self) -> None:
        self._core.reset_communication_stats()

    def print_communication_stats(self) -> None:
        s = self.get_communication_stats()
        print(f"rounds: {s['rounds']}  bytes: {s['bytes']}  communication time: {s['time']:.3f} s")

    @property
    def rank(self) -> int:
        return self._core.rank

    @property
    def world_size(self) -> int:
        return self._core.world_size


def _to_bytes(obj: Any) -> torch.Tensor:
    if isinstance(obj, torch.Tensor):
        payload = {"tensor": obj.tolist(), "dtype": str(obj.dtype).removeprefix("torch.")}
    else:
        payload = {"json": obj}
    return torch.frombuffer(bytearray(json.dumps(payload).encode()), dtype=torch.uint8)


def _from_bytes(data: torch.Tensor) -> Any:
    payload = json.loads(bytes(data.numpy()).decode())
    if "tensor" in payload:
        return torch.tensor(payload["tensor"], dtype=getattr(torch, payload["dtype"]))
    return payload["json"]


def get() -> Communicator:
    """This party's communicator (after crypten.init())."""
    return Communicator(core_comm.get())


def is_initialized() -> bool:
    return session.is_initialized()
