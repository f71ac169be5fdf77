"""SPU 0.9.5's CHEETAH protocol (2 parties, FM64) on the pairwise comparison's workloads.
Run with the SPU venv's python (bash benchmarks/peer_envs.sh spu), never crypten_lite's.
Both parties run as threads over SPU's in-memory link (its offline phase, silent OT and HE,
included: SPU has no separate offline phase); seconds are wall time of the whole run
(the public inputs' sharing and compilation excluded), bytes the sum of both parties' link
bytes where SPU's Python API exposes them (0.9.5's does not: null). One JSON line per workload.

    $(bash benchmarks/peer_envs.sh spu) benchmarks/spu_cheetah.py [--only mul_1M ...] [--repeat 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import jax
import jax.numpy as jnp
import numpy as np
import spu
import spu.libspu as libspu
import spu.utils.frontend as spu_fe


def _relu(x):
    return jnp.maximum(x, 0)


def _softmax(x):
    return jax.nn.softmax(x, axis=-1)


def _pool2(y):
    """2x2 max pooling, stride 2 (as the maximum of four strided views)."""
    return jnp.maximum(jnp.maximum(y[:, :, 0::2, 0::2], y[:, :, 0::2, 1::2]),
                       jnp.maximum(y[:, :, 1::2, 0::2], y[:, :, 1::2, 1::2]))


def _lenet(x, w1, b1, w2, b2, w3, b3, w4, b4, w5, b5):
    """crypten_lite.models.lenet's forward (conv 1->6 k5, relu, pool, conv 6->16 k5, relu,
    pool, 256->120->84->10 with relus): the image and every weight secret."""
    dn = ("NCHW", "OIHW", "NCHW")
    y = jax.lax.conv_general_dilated(x, w1, (1, 1), "VALID", dimension_numbers=dn)
    y = _pool2(jnp.maximum(y + b1[None, :, None, None], 0))
    y = jax.lax.conv_general_dilated(y, w2, (1, 1), "VALID", dimension_numbers=dn)
    y = _pool2(jnp.maximum(y + b2[None, :, None, None], 0)).reshape(x.shape[0], -1)
    y = jnp.maximum(y @ w3.T + b3, 0)
    y = jnp.maximum(y @ w4.T + b4, 0)
    return y @ w5.T + b5


def _lenet_shapes(batch: int) -> list[tuple]:
    return [(batch, 1, 28, 28), (6, 1, 5, 5), (6,), (16, 6, 5, 5), (16,), (120, 256), (120,),
            (84, 120), (84,), (10, 84), (10,)]


# weights drawn N(0, 1/fan_in) (the image N(0, 1)), as a trained model's are in scale
_LENET_SCALES = [1.0, 0.2, 0.2, 150 ** -0.5, 0.1, 256 ** -0.5, 0.1, 120 ** -0.5, 0.1, 84 ** -0.5, 0.1]


WORKLOADS = {
    "mul_1M": (lambda x, y: x * y, [(1_000_000,), (1_000_000,)]),
    "matmul_256": (lambda x, y: x @ y, [(256, 256), (256, 256)]),
    "relu_1M": (_relu, [(1_000_000,)]),
    "softmax_1000x10": (_softmax, [(1000, 10)]),
    "lenet_b1": (_lenet, _lenet_shapes(1), _LENET_SCALES),
    "lenet_b64": (_lenet, _lenet_shapes(64), _LENET_SCALES),
    # scaled down, for benchmarks/pairwise_vs_cheetah.py --quick
    "mul_65536": (lambda x, y: x * y, [(65_536,), (65_536,)]),
    "matmul_64": (lambda x, y: x @ y, [(64, 64), (64, 64)]),
    "relu_16384": (_relu, [(16_384,)]),
}


def run(name: str) -> dict:
    fn, shapes, *scales = WORKLOADS[name]
    scales = scales[0] if scales else [1.0] * len(shapes)
    rng = np.random.default_rng(0)  # benchmark inputs only
    args = [(rng.standard_normal(s) * c).astype(np.float32) for s, c in zip(shapes, scales)]
    config = libspu.RuntimeConfig(protocol=libspu.ProtocolKind.CHEETAH, field=libspu.FieldType.FM64)
    io = spu.Io(2, config)
    executable, _ = spu_fe.compile(spu_fe.Kind.JAX, fn, args, {}, [f"in{i}" for i in range(len(args))],
                                   [libspu.Visibility.VIS_SECRET] * len(args), lambda out: ["out"])
    shares = [io.make_shares(a, libspu.Visibility.VIS_SECRET) for a in args]
    desc = libspu.link.Desc()
    for r in range(2):
        desc.add_party(f"id_{r}", f"thread_{r}")
    sent = [0, 0]
    outs = [None, None]

    def party(rank: int) -> None:
        lctx = libspu.link.create_mem(desc, rank)
        rt = spu.Runtime(lctx, libspu.RuntimeConfig(config))
        for i, s in enumerate(shares):
            rt.set_var(executable.input_names[i], s[rank])
        rt.run(executable)
        outs[rank] = rt.get_var("out")
        stats = getattr(lctx, "get_stats", None)   # not bound in SPU 0.9.5's Python API
        sent[rank] = int(stats().sent_bytes) if stats is not None else -1
    start = time.perf_counter()
    threads = [threading.Thread(target=party, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seconds = time.perf_counter() - start
    got = io.reconstruct(outs)
    ref = np.asarray(fn(*[jnp.asarray(a) for a in args]))
    return {"seconds": seconds, "bytes_both_parties": sum(sent) if min(sent) >= 0 else None,
            "max_error": float(np.abs(np.asarray(got) - ref).max())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=sorted(WORKLOADS))
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    for name in args.only or list(WORKLOADS):
        runs = [run(name) for _ in range(args.repeat)]
        print(json.dumps({"system": "spu-0.9.5-cheetah", "workload": name,
                          "seconds_median": statistics.median(r["seconds"] for r in runs),
                          "bytes_both_parties": runs[-1]["bytes_both_parties"],
                          "max_error": runs[-1]["max_error"], "repeat": args.repeat}), flush=True)


if __name__ == "__main__":
    main()
