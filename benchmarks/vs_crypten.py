"""CrypTen 0.4.1 (TFP provider) and SPU SEMI2K beside `crypten-lite bench`, in one run: mul 1M, matmul 256, matmul 1024; LeNet b1; the wire's limits.

CrypTen runs from its own virtual environment (`bash benchmarks/peer_envs.sh crypten` prints its
python), never as a dependency of crypten_lite: this script starts that python on a small
program (CRYPTEN_PROGRAM below) that runs two CrypTen parties (crypten.mpc.run_multiprocess,
torch.distributed over loopback) and times each op end to end: from shares of x and y to shares
of the product, its triple made by CrypTen's TFP provider (party 0 deals, no communication)
and its one opening round and truncation included. The crypten_lite side is
`crypten-lite bench` twice in the same run: with its offline phase (online seconds, the dealer's
corrections fetched before) and with --no-offline (end to end: the dealer's corrections fetched
online). Both sides: 2 parties on this machine, median of --repeat runs after a warm-up.

    python benchmarks/vs_crypten.py [--repeat 5] [--json out.jsonl] [--no-spu]

It also prints issue 32's targets, each with its measured value: transport_16MB's time as a
multiple of raw TCP's (raw_tcp_16MB), mul_1M online, reveal_4 as a multiple of a raw TCP
round trip (raw_tcp_rtt), mul_4 as a multiple of reveal_4 (both median of 30), and LeNet
batch 1 end to end against SPU 0.9.5 SEMI2K's (SPU_PROGRAM: the same layers,
both SPU parties as threads over its in-memory link, from `bash benchmarks/peer_envs.sh spu`).
LeNet's end to end is one inference with its own offline phase plus its run (bench's
end_to_end_seconds_median: the plan recorded once, in the warm-up, as a model is deployed;
each inference's plan sent to the dealer in one exchange before its first op, which returns
the plan's first chunk of corrections, the rest pulled during the run);
the figure without a plan (--no-offline: the dealer asked op by op, online) is printed beside.

Seconds depend on the load of the machine: the rows record the 1-minute load average.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

OPS = {"mul_1M": ("mul", (1_000_000,), (1_000_000,)),
       "matmul_256": ("matmul", (256, 256), (256, 256)),
       "matmul_1024": ("matmul", (1024, 1024), (1024, 1024))}

CRYPTEN_PROGRAM = r'''
import json, statistics, sys, time
import torch
import crypten
import crypten.communicator as comm
from crypten import mpc

OPS = json.loads(sys.argv[1]); REPEAT = int(sys.argv[2]); OUT = sys.argv[3]

@mpc.run_multiprocess(world_size=2)
def main():
    crypten.cfg.mpc.provider = "TFP"
    rows = {}
    g = torch.Generator().manual_seed(1)
    for name, (op, ashape, bshape) in OPS.items():
        a, b = torch.randn(*ashape, generator=g), torch.randn(*bshape, generator=g)
        x, y = crypten.cryptensor(a, src=0), crypten.cryptensor(b, src=1)
        times = []
        for i in range(REPEAT + 1):  # the first is a warm-up
            comm.get().barrier()
            start = time.perf_counter()
            z = x * y if op == "mul" else x.matmul(y)
            seconds = time.perf_counter() - start
            if i:
                times.append(seconds)
        want = a * b if op == "mul" else a @ b
        diff = (z.get_plain_text() - want).abs()
        rows[name] = {"seconds_median": statistics.median(times), "seconds_min": min(times),
                      "seconds_max": max(times), "max_error": float(diff.max()),
                      "elements_off_by_more_than_0.01": int((diff > 0.01).sum()),
                      "elements": diff.numel()}
    if comm.get().get_rank() == 0:
        with open(OUT, "w") as f:
            json.dump(rows, f)

main()
'''


# SPU's SEMI2K (2 parties, FM64, its default trusted-first-party Beaver) on LeNet batch 1: the
# same layers as crypten_lite.models.lenet (weights secret, input secret), both parties as
# threads over SPU's in-memory link, timed from shares of the inputs to shares of the logits
# (compilation excluded), median of REPEAT after a warm-up.
SPU_PROGRAM = r'''
import json, statistics, sys, threading, time
import jax, jax.numpy as jnp, numpy as np
import spu, spu.libspu as libspu, spu.utils.frontend as spu_fe

REPEAT = int(sys.argv[1]); OUT = sys.argv[2]
rng = np.random.default_rng(0)  # benchmark inputs and weights only

def conv(x, w, b):
    y = jax.lax.conv_general_dilated(x, w, (1, 1), "VALID", dimension_numbers=("NCHW", "OIHW", "NCHW"))
    return y + b[None, :, None, None]

def pool(x):
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")

def lenet(x, w1, b1, w2, b2, w3, b3, w4, b4, w5, b5):
    x = pool(jnp.maximum(conv(x, w1, b1), 0))
    x = pool(jnp.maximum(conv(x, w2, b2), 0))
    x = x.reshape(x.shape[0], -1)
    x = jnp.maximum(x @ w3 + b3, 0)
    x = jnp.maximum(x @ w4 + b4, 0)
    return x @ w5 + b5

shapes = [(1, 1, 28, 28), (6, 1, 5, 5), (6,), (16, 6, 5, 5), (16,), (256, 120), (120,),
          (120, 84), (84,), (84, 10), (10,)]
args = [(rng.standard_normal(s) * (0.2 if i else 1.0)).astype(np.float32) for i, s in enumerate(shapes)]
config = libspu.RuntimeConfig(protocol=libspu.ProtocolKind.SEMI2K, field=libspu.FieldType.FM64)
io = spu.Io(2, config)
names = [f"in{i}" for i in range(len(args))]
executable, _ = spu_fe.compile(spu_fe.Kind.JAX, lenet, args, {}, names,
                               [libspu.Visibility.VIS_SECRET] * len(args), lambda out: ["out"])
desc = libspu.link.Desc()
for r in range(2):
    desc.add_party(f"id_{r}", f"thread_{r}")

def once():
    shares = [io.make_shares(a, libspu.Visibility.VIS_SECRET) for a in args]
    outs = [None, None]

    def party(rank):
        lctx = libspu.link.create_mem(desc, rank)
        rt = spu.Runtime(lctx, libspu.RuntimeConfig(config))
        for i, sh in enumerate(shares):
            rt.set_var(executable.input_names[i], sh[rank])
        barrier.wait()
        start = time.perf_counter()
        rt.run(executable)
        outs[rank] = (rt.get_var("out"), time.perf_counter() - start)
    barrier = threading.Barrier(2)
    threads = [threading.Thread(target=party, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    got = io.reconstruct([o[0] for o in outs])
    ref = np.asarray(lenet(*[jnp.asarray(a) for a in args]))
    return max(o[1] for o in outs), float(np.abs(np.asarray(got) - ref).max())

runs = [once() for _ in range(REPEAT + 1)][1:]
times = [t for t, _ in runs]
with open(OUT, "w") as f:
    json.dump({"lenet_b1": {"seconds_median": statistics.median(times), "seconds_min": min(times),
                            "seconds_max": max(times), "max_error": runs[-1][1]}}, f)
'''


def spu_rows(repeat: int) -> dict:
    """SPU SEMI2K's LeNet batch 1 (SPU_PROGRAM, run by the SPU venv's python)."""
    with tempfile.TemporaryDirectory() as tmp:
        out, program = os.path.join(tmp, "spu.json"), os.path.join(tmp, "spu_lenet.py")
        with open(program, "w") as f:
            f.write(SPU_PROGRAM)
        subprocess.run([peer_python("spu"), program, str(repeat), out], check=True, timeout=1800, cwd=tmp)
        with open(out) as f:
            return json.load(f)


def peer_python(name: str) -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    return subprocess.run(["bash", os.path.join(here, "peer_envs.sh"), name], check=True,
                          capture_output=True, text=True).stdout.strip().splitlines()[-1]


def crypten_rows(repeat: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "crypten.json")
        program = os.path.join(tmp, "crypten_ops.py")
        with open(program, "w") as f:
            f.write(CRYPTEN_PROGRAM)
        subprocess.run([peer_python("crypten"), program, json.dumps(OPS), str(repeat), out],
                       check=True, timeout=1800, cwd=tmp)
        with open(out) as f:
            return json.load(f)


# Our rows beside the peers': the wire's limits and the small operations (bench brings
# raw_tcp_16MB, reveal_4 and raw_tcp_rtt along), LeNet batch 1 against SPU SEMI2K.
EXTRA = ["transport_16MB", "mul_4", "lenet_b1"]
SMALL_REPEAT = 30  # the small operations take a millisecond: more samples for their medians


def ours(repeat: int, offline: bool, names: list[str]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "bench.jsonl")
        cmd = [sys.executable, "-m", "crypten_lite.cli", "bench", "--repeat", str(repeat), "--out", out]
        for name in names:
            cmd += ["--only", name]
        if not offline:
            cmd.append("--no-offline")
        subprocess.run(cmd, check=True, timeout=1800, stderr=subprocess.DEVNULL)
        with open(out) as f:
            return {r["workload"]: r for r in map(json.loads, f)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--json", default="", help="append one JSON line per workload to this file")
    parser.add_argument("--no-spu", action="store_true", help="skip SPU SEMI2K's LeNet batch 1")
    args = parser.parse_args()
    online = ours(args.repeat, True, list(OPS) + ["transport_16MB", "lenet_b1"])
    online.update(ours(max(args.repeat, SMALL_REPEAT), True, ["mul_4"]))
    e2e = ours(args.repeat, False, list(OPS) + ["lenet_b1"])
    peer = crypten_rows(args.repeat)
    spu = {} if args.no_spu else spu_rows(args.repeat)
    load = round(os.getloadavg()[0], 1)
    print(f"{'workload':12} {'ours online s':>13} {'ours dealer s':>13} {'ours e2e s':>10} "
          f"{'CrypTen TFP s':>13} {'e2e ratio':>9}")
    lines = []
    for name in OPS:
        mine, mine_e2e, theirs = online[name], e2e[name], peer[name]
        row = {"workload": name, "parties": 2, "ours_online_s": mine["seconds_median"],
               "ours_offline_s": mine["offline_seconds"], "ours_end_to_end_s": mine_e2e["seconds_median"],
               "ours_max_error": mine_e2e["max_error"], "crypten_tfp_s": theirs["seconds_median"],
               "crypten_tfp_min_s": theirs["seconds_min"], "crypten_max_error": theirs["max_error"],
               "crypten_elements_off_by_more_than_0.01": theirs["elements_off_by_more_than_0.01"],
               "elements": theirs["elements"],
               "end_to_end_ratio": mine_e2e["seconds_median"] / theirs["seconds_median"],
               "repeat": args.repeat, "load_average_1min": load, "cpus": os.cpu_count()}
        lines.append(row)
        print(f"{name:12} {row['ours_online_s']:>13.4f} {row['ours_offline_s']:>13.4f} "
              f"{row['ours_end_to_end_s']:>10.4f} {row['crypten_tfp_s']:>13.4f} {row['end_to_end_ratio']:>9.2f}")
    targets = [("transport_16MB time / raw_tcp_16MB", online["transport_16MB"].get("times_raw_tcp"), 1.5),
               ("mul_1M online s", online["mul_1M"]["seconds_median"], 0.035),
               ("reveal_4 time / raw TCP round trip", online["reveal_4"].get("times_raw_tcp_rtt"), 3.0),
               ("mul_4 time / reveal_4", online["mul_4"].get("times_reveal_4"), 2.0)]
    # LeNet b1 end to end: one inference with its own offline phase (the plan recorded in the
    # warm-up; its plan sent to the dealer in one exchange before the first op, which returns
    # the first chunk of corrections: the later chunks are pulled during the run),
    # then its run; SPU's figure is its run alone (its Beaver triples made inside it).
    lenet_e2e = online["lenet_b1"]["end_to_end_seconds_median"]
    if spu:
        targets.append(("lenet_b1 e2e / SPU SEMI2K", lenet_e2e / spu["lenet_b1"]["seconds_median"], 0.5))
    print(f"\n{'target':38} {'measured':>9} {'at most':>8}")
    for what, value, limit in targets:
        shown = f"{value:>9.3f}" if value is not None else f"{'-':>9}"
        print(f"{what:38} {shown} {limit:>8g}  {'met' if value is not None and value <= limit else 'NOT met'}")
        lines.append({"target": what, "measured": value, "at_most": limit, "load_average_1min": load})
    small = {n: online[n]["seconds_median"] for n in ("raw_tcp_rtt", "reveal_4", "mul_4")}
    print("small ops (median s): " + ", ".join(f"{n} {v:.6f}" for n, v in small.items()))
    lenet = (f"ours online {online['lenet_b1']['seconds_median']:.4f} s + offline "
             f"{online['lenet_b1']['offline_seconds']:.4f} s, e2e {lenet_e2e:.4f} s (without a plan, "
             f"the dealer asked op by op: {e2e['lenet_b1']['seconds_median']:.4f} s)")
    if spu:
        lenet += f"; SPU SEMI2K {spu['lenet_b1']['seconds_median']:.4f} s (max error {spu['lenet_b1']['max_error']:.3g})"
    print(f"lenet_b1: {lenet}")
    print(f"(2 parties each; 1-minute load average {load} on {os.cpu_count()} cpus)")
    if args.json:
        with open(args.json, "a") as f:
            for row in lines:
                f.write(json.dumps(row) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
