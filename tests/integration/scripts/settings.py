"""Reports the session's truncation and precision and what one fixed-point product cost."""
import torch

import crypten_lite
from crypten_lite import comm
from crypten_lite.session import current

crypten_lite.init()
rank = crypten_lite.get_rank()
x = crypten_lite.cryptensor(torch.tensor([1.5, -2.0]) if rank == 0 else None, src=0)
y = crypten_lite.cryptensor(torch.tensor([2.0, 4.0]) if rank == 1 else None, src=1)
comm.get().reset_communication_stats()
z = x * y
rounds = int(comm.get().get_communication_stats()["rounds"])
cfg = current().config
print("truncation", cfg.truncation, "precision", cfg.precision, "product rounds", rounds,
      "result", [round(v, 3) for v in z.get_plain_text().tolist()])
crypten_lite.uninit()
