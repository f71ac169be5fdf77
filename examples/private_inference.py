"""Private inference of a CNN on real handwritten digits between two parties.

Party 0 owns a model (trained here on its own images); party 1 owns test images. Only party 0
has the model's Python class: crypten_lite.nn.from_pytorch(..., src=0) sends the other party
a description of the traced model (its architecture and public constants such as kernel
sizes, not its weights), from which party 1 rebuilds the same crypten_lite model. The weights
are then secret-shared by party 0, the images by party 1, and only the predictions are
revealed.

    crypten-lite launch -n 2 examples/private_inference.py [--images 16] [--no-verify]
    crypten-lite launch -n 3 --protocol rss examples/private_inference.py   # no dealer

(Under rss, party 2 is a third computing party without inputs; docs/protocols.md.)

The digits data set ships inside scikit-learn (no download). Training is seeded, so every run
prints the same predictions. With --verify (default), party 1 also reveals its images to
party 0 AFTER the private run, only so that this demo can print the difference from
plaintext torch; a real deployment would not.
"""

from __future__ import annotations

import argparse
import time

import torch
from sklearn.datasets import load_digits

import crypten_lite


def vendor_model() -> torch.nn.Module:
    """Party 0's model. Only party 0 runs this function: no other party has the class."""

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

    torch.manual_seed(0)  # before the model is built: the same weights and predictions every run
    return DigitsCNN()


def load_data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target)
    return images[:1500], labels[:1500], images[1500:], labels[1500:]


def train(model: torch.nn.Module, images: torch.Tensor, labels: torch.Tensor, epochs: int = 15) -> None:
    """Party 0's plaintext training on its own data (seeded: reproducible, not cryptographic)."""
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
    parser.add_argument("--epochs", type=int, default=15, help="party 0's training epochs")
    parser.add_argument("--no-verify", dest="verify", action="store_false",
                        help="do not reveal the images to party 0 for the plaintext comparison")
    args = parser.parse_args()

    crypten_lite.init()
    rank = crypten_lite.get_rank()
    train_x, train_y, test_x, test_y = load_data()
    model = None
    if rank == 0:  # the model owner
        model = vendor_model()
        train(model, train_x, train_y, args.epochs)
    images = test_x[:args.images] if rank == 1 else None

    # party 0 traces its model and sends the description; party 1 rebuilds it from that
    comm = crypten_lite.comm.get()
    comm.reset_communication_stats()
    private_model = crypten_lite.nn.from_pytorch(model, (1, 1, 8, 8), src=0)
    if rank == 1:
        print(f"model description from party 0: {comm.get_communication_stats()['bytes_received']} "
              "bytes (architecture and public constants, no weights)")
    private_model.encrypt(src=0)  # party 0's weights become secret shares
    private_model.eval()
    x = crypten_lite.cryptensor(images, src=1)  # party 1's images become secret shares

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
