"""SPU 0.9.5's CHEETAH protocol (2 parties, FM64) on the pairwise comparison's workloads.
Run with the SPU venv's python (bash benchmarks/peer_envs.sh spu), never crypten_lite's.
Both parties run as threads over SPU's in-memory link (its offline phase, silent OT and HE,
included: SPU has no separate offline phase); seconds are wall time of the whole run
(the public inputs' sharing and compilation excluded), bytes the sum of both parties' link
bytes where SPU's Python API exposes them (0.9.5's does not: null). One JSON line per workload.

    $(bash benchmarks/peer_envs.sh spu) benchmarks/spu_cheetah.py [--only mul_1M ...] [--repeat 3]

One BERT encoder layer (workload bert_layer, transformers' BertLayer written in jax.numpy:
_bert_layer) runs on the weights, input and torch output that benchmarks/pairwise_vs_cheetah.py
wrote to an .npz file (numpy arrays only, read with allow_pickle=False); its max error is
against torch's forward of that layer:

    $(bash benchmarks/peer_envs.sh spu) benchmarks/spu_cheetah.py --bert-npz layer.npz
"""

from __future__ import annotations

import argparse
import json
import math
import resource
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


RECV_TIMEOUT_MS = 3_600_000

# transformers' BertLayer's arguments, in _bert_layer's order (the .npz file's keys): weights
# as x @ W (torch's Linear weight transposed), LayerNorm gains and biases
BERT_ARGS = ("x", "wq", "bq", "wk", "bk", "wv", "bv", "wo", "bo", "ln1_g", "ln1_b",
             "w1", "b1", "w2", "b2", "ln2_g", "ln2_b")


def _layer_norm(x, g, b, eps: float):
    mu = jnp.mean(x, axis=-1, keepdims=True)
    var = jnp.mean(jnp.square(x - mu), axis=-1, keepdims=True)
    return (x - mu) * jax.lax.rsqrt(var + eps) * g + b


def _bert_layer(heads: int, eps: float):
    """transformers' BertLayer in eval mode (eager attention, no attention mask), post-norm:
    h = LN1(x + softmax(q k^T / sqrt(dh)) v Wo), out = LN2(h + GELU(h W1) W2), exact (erf) GELU;
    every weight and the input secret."""
    def layer(x, wq, bq, wk, bk, wv, bv, wo, bo, ln1_g, ln1_b, w1, b1, w2, b2, ln2_g, ln2_b):
        b, s, d = x.shape
        dh = d // heads

        def split(t):  # [b, s, d] -> [b, heads, s, dh]
            return t.reshape(b, s, heads, dh).transpose(0, 2, 1, 3)
        q, k, v = split(x @ wq + bq), split(x @ wk + bk), split(x @ wv + bv)
        probs = jax.nn.softmax((q @ k.transpose(0, 1, 3, 2)) * (1.0 / math.sqrt(dh)), axis=-1)
        ctx = (probs @ v).transpose(0, 2, 1, 3).reshape(b, s, d)
        h = _layer_norm(ctx @ wo + bo + x, ln1_g, ln1_b, eps)
        f = jax.nn.gelu(h @ w1 + b1, approximate=False)
        return _layer_norm(f @ w2 + b2 + h, ln2_g, ln2_b, eps)
    return layer


def load_bert(path: str) -> tuple:
    """(the layer's function, its arguments, torch's output) from pairwise_vs_cheetah's .npz."""
    with np.load(path, allow_pickle=False) as f:
        args = [np.asarray(f[k], dtype=np.float32) for k in BERT_ARGS]
        return (_bert_layer(int(f["heads"]), float(f["eps"])), args,
                np.asarray(f["torch_out"], dtype=np.float64))


