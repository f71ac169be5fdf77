"""Cost of private int8 inference vs private float (fixed-point) inference of the same CNN.

The digits CNN of examples/quantized_inference.py is trained once, then run on N test images
between the parties of a local PartyPool (gRPC on loopback, with the dealer):

* ``float``: the float model through crypten_lite.nn.from_pytorch (16-bit fixed point,
  64-bit comparisons for ReLU and max pooling);
* ``int8``: its PyTorch quantized version (eager, FX, PT2E) through
  crypten_lite.quantized.run_private (short comparisons, exact rounding);
* ``int8/probabilistic`` (with --probabilistic): the same with the one-round probabilistic
  truncation, to show what it does to the int8 outputs.

One JSON line per run: online rounds and bytes sent per party (the most any party sends:
from sharing the input to revealing the output; weights shared, one run), seconds, and the
agreement with torch (argmax and, for int8 outputs, identical integers).

    python benchmarks/quantized_vs_float.py [--images 200] [--flows eager,fx,pt2e] [--parties 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
import quantized_inference as demo  # noqa: E402  (the model, data, training and quantization)


def _stats() -> dict:
    from crypten_lite import comm

    return dict(comm.get().get_communication_stats())


def float_party(model: torch.nn.Module, images: torch.Tensor):
    """Private float inference: the model owner's weights (party 0), the images (party 1)."""
    import crypten_lite
    from crypten_lite import comm

    private = crypten_lite.nn.from_pytorch(model, images[:2])
    private.encrypt(src=0)
    private.eval()
    comm.get().reset_communication_stats()
    start = time.perf_counter()
    x = crypten_lite.cryptensor(images if crypten_lite.get_rank() == 1 else None, src=1)
    y = private(x).get_plain_text()
    return _stats(), time.perf_counter() - start, y


def int8_party(program, images: torch.Tensor, options: dict):
    """Private int8 inference of the converted program; returns the output integers or floats."""
    import crypten_lite
    from crypten_lite import comm
    from crypten_lite.quantized import QuantizedCrypTensor, run_private

    comm.get().reset_communication_stats()
    start = time.perf_counter()
    secret = run_private(program, images if crypten_lite.get_rank() == 1 else None, reveal=False, **options)
    if isinstance(secret, QuantizedCrypTensor):
        out = secret.int_repr().get_plain_text()
    else:
        out = secret.get_plain_text()
    return _stats(), time.perf_counter() - start, out


def _row(mode: str, flow: str, n: int, parties: int, results, **extra) -> dict:
    sent = max(r[0]["bytes_sent"] for r in results)
    return dict(workload="digits_cnn", mode=mode, flow=flow, images=n, parties=parties,
                rounds=int(results[0][0]["rounds"]), bytes_sent_per_party=int(sent),
                bytes_per_image=round(sent / n, 1), seconds=round(max(r[1] for r in results), 3), **extra)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=200)
    parser.add_argument("--flows", default="eager,fx,pt2e")
    parser.add_argument("--parties", type=int, default=2)
    parser.add_argument("--probabilistic", action="store_true", help="also run with probabilistic truncation")
    parser.add_argument("--json", default="", help="also append the JSON lines to this file")
    args = parser.parse_args(argv)

    from crypten_lite.mpc import PartyPool
    from crypten_lite.quantized import from_quantized

    train_x, train_y, test_x, _ = demo.load_data()
    model = demo.train(train_x, train_y)
    images = test_x[:args.images]
    rows = []
    with PartyPool(args.parties, timeout=600) as pool:
        res = pool.run(float_party, model, images)
        with torch.no_grad():
            ref = model(images)
        float_row = _row("float", "-", len(images), args.parties, res,
                         argmax_agree=(res[0][2].argmax(1) == ref.argmax(1)).double().mean().item())
        rows.append(float_row)
        for flow in args.flows.split(","):
            qmodel = demo.quantize(model, train_x[:400], flow)
            program = from_quantized(qmodel, images[:2])
            with torch.no_grad():
                qref = qmodel(images)
            variants = [("int8", {})] + ([("int8/probabilistic", {"truncation": "probabilistic"})]
                                         if args.probabilistic else [])
            for mode, options in variants:
                res = pool.run(int8_party, program, images, options)
                out, info = res[0][2], program.output_info
                extra = {}
                if info.kind == "quant":
                    ref_int = torch.round(qref.double() / info.scale).long() + info.zero_point
                    diff = (out - ref_int).abs()
                    extra = dict(int8_identical=(diff == 0).double().mean().item(), max_steps=int(diff.max()))
                    out = info.to_real(out)
                else:
                    extra = dict(max_abs_diff=float((out - qref).abs().max()))
                agree = (out.argmax(1) == qref.argmax(1)).double().mean().item()
                row = _row(mode, flow, len(images), args.parties, res, argmax_agree=agree, **extra)
                row["bytes_vs_float"] = round(row["bytes_sent_per_party"] / float_row["bytes_sent_per_party"], 3)
                rows.append(row)
    for row in rows:
        line = json.dumps(row)
        print(line)
        if args.json:
            with open(args.json, "a") as f:
                f.write(line + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
