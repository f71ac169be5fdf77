"""Private inference of a ResNet-18-style model imported from PyTorch with torch.fx.

    crypten-lite launch -n 2 examples/resnet_inference.py [--images 8] [--width 64]

Party 0 owns the model (a torch ResNet-18 for 32x32 inputs, crypten_lite.models: 3x3 stem,
four stages of two BasicBlocks, BatchNorm, residual adds, global average pooling); party 1
owns the images. Only party 0 builds the torch model: `crypten_lite.nn.from_pytorch(...,
src=0)` traces it there (BatchNorm folded into the convolutions) and sends party 1 the
architecture, from which party 1 rebuilds it; `encrypt(src=0)` secret-shares party 0's
weights; party 1 shares the images; the logits are revealed to party 1 only. For this demo's
comparison with plaintext torch, party 1 then reveals its images and logits to party 0.

The weights are a seeded random initialization with BatchNorm statistics estimated on
random data (no download): the point is that private inference reproduces the plaintext
model, not the accuracy of an untrained network.
"""

from __future__ import annotations

import argparse
import time

import torch


from crypten_lite.models import BasicBlock, ResNet18, build_model  # noqa: F401


# ----------------------------------------------------------------------- private run
def main(argv=None) -> None:
    import crypten_lite
    import crypten_lite.nn as cnn

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--batch", type=int, default=4)
    args = parser.parse_args(argv)

    crypten_lite.init()
    rank = crypten_lite.get_rank()
    model = build_model(args.width) if rank == 0 else None  # party 0's model
    private = cnn.from_pytorch(model, (1, 3, 32, 32), fold_batch_norm=True, src=0).encrypt(src=0).eval()

    gen = torch.Generator().manual_seed(1)  # party 1's demo images
    images = torch.randn(args.images, 3, 32, 32, generator=gen) if rank == 1 else None
    comm = crypten_lite.comm.get()
    comm.reset_communication_stats()
    start = time.perf_counter()
    logits = []
    with crypten_lite.no_grad():
        for i in range(0, args.images, args.batch):
            n = min(args.batch, args.images - i)
            batch = images[i:i + n] if images is not None else torch.empty(n, 3, 32, 32)
            x = crypten_lite.cryptensor(batch if rank == 1 else None, src=1)
            logits.append(private(x).get_plain_text(dst=1))
    seconds = time.perf_counter() - start
    stats = comm.get_communication_stats()
    if rank == 1:
        print(f"ResNet-18 (width {args.width}) private inference of {args.images} images: "
              f"{seconds:.1f} s, {stats['rounds']} rounds, {stats['bytes_sent'] / 2**20:.1f} MiB sent "
              f"by party {rank}")
    # demo only: party 1 reveals its images and logits to party 0, which runs plaintext torch
    got = crypten_lite.cryptensor(torch.cat(logits) if rank == 1 else None, src=1).get_plain_text(dst=0)
    shown = crypten_lite.cryptensor(images, src=1).get_plain_text(dst=0)
    if rank == 0:
        with torch.no_grad():
            expected = model(shown)
        same = (got.argmax(1) == expected.argmax(1)).float().mean().item()
        err = (got - expected).abs().max().item()
        print(f"argmax agreement with plaintext torch: {same * 100:.1f}%, max abs logit error "
              f"{err:.2e} (logits range {expected.min().item():.2f} .. {expected.max().item():.2f})")
    crypten_lite.uninit()


if __name__ == "__main__":
    main()
