"""Arithmetic on replicated shares between 3 parties, each party with its own input.

argv[1]: JSON {"a": [[...]], "b": [[...]], "c": [[...]]}; party 0 shares a, party 1 b,
party 2 c (each reads only its own entry: the others are secret-shared from their owner).
Prints, on every party, `result {json}`: a + c, a * c, a @ b, (a * c).sum(), each revealed,
and the online rounds and bytes of the product and of the matrix product; party 0 also prints
`launcher-children {json}` (the command lines of its launcher's child processes) and
`session {json}` (protocol, dealer address), so that a test can see that no dealer runs.
"""
import json
import os
import sys

import torch

import crypten_lite

crypten_lite.init()
rank = crypten_lite.get_rank()
inputs = json.loads(sys.argv[1])
own = {0: "a", 1: "b", 2: "c"}[rank]
a, b, c = (crypten_lite.cryptensor(torch.tensor(inputs[k]) if own == k else None, src=r)
           for r, k in enumerate("abc"))
comm = crypten_lite.comm.get()


def counted(fn):
    """fn()'s result and the rounds / bytes this party sent while computing it (not revealing)."""
    comm.reset_communication_stats()
    out = fn()
    stats = comm.get_communication_stats()
    return out, {"rounds": stats["rounds"], "bytes_sent": stats["bytes_sent"]}


product, mul_cost = counted(lambda: a * c)
matrix, matmul_cost = counted(lambda: a @ b)
result = {"add": (a + c).get_plain_text().tolist(), "mul": product.get_plain_text().tolist(),
          "matmul": matrix.get_plain_text().tolist(), "sum": product.sum().get_plain_text().item(),
          "mul_cost": mul_cost, "matmul_cost": matmul_cost}
print("result", json.dumps(result), flush=True)
if rank == 0:
    config = crypten_lite.session.current().config
    print("session", json.dumps({"protocol": config.protocol, "dealer": config.dealer,
                                 "env_dealer": os.environ.get("CRYPTEN_LITE_DEALER")}), flush=True)
    launcher = os.getppid()
    children = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            if ppid == launcher:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    children.append(f.read().replace(b"\0", b" ").decode().strip())
        except (OSError, ValueError, IndexError):
            pass  # a process that ended meanwhile
    print("launcher-children", json.dumps(sorted(children)), flush=True)
crypten_lite.uninit()
