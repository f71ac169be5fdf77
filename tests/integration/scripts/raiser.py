"""Party FAILING raises ValueError in the middle of a protocol while the others wait for it.

argv: FAILING MODE [MARKER]
  recv     the others wait in a recv from the failing party
  barrier  the others wait in a barrier
  noisy    as barrier, and the failing party first writes 2000 lines to stdout and stderr
  exit     the failing party leaves quietly (exit code 0); the others wait in a recv from it
  wait     nobody fails: every party waits for a message that never comes (for SIGINT)
Each party prints the CommunicationError it gets, then re-raises it. MARKER is ignored (it
lets a test find this run's processes by their command line).

The failing party fails only once every other party has told it, from inside the try block
below, that it is there: without that, a party still finishing the reveal before it may get
the failure there (a third party's report of it can overtake the failing party's last data,
which travels on another stream), and never print the line the tests look for.
"""
import sys

import torch

import crypten_lite
from crypten_lite.errors import CommunicationError


def level_a():
    level_b()


def level_b():
    level_c()


def level_c():
    raise ValueError("refused at level c")


failing = int(sys.argv[1])
mode = sys.argv[2]
crypten_lite.init()
rank, world = crypten_lite.get_rank(), crypten_lite.get_world_size()
comm = crypten_lite.comm.get()
x = crypten_lite.cryptensor(torch.ones(10), src=0)
(x * x).get_plain_text()
print("inside the protocol", flush=True)
if rank == failing:
    for peer in range(world):
        if peer != rank:
            comm.recv(peer)  # "I am inside the try block"
    if mode == "exit":
        sys.exit(0)
    if mode == "noisy":
        for i in range(2000):
            print(f"stdout line {i}")
            print(f"stderr line {i}", file=sys.stderr)
    level_a()
try:
    if mode != "wait":
        comm.send(torch.zeros(1), failing)
    if mode in ("barrier", "noisy"):
        comm.barrier()
    elif mode == "wait":
        comm.recv((rank + 1) % world)
    else:
        comm.recv(failing)
except CommunicationError as e:
    print(f"rank {rank} got CommunicationError: {e}", flush=True)
    raise
print("no error", flush=True)
