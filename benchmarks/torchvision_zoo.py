"""Agreement of private inference with torch over many inputs, per torchvision family.

    scripts/test_torchvision.sh creates the environment; then, in it:
    python benchmarks/torchvision_zoo.py [INPUTS] [family,family,...]

For each family of tests/torchvision/zoo.py: INPUTS random 32x32 images (one batch, seed 11)
through the model shipped in-band by party 0 and shared by party 1 (2 parties, dealer), as
tests/torchvision/test_zoo.py does for one image. Prints one JSON line per family: the
share of inputs whose private argmax equals torch's, the largest error of an input relative
to that input's logit range, and the smallest top-2 gap relative to the range (a gap below
the error is a near-tie that no approximate computation decides reliably).
"""

from __future__ import annotations

import json
import pathlib
import sys

import torch

HERE = pathlib.Path(__file__).resolve().parents[1] / "tests" / "torchvision"
sys.path.insert(0, str(HERE))


def main() -> None:
    from test_zoo import party_zoo
    from zoo import FAMILIES, build

    from crypten_lite.mpc import PartyPool

    inputs = int(sys.argv[1]) if len(sys.argv) > 1 else 16
    names = sys.argv[2].split(",") if len(sys.argv) > 2 else FAMILIES
    pool = PartyPool(2, provider="dealer", timeout=1800)
    try:
        for name in names:
            _, shape, _ = build(name)
            x = torch.randn((inputs, *shape[1:]), generator=torch.Generator().manual_seed(11))  # test images
            r = pool.run(party_zoo, name, x)[0]
            ref, y = r["ref"], r["y"]
            span = ref.max(-1).values - ref.min(-1).values
            top = ref.topk(2, -1).values
            print(json.dumps({
                "family": name, "inputs": inputs,
                "argmax_agree": (y.argmax(-1) == ref.argmax(-1)).double().mean().item(),
                "max_error_over_range": ((y - ref).abs().max(-1).values / span).max().item(),
                "min_top2_gap_over_range": ((top[:, 0] - top[:, 1]) / span).min().item(),
                "rounds": r["rounds"], "mb_sent": r["bytes"] / 1e6, "seconds": r["seconds"]}), flush=True)
    finally:
        pool.close()


if __name__ == "__main__":
    main()
