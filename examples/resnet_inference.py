"""Private inference of a ResNet-18-style model imported from PyTorch with torch.fx.

    crypten-lite launch -n 2 examples/resnet_inference.py [--images 8] [--width 64]

Party 0 owns the model (a torch ResNet-18 for 32x32 inputs, defined below: 3x3 stem, four
stages of two BasicBlocks, BatchNorm, residual adds, global average pooling); party 1 owns
the images. Every party converts the architecture with `crypten_lite.nn.from_pytorch`;
`encrypt(src=0)` secret-shares party 0's weights; party 1 shares the images; the logits are
revealed to party 1 only, then compared with plaintext torch (for this demo, party 0 also
learns the comparison figures).

The weights are a seeded random initialization with BatchNorm statistics estimated on
random data (no download): the point is that private inference reproduces the plaintext
model, not the accuracy of an untrained network.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn as nn
import torch.nn.functional as TF


# ----------------------------------------------------------------------- torch models
class BasicBlock(nn.Module):
    """Two 3x3 convolutions with BatchNorm and a residual connection (1x1 when reshaped)."""

    def __init__(self, cin: int, cout: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                          nn.BatchNorm2d(cout))

    def forward(self, x):
        out = TF.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        out = out + self.shortcut(x)
        return TF.relu(out)


class ResNet18(nn.Module):
    """ResNet-18 for 32x32 images (CIFAR layout); `width` scales every stage (64 = standard)."""

    def __init__(self, num_classes: int = 10, width: int = 64) -> None:
        super().__init__()
        w = width
        self.conv1 = nn.Conv2d(3, w, 3, 1, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(w)
        stages, cin = [], w
        for i, (cout, stride) in enumerate([(w, 1), (2 * w, 2), (4 * w, 2), (8 * w, 2)]):
            stages.append(nn.Sequential(BasicBlock(cin, cout, stride), BasicBlock(cout, cout, 1)))
            cin = cout
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = nn.Linear(8 * w, num_classes)

    def forward(self, x):
        out = TF.relu(self.bn1(self.conv1(x)))
        out = self.layer4(self.layer3(self.layer2(self.layer1(out))))
        out = TF.adaptive_avg_pool2d(out, 1)
        out = out.view(out.size(0), -1)
        return self.fc(out)


def build_model(width: int = 64, seed: int = 0) -> ResNet18:
    """A seeded ResNet-18 with BatchNorm statistics estimated on random data, in eval mode."""
    torch.manual_seed(seed)  # plaintext model initialization of the demo, not a secret
    model = ResNet18(width=width)
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(16, 3, 32, 32))
    return model.eval()


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
    model = build_model(args.width)  # every party knows the architecture; party 0 the weights
    private = cnn.from_pytorch(model, torch.empty(1, 3, 32, 32)).encrypt(src=0).eval()

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
        got = torch.cat(logits)
        with torch.no_grad():
            expected = model(images)
        same = (got.argmax(1) == expected.argmax(1)).float().mean().item()
        err = (got - expected).abs().max().item()
        print(f"ResNet-18 (width {args.width}) private inference of {args.images} images: "
              f"{seconds:.1f} s, {stats['rounds']} rounds, {stats['bytes_sent'] / 2**20:.1f} MiB sent "
              f"by party {rank}")
        print(f"argmax agreement with plaintext torch: {same * 100:.1f}%, max abs logit error "
              f"{err:.2e} (logits range {expected.min().item():.2f} .. {expected.max().item():.2f})")
    crypten_lite.uninit()


if __name__ == "__main__":
    main()
