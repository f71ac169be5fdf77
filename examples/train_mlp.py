"""Private training of an MLP on the scikit-learn digits (8x8 images, 10 classes).

    crypten-lite launch -n 2 examples/train_mlp.py [--epochs 10] [--hidden 64] [--lr 0.1]

Party 0 owns the model (its initialization), party 1 owns the data (the digits, split into
train and test sets). Party 0 secret-shares the model with `encrypt(src=0)`, party 1 its
images and one-hot labels with `crypten_lite.cryptensor(..., src=1)`; training runs SGD on
the shares. Revealed: each batch's loss (for the progress bar) and the test accuracy.

For comparison, rank 0 also trains the same model in plaintext torch from the same
initialization, on the same batches (in a real deployment no party holds both; the digits
are public, which makes the demo possible).
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn as nn

import crypten_lite
import crypten_lite.nn as cnn
import crypten_lite.optim as coptim


def load_digits_split(seed: int = 0):
    """(x_train, y_train, x_test, y_test): pixels scaled to [0, 1], 20% held out."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32) / 16.0
    y = torch.tensor(data.target, dtype=torch.long)
    idx_train, idx_test = train_test_split(torch.arange(len(y)).numpy(), test_size=0.2,
                                           random_state=seed, stratify=y.numpy())
    return x[idx_train], y[idx_train], x[idx_test], y[idx_test]


def build(hidden: int, seed: int) -> tuple[cnn.Module, nn.Module]:
    """The crypten_lite model and its plaintext torch twin, with the same initialization."""
    torch.manual_seed(seed)  # party 0's plaintext initialization (not a secret)
    if hidden:
        model = cnn.Sequential(cnn.Linear(64, hidden), cnn.ReLU(), cnn.Linear(hidden, 10))
        twin = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))
    else:
        model = cnn.Sequential(cnn.Linear(64, 10))
        twin = nn.Sequential(nn.Linear(64, 10))
    twin.load_state_dict(model.state_dict())
    return model, twin


def batches(n: int, batch: int, epoch: int, seed: int) -> list[torch.Tensor]:
    """The public batch order of one epoch (a permutation independent of the data)."""
    order = torch.randperm(n, generator=torch.Generator().manual_seed(seed * 1000 + epoch))
    return [order[i:i + batch] for i in range(0, n, batch)]


def train_plain(twin: nn.Module, data, args) -> float:
    x_train, y_train, x_test, y_test = data
    opt = torch.optim.SGD(twin.parameters(), lr=args.lr, momentum=args.momentum)
    for epoch in range(args.epochs):
        for idx in batches(len(y_train), args.batch, epoch, args.seed):
            opt.zero_grad()
            nn.functional.cross_entropy(twin(x_train[idx]), y_train[idx]).backward()
            opt.step()
    with torch.no_grad():
        return (twin(x_test).argmax(1) == y_test).float().mean().item()


def train_private(model: cnn.Module, args, data=None) -> tuple[float, float, dict]:
    """Train on party 1's data; returns (test accuracy, seconds per step, comm stats per step)."""
    from tqdm import tqdm

    rank = crypten_lite.get_rank()
    x_train, y_train, x_test, y_test = data if rank == 1 else (None,) * 4
    hot = (lambda y: nn.functional.one_hot(y, 10).float()) if rank == 1 else (lambda y: None)
    xs = crypten_lite.cryptensor(x_train, src=1)
    ys = crypten_lite.cryptensor(hot(y_train), src=1)
    xt = crypten_lite.cryptensor(x_test, src=1)
    yt = crypten_lite.cryptensor(hot(y_test), src=1)

    model.encrypt(src=0).train()
    opt = coptim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    loss_fn = cnn.CrossEntropyLoss()
    comm = crypten_lite.comm.get()
    comm.reset_communication_stats()
    steps, start = 0, time.perf_counter()
    for epoch in range(args.epochs):
        bar = tqdm(batches(xs.shape[0], args.batch, epoch, args.seed), disable=rank != 0,
                   desc=f"epoch {epoch + 1}/{args.epochs}", unit="batch")
        for idx in bar:
            opt.zero_grad()
            loss = loss_fn(model(xs[idx]), ys[idx])
            loss.backward()
            opt.step()
            steps += 1
            if steps % 10 == 0:
                bar.set_postfix(loss=f"{loss.get_plain_text().item():.3f}")
    seconds = (time.perf_counter() - start) / max(steps, 1)
    stats = {k: v / max(steps, 1) for k, v in comm.get_communication_stats().items()}
    model.eval()
    with crypten_lite.no_grad():
        predicted = model(xt).argmax(dim=1, one_hot=True)           # private one-hot
        correct = predicted.mul(yt).sum().get_plain_text().item()   # only the count is revealed
    return correct / xt.shape[0], seconds, stats


def main(argv=None, hidden_default: int = 64, description: str = "MLP") -> None:
    parser = argparse.ArgumentParser(description=f"private training of {description} on digits")
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--momentum", type=float, default=0.9)
    parser.add_argument("--hidden", type=int, default=hidden_default,
                        help="hidden units (0: logistic regression)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    crypten_lite.init()
    rank = crypten_lite.get_rank()
    data = load_digits_split(args.seed) if rank in (0, 1) else None  # rank 0: baseline only
    model, twin = build(args.hidden, args.seed)
    accuracy, seconds, stats = train_private(model, args, data)
    if rank == 0:
        plain = train_plain(twin, data, args)
        print(f"{description}: private test accuracy {accuracy * 100:.2f}%, plaintext torch "
              f"{plain * 100:.2f}% (same initialization and batches)")
        print(f"per SGD step (party 0): {seconds * 1000:.0f} ms, {stats['rounds']:.0f} rounds, "
              f"{stats['bytes_sent'] / 1024:.0f} KiB sent")
    crypten_lite.uninit()


if __name__ == "__main__":
    main()
