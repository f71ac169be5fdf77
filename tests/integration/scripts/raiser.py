"""Party `FAILING` raises ValueError in the middle of a protocol; the others wait for it.

argv: FAILING [WHERE]; WHERE is "recv" (the others wait in a recv from the failing party,
default) or "barrier" (they wait in a barrier). Each surviving party prints the error it got.
"""
import sys

import torch

import crypten_lite
from crypten_lite.errors import CommunicationError


def deep_failure(level: int) -> None:
    if level == 0:
        raise ValueError("refused at level 0")
    deep_failure(level - 1)


failing = int(sys.argv[1]) if len(sys.argv) > 1 else 1
where = sys.argv[2] if len(sys.argv) > 2 else "recv"
crypten_lite.init()
rank = crypten_lite.get_rank()
comm = crypten_lite.comm.get()
x = crypten_lite.cryptensor(torch.ones(10), src=0)
(x * x).get_plain_text()
print("inside the protocol", flush=True)
if rank == failing:
    deep_failure(5)
try:
    if where == "barrier":
        comm.barrier()
    else:
        comm.recv(failing)
except CommunicationError as e:
    print(f"rank {rank} got CommunicationError: {e}", flush=True)
    raise
print("no error", flush=True)
