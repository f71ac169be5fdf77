"""Private int8 inference of a PyTorch quantized CNN on handwritten digits.

Party 0 (the model owner) trains a small CNN on its images and quantizes it with PyTorch's
post-training static quantization, calibrated on scikit-learn digits (eager mode, FX graph
mode or torchao PT2E). Party 1 (the data owner) holds test images. The int8 weights are
secret-shared by party 0, the quantized images by party 1; the integer program runs in MPC
and only the predictions are revealed.

    crypten-lite launch -n 2 examples/quantized_inference.py [--flow eager|fx|pt2e] [--images 200]

The user code is that of a float model (examples/private_inference.py): party 0 calls
crypten_lite.nn.from_pytorch(qmodel, dummy, src=0), which sends party 1 the program's public
part over the session (architecture, scales, zero points, bit bounds; no weights, no file),
then encrypt(src=0), private(...), get_plain_text(). With --verify (default), party 1
reveals its images to party 0 AFTER the private run, only so that this demo can print
torch's quantized model beside it.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.ao.nn.quantized import FloatFunctional
from torch.ao.quantization import DeQuantStub, QuantStub

import crypten_lite

FLOWS = ("eager", "fx", "pt2e")


class DigitsNet(nn.Module):
    """conv-relu-maxpool, conv-relu, residual add, cat, adaptive average pool, linear.

    ``eager=True`` adds the QuantStub / DeQuantStub / FloatFunctionals that eager-mode
    quantization needs; the weights are the same either way.
    """

    def __init__(self, eager: bool = False):
        super().__init__()
        self.eager = eager
        self.quant, self.dequant = QuantStub(), DeQuantStub()
        self.conv1, self.relu1, self.pool1 = nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2)
        self.conv2, self.relu2 = nn.Conv2d(8, 8, 3, padding=1), nn.ReLU()
        self.skip, self.join = FloatFunctional(), FloatFunctional()
        self.pool2 = nn.AdaptiveAvgPool2d(2)
        self.fc = nn.Linear(16 * 2 * 2, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.eager:
            x = self.quant(x)
        a = self.pool1(self.relu1(self.conv1(x)))  # 8x8 -> 4x4
        b = self.relu2(self.conv2(a))
        s = self.skip.add(a, b) if self.eager else a + b
        c = self.join.cat([s, a], 1) if self.eager else torch.cat([s, a], 1)
        y = self.fc(torch.flatten(self.pool2(c), 1))
        return self.dequant(y) if self.eager else y


def load_data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(train images, train labels, test images, test labels): the last 297 are the test set."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target)
    return images[:1500], labels[:1500], images[1500:], labels[1500:]


def train(images: torch.Tensor, labels: torch.Tensor, epochs: int = 8) -> DigitsNet:
    """Party 0's plaintext training on its own data."""
    torch.manual_seed(0)  # reproducible demo training, not cryptographic
    # In float64, then back to float32: float32 kernels round differently from one CPU model
    # to the next (AVX2 / AVX-512, Intel / AMD), and over the epochs that gives other weights,
    # hence other int8 scales and figures; float64's differences stay far below them.
    model = DigitsNet().double()
    images = images.double()
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(epochs):
        for i in torch.randperm(len(images)).split(64):
            opt.zero_grad()
            F.cross_entropy(model(images[i]), labels[i]).backward()
            opt.step()
    return model.float().eval()


def quantize(model: DigitsNet, calib: torch.Tensor, flow: str) -> nn.Module:
    """Post-training static quantization (x86 backend: per-channel int8 weights, uint8
    activations), calibrated on ``calib``."""
    from crypten_lite.quantized.testing import quantize_eager, quantize_fx, quantize_pt2e

    if flow == "eager":
        eager = DigitsNet(eager=True)
        eager.load_state_dict(model.state_dict())
        return quantize_eager(eager.eval(), calib)
    if flow == "fx":
        return quantize_fx(model, calib)
    return quantize_pt2e(model, calib)


