"""The transformer functions' rows of docs/functions.md ("Transformer blocks"): rounds, MB
sent per party, max error against torch float64 and seconds of softmax (the attention path),
GELU, SiLU and LayerNorm at BERT-base shapes, between 2 real parties and the dealer.

    python benchmarks/transformer_functions.py      # prints the table rows
"""
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import crypten_lite  # noqa: E402
from crypten_lite import comm  # noqa: E402
from crypten_lite.mpc.launcher import PartyPool  # noqa: E402


def cost_pair(fn):
    """(fn(), (rounds, bytes sent by this party)), the parties lined up first."""
    c = comm.get()
    c.barrier()
    c.reset_communication_stats()
    out = fn()
    st = c.get_communication_stats()
    return out, (int(st["rounds"]), int(st["bytes_sent"]))

def party():
    from crypten_lite.functions.fast import softmax_last
    g = torch.Generator().manual_seed(1)
    rows = {}
    def run(name, x, fn, ref):
        comm.get().barrier()
        t0 = time.perf_counter()
        y, c = cost_pair(fn)
        dt = time.perf_counter() - t0
        err = (y.get_plain_text().double() - ref).abs().max().item()
        rows[name] = (c[0], round(c[1] / 1e6, 2), f"{err:.1e}", round(dt, 1))
    s = torch.randn(1536, 128, generator=g) * 3
    xs = crypten_lite.cryptensor(s, src=1)
    q = lambda t: torch.round(t.double() * 65536) / 65536
    run("softmax [1536, 128] (12 heads x 128 rows)", xs, lambda: softmax_last(xs), q(s).softmax(-1))
    a = torch.randn(128, 3072, generator=g) * 3
    xa = crypten_lite.cryptensor(a, src=0)
    run("gelu [128, 3072]", xa, lambda: xa.gelu(), F.gelu(q(a)))
    run("silu [128, 3072]", xa, lambda: xa.silu(), F.silu(q(a)))
    h = torch.randn(128, 768, generator=g) * 2 + 1
    xh = crypten_lite.cryptensor(h, src=0)
    w = torch.rand(768, generator=g) + 0.5
    b = torch.randn(768, generator=g)
    run("layer_norm [128, 768]", xh, lambda: F.layer_norm(xh, (768,), w, b, 1e-5),
        F.layer_norm(q(h), (768,), w.double(), b.double(), 1e-5))
    return rows

if __name__ == "__main__":
    with PartyPool(2, timeout=900) as pool:
        for k, v in pool.run(party)[0].items():
            print(f"| {k} | " + " / ".join(str(x) for x in v) + " |")
