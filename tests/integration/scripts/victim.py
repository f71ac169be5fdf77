"""Party `VICTIM` kills itself (SIGKILL) in the middle of a protocol; the others report the error.

argv[1]: the victim's rank, or "loop": nobody kills itself, the parties multiply forever
(until a peer or the dealer is killed from outside, which every kill then lands inside of).
"""
import os
import signal
import sys
import time

import torch

import crypten_lite
from crypten_lite.errors import CommunicationError

victim = sys.argv[1] if len(sys.argv) > 1 else "1"
crypten_lite.init()
rank = crypten_lite.get_rank()
start = time.monotonic()
try:
    x = crypten_lite.cryptensor(torch.ones(1000), src=0)
    (x * x).get_plain_text()
    print("warm", flush=True)
    if victim != "loop" and rank == int(victim):
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    for _ in range(100) if victim != "loop" else iter(int, 1):
        x = x * x  # ones: the values stay 1 however long it runs
    x.get_plain_text()
    print("no error", flush=True)
    sys.exit(0)
except CommunicationError as e:
    print(f"CommunicationError after {time.monotonic() - start:.2f}s: {e}", flush=True)
    sys.exit(3)
