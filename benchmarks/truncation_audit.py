"""Where the 2-party local truncations of a workload could fail, and how often: an audit.

Between 2 parties the default truncation is local (mpc/truncation.py): no communication, but
each truncated element x fails by a wrap (the result is off by about 2^(64 - bits) ulps) with
probability |x| / 2^64, x the untruncated value. This script runs one inference of a bench
workload between 2 real parties and the dealer, records every local truncation's shares
(the script's own temporary files, deleted afterwards), adds them up in this process and
reports, per call site, the elements truncated and the expected number of wrap failures
sum |x| / 2^64. Exact truncations (protocol.truncate_exact, CRYPTEN_LITE_TRUNCATION=exact, 3
parties) cannot fail; they are counted apart. Where the polynomial of every bucket is evaluated and
one selected (fast.bucket_polys_gen: LayerNorm's 1/sqrt, the softmax's 1/sum), the values
outside their bucket are garbage that the selection cancels exactly, whatever their
truncation did: such a site counts, per position, the bucket with the smallest value, which
is of the in-bucket value's order. A debugging and design tool: it reveals every
intermediate value to this process, so never point it at real data.

    python benchmarks/truncation_audit.py bert_layer_tiny
    python benchmarks/truncation_audit.py bert_base_layer_seq128 --top 12     # a minute
    python benchmarks/truncation_audit.py bert_base_seq128                    # whole model, minutes
"""

from __future__ import annotations

import argparse
import collections
import json
import pathlib
import sys
import tempfile
import traceback

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
PKG = str(ROOT / "crypten_lite")
BUCKETS = "bucket_polys_gen"    # functions.fast: the polynomials of every bucket, one selected


def _site() -> str:
    """The call site of a truncation: the innermost crypten_lite frames outside mpc/."""
    frames = [f for f in traceback.extract_stack()[:-1] if f.filename.startswith(PKG)]
    outer = [f for f in frames if "/mpc/" not in f.filename][-3:]
    return " < ".join(f"{pathlib.Path(f.filename).relative_to(PKG)}:{f.lineno} {f.name}"
                      for f in reversed(outer))


def party(name: str, folder: str) -> dict:
    """In each party: run the workload once unrecorded (loading, plan), then once recording
    every truncation's shares into `folder`."""
    import numpy as np
    from crypten_lite import bench
    from crypten_lite.mpc import truncation
    from crypten_lite.session import current

    rank = current().rank
    state = {"on": False, "i": 0, "exact": collections.Counter()}
    sites: list[str] = []
    local, mask = truncation._local, truncation._mask

    def recording_local(x, bits, *owned):    # every local truncation goes through _local
        if state["on"]:
            np.save(f"{folder}/{rank}_{state['i']}.npy", x.numpy())
            sites.append(_site())
            state["i"] += 1
        return local(x, bits, *owned)

    def recording_mask(items):               # every exact one masks its input in _mask
        if state["on"]:
            n = sum(x.numel() for x, bits in items if bits)
            if n:
                state["exact"][_site()] += n
        return mask(items)

    measure = bench._measure

    def once(run, plan_name=None):
        run()                                     # load the model, mask its weights, warm up
        state["on"] = True
        try:
            out, ref = run()
        finally:
            state["on"] = False
        return {"max_error": float((out.double() - ref.double()).abs().max())}

    truncation._local, truncation._mask, bench._measure = recording_local, recording_mask, once
    try:
        row = bench.WORKLOADS[name]()
    finally:
        truncation._local, truncation._mask, bench._measure = local, mask, measure
    return {"sites": sites, "exact": dict(state["exact"]), "max_error": row["max_error"]}


def audit(name: str) -> dict:
    import numpy as np
    from crypten_lite import bench
    from crypten_lite.mpc import PartyPool
    with tempfile.TemporaryDirectory() as folder:
        with PartyPool(2, provider="dealer", timeout=3600 if name in bench.LARGE else 600) as pool:
            res = pool.run(party, name, folder)
        if res[0]["sites"] != res[1]["sites"]:
            raise SystemExit("the parties truncated in different orders")
        per = collections.defaultdict(lambda: [0, 0.0, 0.0])
        for i, site in enumerate(res[0]["sites"]):
            x = (np.load(f"{folder}/0_{i}.npy") + np.load(f"{folder}/1_{i}.npy")).astype(np.float64)
            n = x.size
            if BUCKETS in site:
                # every bucket's polynomial (axis 0): out of its bucket a value is garbage, which
                # the selection cancels exactly; the in-bucket one is of the smallest's order
                x = np.abs(x).min(axis=0)
            row = per[site]
            row[0] += n
            row[1] += float(np.abs(x).sum()) / 2.0 ** 64
            row[2] = max(row[2], float(np.abs(x).max()) / 2.0 ** 64)
    return {"workload": name, "max_error": res[0]["max_error"],
            "local": {k: {"elements": v[0], "expected_failures": v[1], "max_failure_probability": v[2]}
                      for k, v in per.items()},
            "exact": res[0]["exact"]}


def report(data: dict, top: int) -> str:
    local = data["local"]
    total = sum(v["expected_failures"] for v in local.values())
    lines = [f"{data['workload']}: max error {data['max_error']:.2g}",
             f"local truncations: {sum(v['elements'] for v in local.values()):,} elements at "
             f"{len(local)} call sites, expected wrap failures per inference {total:.3g}",
             f"exact truncations: {sum(data['exact'].values()):,} elements (cannot fail)", "",
             "expected failures | elements | largest per-element probability | call site"]
    for site, v in sorted(local.items(), key=lambda kv: -kv[1]["expected_failures"])[:top]:
        lines.append(f"{v['expected_failures']:.2e} | {v['elements']:,} | "
                     f"{v['max_failure_probability']:.1e} | {site}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workload", help="a bench workload (crypten-lite bench --list)")
    ap.add_argument("--top", type=int, default=10, help="call sites to list (default 10)")
    ap.add_argument("--json", help="also write the full audit to this file")
    args = ap.parse_args(argv)
    from crypten_lite import bench
    if args.workload not in bench.WORKLOADS:
        ap.error(f"unknown workload {args.workload!r}; known: {', '.join(sorted(bench.WORKLOADS))}")
    data = audit(args.workload)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(data, indent=1) + "\n")
    print(report(data, args.top))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
