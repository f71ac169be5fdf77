"""Plaintext PyTorch reference models used by the benchmarks, examples and tests.

These are ordinary torch.nn.Modules (import them into crypten_lite with nn.from_pytorch).
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as TF


def lenet() -> nn.Sequential:
    """LeNet for 1x28x28 inputs (the benchmark workload of issue 8)."""
    return nn.Sequential(
        nn.Conv2d(1, 6, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(6, 16, 5), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(256, 120), nn.ReLU(),
        nn.Linear(120, 84), nn.ReLU(), nn.Linear(84, 10))


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
    torch.manual_seed(seed)  # insecure-ok: public demo model initialization, not a secret
    model = ResNet18(width=width)
    model.train()
    with torch.no_grad():
        for _ in range(3):
            model(torch.randn(16, 3, 32, 32))  # insecure-ok: public BN statistics
    return model.eval()
