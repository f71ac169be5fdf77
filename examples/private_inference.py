"""Private inference of a CNN on real handwritten digits between two parties.

Party 0 owns a model (trained here on its own images); party 1 owns test images. The model
is imported with crypten_lite.nn.from_pytorch, its weights are secret-shared by party 0, the
images by party 1, and only the predictions are revealed.

    crypten-lite launch -n 2 examples/private_inference.py [--images 16] [--no-verify]

The digits data set ships inside scikit-learn (no download). With --verify (default), party 1
also reveals its images to party 0 AFTER the private run, only so that this demo can print the
difference from plaintext torch; a real deployment would not.
"""

from __future__ import annotations

import argparse
import time

import torch
from sklearn.datasets import load_digits

import crypten_lite


class DigitsCNN(torch.nn.Module):
    """A small CNN for 8x8 digit images."""

    def __init__(self) -> None:
        super().__init__()
        self.features = torch.nn.Sequential(
            torch.nn.Conv2d(1, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2),
            torch.nn.Conv2d(8, 16, 3, padding=1), torch.nn.ReLU(), torch.nn.MaxPool2d(2))
        self.classifier = torch.nn.Linear(16 * 2 * 2, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.features(x), 1))


def load_data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target)
    return images[:1500], labels[:1500], images[1500:], labels[1500:]


def train(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, epochs: int = 15) -> None:
    """Party 0's plaintext training on its own data."""
    torch.manual_seed(0)  # reproducible demo training, not cryptographic
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for _ in range(epochs):
        for i in torch.randperm(len(images)).split(64):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(images[i]), labels[i]).backward()
            opt.step()
    model.eval()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=16, help="number of test images party 1 classifies")
    parser.add_argument("--no-verify", dest="verify", action="store_false",
                        help="do not reveal the images to party 0 for the plaintext comparison")
    args = parser.parse_args()

    crypten_lite.init()
    rank = crypten_lite.get_rank()
    train_x, train_y, test_x, test_y = load_data()
    model = DigitsCNN()
    if rank == 0:
        train(model, train_x, train_y)
    images = test_x[:args.images] if rank == 1 else None

    private_model = crypten_lite.nn.from_pytorch(model, torch.zeros(1, 1, 8, 8))
    private_model.encrypt(src=0)  # party 0's weights become secret shares
    private_model.eval()
    x = crypten_lite.cryptensor(images, src=1)  # party 1's images become secret shares

    comm = crypten_lite.comm.get()
    comm.reset_communication_stats()
    start = time.perf_counter()
    logits = private_model(x).get_plain_text()
    seconds = time.perf_counter() - start
    stats = comm.get_communication_stats()
    prediction = logits.argmax(1)

    print(f"private prediction: {prediction.tolist()}")
    print(f"online: {seconds:.2f} s, {stats['rounds']} rounds, "
          f"{stats['bytes_sent'] / 1e6:.2f} MB sent by this party")
    if rank == 1:
        accuracy = (prediction == test_y[:args.images]).float().mean().item()
        print(f"accuracy on party 1's labels: {accuracy:.1%}")
    if args.verify:
        revealed = crypten_lite.cryptensor(images, src=1).get_plain_text(dst=0)
        if rank == 0:
            with torch.no_grad():
                reference = model(revealed)
            print(f"plaintext torch prediction: {reference.argmax(1).tolist()}")
            print(f"max |private - plaintext| logit difference: {(logits - reference).abs().max().item():.2e}")
    crypten_lite.uninit()


if __name__ == "__main__":
    main()
