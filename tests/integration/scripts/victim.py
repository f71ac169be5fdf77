"""Party `VICTIM` kills itself (SIGKILL) in the middle of a protocol; the others report the error."""
import os
import signal
import sys
import time

import torch

import crypten_lite
from crypten_lite.errors import CommunicationError

victim = int(sys.argv[1]) if len(sys.argv) > 1 else 1
crypten_lite.init()
rank = crypten_lite.get_rank()
start = time.monotonic()
try:
    x = crypten_lite.cryptensor(torch.ones(1000), src=0)
    (x * x).get_plain_text()
    print("warm", flush=True)
    if rank == victim:
        os.kill(os.getpid(), signal.SIGKILL)
    start = time.monotonic()
    for _ in range(100):
        x = x * x
    x.get_plain_text()
    print("no error", flush=True)
    sys.exit(0)
except CommunicationError as e:
    print(f"CommunicationError after {time.monotonic() - start:.2f}s: {e}", flush=True)
    sys.exit(3)
