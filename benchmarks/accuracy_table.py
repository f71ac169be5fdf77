"""Error table of crypten_lite's nonlinear functions on dense grids of their domains.

Runs every function on 2 parties over gRPC (a local PartyPool with the dealer) and compares
with torch in float64 applied to the SAME fixed-point inputs (16 fractional bits). Prints a
Markdown table (the one in docs/functions.md) and, with --json, one JSON line per function
with max abs / max rel error, rounds and bytes per element sent by one party.

    python benchmarks/accuracy_table.py [--points 100000] [--parties 2] [--json out.jsonl]
"""

from __future__ import annotations

import argparse
import json

import torch
import torch.nn.functional as F

SCALE = 2 ** 16


def _q(t: torch.Tensor) -> torch.Tensor:
    return torch.round(t.double() * SCALE) / SCALE


def _grids(n: int) -> dict:
    """name -> (input grid, CrypTensor method, torch reference, relative-error floor)."""
    lin, log = torch.linspace, torch.logspace
    return {
        "exp": (lin(-16, 8, n), lambda x: x.exp(), torch.exp, 1e-3),
        "reciprocal": (log(-2, 3, n), lambda x: x.reciprocal(), torch.reciprocal, 0.0),
        "reciprocal (x<0)": (-log(-2, 3, n), lambda x: x.reciprocal(), torch.reciprocal, 0.0),
        "sqrt": (log(-2, 4, n), lambda x: x.sqrt(), torch.sqrt, 0.0),
        "inv_sqrt": (log(-2, 4, n), lambda x: x.inv_sqrt(), torch.rsqrt, 0.0),
        "log": (log(-3, 4, n), lambda x: x.log(), torch.log, None),
        "sigmoid": (lin(-30, 30, n), lambda x: x.sigmoid(), torch.sigmoid, None),
        "tanh": (lin(-30, 30, n), lambda x: x.tanh(), torch.tanh, None),
        "erf": (lin(-30, 30, n), lambda x: x.erf(), torch.erf, None),
        "gelu": (lin(-30, 30, n), lambda x: x.gelu(), F.gelu, None),
        "gelu (tanh)": (lin(-30, 30, n), lambda x: x.gelu("tanh"),
                        lambda t: F.gelu(t, approximate="tanh"), None),
        "silu": (lin(-30, 30, n), lambda x: x.silu(), F.silu, None),
        "cos": (lin(-100, 100, n), lambda x: x.cos(), torch.cos, None),
        "sin": (lin(-100, 100, n), lambda x: x.sin(), torch.sin, None),
        "x / y (y in [0.1, 100])": (log(-1, 2, n), lambda y: (y * 0 + 1.5) / y, lambda t: 1.5 / t, 0.0),
    }


def measure(n: int):
    """Party function: errors, rounds and bytes per element for every grid."""
    import crypten_lite
    from crypten_lite import comm

    c = comm.get()
    rows = []
    for name, (grid, fn, ref_fn, rel_floor) in _grids(n).items():
        x = crypten_lite.cryptensor(grid, src=0)
        q = _q(grid)
        c.reset_communication_stats()
        y = fn(x)
        st = c.get_communication_stats()
        got = y.get_plain_text().double()
        ref = ref_fn(q)
        err = (got - ref).abs()
        row = {"function": name, "lo": float(grid.min()), "hi": float(grid.max()), "points": n,
               "max_abs": err.max().item(), "rounds": st["rounds"],
               "bytes_per_element": st["bytes_sent"] / n}
        if rel_floor is not None:
            keep = ref.abs() >= rel_floor
            row["max_rel"] = (err[keep] / ref.abs()[keep]).max().item()
            row["rel_where"] = f"|f| >= {rel_floor:g}" if rel_floor else "all"
        rows.append(row)
    # softmax of [1000, 10] logits in [-10, 10]
    g = torch.Generator().manual_seed(0)
    logits = torch.rand(1000, 10, generator=g) * 20 - 10
    x = crypten_lite.cryptensor(logits, src=0)
    c.reset_communication_stats()
    y = x.softmax(1)
    st = c.get_communication_stats()
    err = (y.get_plain_text().double() - _q(logits).softmax(1)).abs()
    rows.append({"function": "softmax [1000, 10]", "lo": -10.0, "hi": 10.0, "points": 10000,
                 "max_abs": err.max().item(), "rounds": st["rounds"],
                 "bytes_per_element": st["bytes_sent"] / 10000})
    return rows


def markdown(rows) -> str:
    lines = ["| function | domain | max abs error | max rel error | rounds | bytes/elt |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        rel = f"{r['max_rel']:.2e} ({r['rel_where']})" if "max_rel" in r else "-"
        lines.append(f"| {r['function']} | [{r['lo']:g}, {r['hi']:g}] | {r['max_abs']:.2e} | {rel} | "
                     f"{r['rounds']} | {r['bytes_per_element']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int, default=100_000, help="grid points per function")
    parser.add_argument("--parties", type=int, default=2)
    parser.add_argument("--json", help="also write JSON lines here")
    args = parser.parse_args()
    from crypten_lite.mpc import PartyPool
    with PartyPool(args.parties, timeout=300) as pool:
        rows = pool.run(measure, args.points)[0]
    print(markdown(rows))
    if args.json:
        with open(args.json, "w") as f:
            for r in rows:
                f.write(json.dumps(dict(r, parties=args.parties)) + "\n")


if __name__ == "__main__":
    main()
