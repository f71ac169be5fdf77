"""Rank 1 raises right after a first product; rank 0 only SENDS to it from then on (never
receives), until a send fails. The failure rank 0 reports must be rank 1's own (its abort
frame names it), not "its subscription to this party ended": a party learns why a peer went
away from that peer's stream even when its next operation is a send.

Deterministic whatever the timing: rank 0's sends are queued while rank 1 lives and fail only
once rank 1's subscription has ended, which is after rank 1 queued its abort frame.
"""
import sys
import time

import torch

import crypten_lite
from crypten_lite.errors import CommunicationError

crypten_lite.init()
rank = crypten_lite.get_rank()
comm = crypten_lite.comm.get()
x = crypten_lite.cryptensor(torch.ones(4), src=0)
(x * x).get_plain_text()
if rank == 1:
    raise ValueError("rank 1 gives up")
deadline = time.monotonic() + 120
try:
    while time.monotonic() < deadline:
        comm.send(torch.zeros(1), 1)
        time.sleep(0.01)
except CommunicationError as e:
    print(f"rank {rank} got CommunicationError: {e}", flush=True)
    raise
print("no error within 120 s", flush=True)
sys.exit(2)
