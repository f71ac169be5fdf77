"""Where the rounds and bytes of one transformer (BERT) encoder layer go, measured.

Runs a bench workload (crypten_lite.bench: bert_layer_tiny by default, bert_base_layer_seq128
with --large) between 2 real parties and the dealer, attributes every online round, byte
sent and dealer byte of one inference to a phase (linear layers, attention matmuls,
softmax, GELU, LayerNorm; crypten_lite.bench.cost_split) and writes docs/transformer_split.json.

    python benchmarks/transformer_split.py [--only bert_base_layer_seq128] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
OUT = ROOT / "docs" / "transformer_split.json"
SHAPES = {"bert_layer_tiny": "hidden 32, 2 heads, FFN 64, seq 8",
          "bert_base_layer_seq128": "hidden 768, 12 heads, FFN 3072, seq 128"}


def measure(name: str) -> dict:
    from crypten_lite import bench
    from crypten_lite.mpc import PartyPool
    with PartyPool(2, provider="dealer", timeout=3600 if name in bench.LARGE else 600) as pool:
        res = pool.run(bench.cost_split, name)
    phases = {}
    for phase in sorted(set(res[0]["phases"]) | set(res[1]["phases"])):
        per = [r["phases"].get(phase, {"rounds": 0, "bytes_sent": 0, "dealer_bytes": 0}) for r in res]
        phases[phase] = {"rounds": per[0]["rounds"], "bytes_sent": [p["bytes_sent"] for p in per],
                         "dealer_bytes": per[0]["dealer_bytes"]}
    t = [r["total"] for r in res]
    return {"shape": SHAPES.get(name, ""), "phases": phases,
            "total": {"rounds": t[0]["rounds"], "bytes_sent": [x["bytes_sent"] for x in t],
                      "dealer_bytes": t[0]["dealer_bytes"] + t[0]["offline_dealer_bytes"],
                      "max_error": t[0]["max_error"]}}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", action="append", choices=sorted(SHAPES), help="workload(s) to (re)measure")
    ap.add_argument("--out", default=str(OUT))
    args = ap.parse_args(argv)
    path = pathlib.Path(args.out)
    data = json.loads(path.read_text()) if path.exists() else {}
    data["about"] = ("Rounds, bytes sent per party and dealer bytes of one inference of one encoder "
                     "layer, 2 parties + dealer, by phase. Written by python benchmarks/transformer_split.py; "
                     "the bert_layer_tiny entry is asserted by tests/protocol/test_transformer_blocks.py.")
    layers = data.setdefault("layers", {})
    for name in args.only or ["bert_layer_tiny"]:
        layers[name] = measure(name)
        print(name, json.dumps(layers[name]), file=sys.stderr)
    path.write_text(json.dumps(data, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
