"""LeNet batch 1's run, per function: cProfile's call counts (deterministic) and CPU per inference.

Two real party processes and the dealer (PartyPool, gRPC) load LeNet as
benchmarks/profile_lenet.py does (benchmarks/profile_lenet_model.py), record the plan of one inference, then profile --n
inferences (each after its own offline.prefetch) with cProfile on the main thread's CPU clock.
For each party it prints the calls per inference (Python and C; those of torch's C
functions; those of numpy-named builtins), the --top functions by own CPU (microseconds per
inference, calls per inference, cumulative) and the --top functions by calls. The counts do
not depend on the load; the microseconds do (and carry cProfile's own cost per call).

    python benchmarks/profile_lenet_calls.py [N] [TOP]     (defaults: 10 inferences, top 40)
"""
import cProfile
import os
import pstats
import sys
import time

from crypten_lite.mpc.launcher import PartyPool

LENET_MODEL = os.path.join(os.path.dirname(os.path.abspath(__file__)), "profile_lenet_model.py")


def _party(n, top):
    import runpy

    from crypten_lite.mpc import offline
    lenet_b1 = runpy.run_path(LENET_MODEL)  # by path: a party process cannot import benchmarks/
    setup = lenet_b1["private_lenet_b1"]()
    c, private, x = setup["comm"], setup["private"], setup["x"]
    plan = lenet_b1["recorded_plan"](setup)
    prof = cProfile.Profile(time.thread_time)
    for i in range(n + 1):
        c.barrier()
        offline.prefetch(plan)
        if i:
            prof.enable()
        y = private(x).get_plain_text()
        if i:
            prof.disable()
    max_error = float((y - setup["want"]).abs().max())
    st = pstats.Stats(prof).stats
    rows = []
    calls = torchc = numpyc = 0
    for (f, l, name), (cc, nc, tt, ct, _) in st.items():
        calls += nc
        if f == "~" and ("torch" in name or "Tensor" in name):
            torchc += nc
        if "numpy" in name and f == "~":
            numpyc += nc
        rows.append((tt / n * 1e6, nc / n, f"{os.path.basename(f)}:{l}({name})", ct / n * 1e6))
    rows.sort(reverse=True)
    return {"rank": c.rank, "max_error": max_error, "calls": calls / n, "torch_calls": torchc / n, "numpy_method_calls": numpyc / n,
            "top": [(round(a, 1), b, s, round(d, 1)) for a, b, s, d in rows[:top]],
            "bycount": sorted([(b, s) for a, b, s, d in rows], reverse=True)[:top]}


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 10
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 40
    with PartyPool(2, timeout=300) as pool:
        parts = pool.run(_party, n, top)
    for p in parts:
        print(f"== party {p['rank']}: calls/inf {p['calls']:.0f}, torch C calls {p['torch_calls']:.0f}, numpy-named {p['numpy_method_calls']:.0f}; "
              f"max error {p['max_error']:.2g}")
        print("  own us/inf | calls/inf | func | cum us/inf")
        for r in p["top"]:
            print("  %8.1f %7.1f %s %8.1f" % (r[0], r[1], r[2], r[3]))
        print("  -- by count")
        for b, s in p["bycount"]:
            print("  %7.1f %s" % (b, s))
    print("load", os.getloadavg())


if __name__ == "__main__":
    main()