def run(name: str, given: tuple | None = None) -> dict:
    """One run of workload `name`; `given` = (fn, args, reference) for a workload whose
    inputs come from elsewhere (bert_layer: load_bert), else WORKLOADS' seeded inputs."""
    if given is not None:
        fn, args, torch_ref = given
    else:
        fn, shapes, *scales = WORKLOADS[name]
        scales = scales[0] if scales else [1.0] * len(shapes)
        rng = np.random.default_rng(0)  # benchmark inputs only
        args = [(rng.standard_normal(s) * c).astype(np.float32) for s, c in zip(shapes, scales)]
        torch_ref = None
    config = libspu.RuntimeConfig(protocol=libspu.ProtocolKind.CHEETAH, field=libspu.FieldType.FM64)
    io = spu.Io(2, config)
    executable, _ = spu_fe.compile(spu_fe.Kind.JAX, fn, args, {}, [f"in{i}" for i in range(len(args))],
                                   [libspu.Visibility.VIS_SECRET] * len(args), lambda out: ["out"])
    shares = [io.make_shares(a, libspu.Visibility.VIS_SECRET) for a in args]
    desc = libspu.link.Desc()
    # SPU's default receive deadline (30 s) is shorter than one party's wait for the other's
    # HE matrix products of a BERT-base layer on a loaded 2-core machine
    desc.recv_timeout_ms = RECV_TIMEOUT_MS
    for r in range(2):
        desc.add_party(f"id_{r}", f"thread_{r}")
    sent = [0, 0]
    outs = [None, None]
    errors: list = []

    def party(rank: int) -> None:
        try:
            run_party(rank)
        except Exception as e:  # noqa: BLE001 (reported below, after both threads end)
            errors.append(f"party {rank}: {type(e).__name__}: {e}")

    def run_party(rank: int) -> None:
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
    if errors:
        raise RuntimeError(f"SPU {name}: " + "; ".join(errors))
    seconds = time.perf_counter() - start
    got = io.reconstruct(outs)
    ref = np.asarray(fn(*[jnp.asarray(a) for a in args]))
    out = {"seconds": seconds, "bytes_both_parties": sum(sent) if min(sent) >= 0 else None,
           "max_error": float(np.abs(np.asarray(got) - ref).max())}
    if torch_ref is not None:   # against torch's forward; and the JAX translation's own error
        out["max_error"] = float(np.abs(np.asarray(got, dtype=np.float64) - torch_ref).max())
        out["jax_plaintext_max_error"] = float(np.abs(ref.astype(np.float64) - torch_ref).max())
    # both parties are threads of this process: its peak resident memory is theirs together
    out["peak_memory_mb_both_parties"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", action="append", choices=sorted(WORKLOADS))
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--bert-npz", default="",
                        help="run workload bert_layer alone on this file's weights and input "
                             "(written by benchmarks/pairwise_vs_cheetah.py)")
    args = parser.parse_args()
    if args.bert_npz:
        given = load_bert(args.bert_npz)
        runs = [run("bert_layer", given) for _ in range(args.repeat)]
        x = given[1][0]
        print(json.dumps({"system": "spu-0.9.5-cheetah", "workload": "bert_layer",
                          "shape": list(x.shape), "hidden": int(x.shape[-1]),
                          "seconds_median": statistics.median(r["seconds"] for r in runs),
                          "bytes_both_parties": runs[-1]["bytes_both_parties"],
                          "max_error": runs[-1]["max_error"],
                          "jax_plaintext_max_error": runs[-1]["jax_plaintext_max_error"],
                          "peak_memory_mb_both_parties": runs[-1]["peak_memory_mb_both_parties"],
                          "repeat": args.repeat}), flush=True)
        return
    for name in args.only or list(WORKLOADS):
        runs = [run(name) for _ in range(args.repeat)]
        print(json.dumps({"system": "spu-0.9.5-cheetah", "workload": name,
                          "seconds_median": statistics.median(r["seconds"] for r in runs),
                          "bytes_both_parties": runs[-1]["bytes_both_parties"],
                          "max_error": runs[-1]["max_error"], "repeat": args.repeat}), flush=True)


if __name__ == "__main__":
    main()