def model_owner(flow: str) -> nn.Module:
    """Party 0: train and quantize its model (no other party runs this)."""
    train_x, train_y, _, _ = load_data()
    model = train(train_x, train_y)
    return quantize(model, train_x[:400], flow)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flow", choices=FLOWS, default="eager", help="PyTorch quantization flow")
    parser.add_argument("--images", type=int, default=200, help="number of test images party 1 classifies")
    parser.add_argument("--show", type=int, default=12, help="predictions to print")
    parser.add_argument("--no-verify", dest="verify", action="store_false",
                        help="do not reveal the images to party 0 for the comparison with torch")
    args = parser.parse_args()
    if args.flow == "pt2e" and importlib.util.find_spec("torchao") is None:
        raise SystemExit("--flow pt2e needs torchao (the PT2E quantization flow): "
                         "pip install -e '.[quantization]' (or pip install 'torchao>=0.18')")

    crypten_lite.init()
    rank, comm = crypten_lite.get_rank(), crypten_lite.comm.get()
    qmodel = model_owner(args.flow) if rank == 0 else None
    _, _, test_x, test_y = load_data()
    images = test_x[:args.images] if rank == 1 else None

    comm.reset_communication_stats()
    # party 0 traces its int8 model and sends the program's public part; party 1 rebuilds it
    private = crypten_lite.nn.from_pytorch(qmodel, (2, 1, 8, 8), src=0)
    if rank == 1:
        print(f"[party 1] model description from party 0: {comm.get_communication_stats()['bytes_received']} "
              "bytes (architecture, scales, zero points, bit bounds; no weights)")

    comm.reset_communication_stats()
    start = time.perf_counter()
    private.encrypt(src=0)  # party 0's int8 weights become secret shares
    private.eval()
    # party 1 quantizes its images exactly as torch does and shares them; the same call as for
    # a float model, private(crypten_lite.cryptensor(images, src=1)), quantizes them in MPC
    logits = private(images, src=1).get_plain_text()  # what torch's quantized model returns
    seconds = time.perf_counter() - start
    stats = comm.get_communication_stats()
    predictions = logits.argmax(1)
    print(f"[party {rank}] private {args.flow} int8 inference of {len(predictions)} images: "
          f"{stats['rounds']} rounds, {stats['bytes_sent'] / 1e6:.3f} MB sent "
          f"({stats['bytes_sent'] / len(predictions):.0f} B per image), {seconds:.2f} s")

    if not args.verify:
        return
    # demo only: party 1 reveals its images to party 0, which runs torch's quantized model
    shown = crypten_lite.cryptensor(images, src=1).get_plain_text(dst=0)
    if rank != 0:
        return
    with torch.no_grad():
        ref = qmodel(shown)
    labels = test_y[:len(predictions)]
    same = (predictions == ref.argmax(1)).double().mean().item()
    print(f"{'image':>5} {'label':>5} {'private':>7} {'torch':>5}")
    for i in range(min(args.show, len(predictions))):
        print(f"{i:5d} {int(labels[i]):5d} {int(predictions[i]):7d} {int(ref[i].argmax()):5d}")
    print(f"predictions equal to torch's quantized model: {100 * same:.1f}%")
    print(f"accuracy: private {100 * (predictions == labels).double().mean():.1f}%, "
          f"torch {100 * (ref.argmax(1) == labels).double().mean():.1f}%")
    info = private.output_info
    if info.kind == "quant":  # int8 output (eager, FX): compare the integers
        ints = torch.round(logits.double() / info.scale).long() + info.zero_point
        torch_ints = torch.round(ref.double() / info.scale).long() + info.zero_point
        diff = (ints - torch_ints).abs()
        print(f"int8 outputs identical: {100 * (diff == 0).double().mean():.2f}%, max difference "
              f"{int(diff.max())} step(s)")
    else:  # PT2E leaves the last linear in float (fixed point)
        print(f"float outputs: max |difference| {float((logits - ref).abs().max()):.2e}")


if __name__ == "__main__":
    main()
