"""A tiny private computation: party 0's x times party 1's y, revealed."""
import sys

import torch

import crypten_lite

crypten_lite.init()
rank = crypten_lite.get_rank()
x = crypten_lite.cryptensor(torch.tensor([1.5, -2.0, 3.0]) if rank == 0 else None, src=0)
y = crypten_lite.cryptensor(torch.tensor([2.0, 4.0, -1.0]) if rank == 1 else None, src=1)
z = (x * y + x).get_plain_text()
print("result", [round(v, 3) for v in z.tolist()], "args", sys.argv[1:])
crypten_lite.uninit()
