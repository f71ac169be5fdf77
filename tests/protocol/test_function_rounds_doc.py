"""The "rounds (2p)" columns of docs/functions.md are the code's: every function named there
runs between 2 real parties (and the 3-party figures quoted after the table at 3), and the
table cell must say the measured rounds. A change of a circuit makes this fail until the
table follows."""

from __future__ import annotations

import pathlib
import re

import torch
import torch.nn.functional as F

import crypten_lite
from crypten_lite import comm

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _rounds(fn) -> int:
    c = comm.get()
    c.reset_communication_stats()
    fn()
    return int(c.get_communication_stats()["rounds"])


def party_rounds() -> dict[str, int]:
    torch.manual_seed(0)
    x = crypten_lite.cryptensor(torch.rand(64) * 4 - 2)
    y = crypten_lite.cryptensor(torch.rand(64) * 4 - 2)
    pos = crypten_lite.cryptensor(torch.rand(64) * 4 + 0.5)
    rows = crypten_lite.cryptensor(torch.randn(100, 10))
    norm_in = crypten_lite.cryptensor(torch.randn(4, 16))
    ops = {
        "relu": lambda: x.relu(), "abs": lambda: x.abs(), "sign": lambda: x.sign(),
        "clamp": lambda: x.clamp(-1, 1), "maximum": lambda: torch.maximum(x, y),
        "exp": lambda: x.exp(), "reciprocal": lambda: pos.reciprocal(), "div": lambda: x / pos,
        "sqrt": lambda: pos.sqrt(), "inv_sqrt": lambda: pos.rsqrt(), "log": lambda: pos.log(),
        "sigmoid": lambda: x.sigmoid(), "tanh": lambda: x.tanh(), "erf": lambda: x.erf(),
        "gelu": lambda: F.gelu(x), "silu": lambda: F.silu(x),
        "softmax": lambda: rows.softmax(-1), "log_softmax": lambda: rows.log_softmax(-1),
        "floor": lambda: x.floor(), "ceil": lambda: x.ceil(), "trunc": lambda: x.trunc(),
        "rms_norm": lambda: F.rms_norm(norm_in, (16,)),
        "pairwise_max_10": lambda: rows.max(-1, method="pairwise"),
        "tree_max_2": lambda: crypten_lite.cryptensor(torch.randn(3, 2)).max(-1),
        "tree_max_10": lambda: rows.max(-1),
    }
    out = {}
    with crypten_lite.no_grad():
        for name, fn in ops.items():
            out[name] = _rounds(fn)
    norm_in.requires_grad = True
    out["rms_norm_grad"] = _rounds(lambda: F.rms_norm(norm_in, (16,)))
    return out


def _cells() -> dict[str, str]:
    """function name (backquoted, first of a cell) -> the table's last cell."""
    cells = {}
    for line in (ROOT / "docs" / "functions.md").read_text().splitlines():
        if not line.startswith("| `"):
            continue
        parts = [p.strip() for p in line.strip().strip("|").split("|")]
        for name in re.findall(r"`([a-z_]+)", parts[0]):
            cells.setdefault(name, parts[-1])
    return cells


def test_functions_md_rounds_are_measured(pool2, pool3):
    two = pool2.run(party_rounds)[0]
    three = pool3.run(party_rounds)[0]
    cells = _cells()
    want = {name: str(two[name]) for name in (
        "relu", "abs", "sign", "clamp", "maximum", "exp", "reciprocal", "div", "sqrt", "log",
        "sigmoid", "tanh", "erf", "gelu", "silu")}
    want["softmax"] = f"{two['softmax']} / {two['log_softmax']} (dim 10)"
    want["floor"] = f"{two['floor']} / {two['ceil']} / {two['trunc']}"
    want["rms_norm"] = f"{two['rms_norm']} (2 parties; 3 parties: {three['rms_norm']})"
    assert two["inv_sqrt"] == two["sqrt"]
    assert two["rms_norm_grad"] == two["rms_norm"]   # the fast path with autograd too
    wrong = {k: (cells.get(k), v) for k, v in want.items() if cells.get(k) != v}
    assert not wrong, f"docs/functions.md says (cell, code): {wrong}"
    text = " ".join((ROOT / "docs" / "functions.md").read_text().split())
    phrases = [f"(exp {three['exp']}, sigmoid {three['sigmoid']}, softmax {three['softmax']})",
               f"({two['pairwise_max_10']} rounds for k = 10 instead of {two['tree_max_10']})",
               f"round: {two['tree_max_2']} rounds per level"]
    missing = [p for p in phrases if p not in text]
    assert not missing, f"docs/functions.md no longer states the code's figures: {missing}"
