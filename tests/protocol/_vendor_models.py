"""A model vendor's classes: only the model owner imports this module.

tests/protocol/test_inband_models.py imports it inside the owner's branch and checks that on
every other party the module is never imported (the parties rebuild the model from the
description that from_pytorch(..., src=...) broadcasts).
"""

from __future__ import annotations

import torch
import torch.nn as nn
from torch.ao.quantization import DeQuantStub, QuantStub


class VendorCNN(nn.Module):
    """conv -> batch norm -> relu -> max pool -> conv -> relu -> linear (8x8 single-channel input)."""

    def __init__(self, quant_stubs: bool = False) -> None:
        super().__init__()
        self.stubs = quant_stubs
        self.quant, self.dequant = QuantStub(), DeQuantStub()
        self.conv1 = nn.Conv2d(1, 4, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(4)
        self.relu1 = nn.ReLU()
        self.pool = nn.MaxPool2d(2)
        self.conv2 = nn.Conv2d(4, 6, 3, padding=1)
        self.relu2 = nn.ReLU()
        self.fc = nn.Linear(6 * 4 * 4, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stubs:
            x = self.quant(x)
        x = self.pool(self.relu1(self.bn1(self.conv1(x))))
        x = self.relu2(self.conv2(x))
        y = self.fc(torch.flatten(x, 1))
        return self.dequant(y) if self.stubs else y


def float_cnn() -> nn.Module:
    """The vendor's float CNN in eval mode, with non-trivial BatchNorm statistics."""
    torch.manual_seed(7)  # test model weights, not cryptographic
    model = VendorCNN()
    with torch.no_grad():
        model.bn1.running_mean.uniform_(-0.2, 0.2)
        model.bn1.running_var.uniform_(0.5, 1.5)
        model.bn1.weight.uniform_(0.5, 1.5)
        model.bn1.bias.uniform_(-0.1, 0.1)
    return model.eval()


def int8_cnn(calib: torch.Tensor) -> nn.Module:
    """The same CNN quantized with torch.ao eager post-training static quantization."""
    from crypten_lite.quantized.testing import quantize_eager

    model = VendorCNN(quant_stubs=True)
    model.load_state_dict(float_cnn().state_dict())
    return quantize_eager(model.eval(), calib, fuse=[("conv1", "bn1", "relu1"), ("conv2", "relu2")])
