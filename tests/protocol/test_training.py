"""Private training: optimizer steps against torch.optim from the same initialization, and
short training runs that must reduce the loss (2 and 3 parties).

Tolerance: after k steps the parameters differ from torch's by the fixed-point error of
each step (a few ulps per product) times k: 2e-3 absolute for the SGD runs below; Adam
divides by sqrt(v) (approximations), 2e-2.
"""

from __future__ import annotations

import os
import sys

import pytest
import torch
import torch.nn as nn

import crypten_lite
import crypten_lite.nn as cnn
import crypten_lite.optim as coptim

sys.path.insert(0, os.path.dirname(__file__))
from test_nn import needs  # noqa: E402

SGD_TOL = dict(atol=2e-3, rtol=2e-3)
ADAM_TOL = dict(atol=2e-2, rtol=2e-2)

OPTIMIZERS = {
    "sgd": (dict(lr=0.1), SGD_TOL),
    "sgd_momentum": (dict(lr=0.05, momentum=0.9), SGD_TOL),
    "sgd_nesterov_wd": (dict(lr=0.05, momentum=0.9, nesterov=True, weight_decay=0.01), SGD_TOL),
    "sgd_dampening": (dict(lr=0.05, momentum=0.5, dampening=0.3), SGD_TOL),
    "adam": (dict(lr=0.05), ADAM_TOL),
}


def _regression(seed: int = 0):
    gen = torch.Generator().manual_seed(seed)  # test data only
    x = torch.randn(32, 5, generator=gen)
    y = x @ torch.randn(5, 2, generator=gen) + 0.5
    torch.manual_seed(seed)  # test model only
    return x, y, nn.Linear(5, 2)


def _torch_optimizer(name, params):
    kwargs = OPTIMIZERS[name][0]
    return (torch.optim.Adam if name == "adam" else torch.optim.SGD)(params, **kwargs)


def _our_optimizer(name, params):
    kwargs = OPTIMIZERS[name][0]
    return (coptim.Adam if name == "adam" else coptim.SGD)(params, **kwargs)


def party_optimizer_steps(name: str, steps: int):
    x, y, torch_model = _regression()
    model = cnn.from_pytorch(torch_model, x, check=False).encrypt(src=0)
    xs, ys = crypten_lite.cryptensor(x, src=1), crypten_lite.cryptensor(y, src=1)
    opt = _our_optimizer(name, model.parameters())
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = cnn.MSELoss()(model(xs), ys)
        loss.backward()
        opt.step()
        losses.append(loss.get_plain_text().item())
    return {k: v.get_plain_text() for k, v in model.state_dict().items()}, losses


def _check_optimizer(pool, name: str) -> None:
    steps = 4
    x, y, model = _regression()
    opt = _torch_optimizer(name, model.parameters())
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = nn.MSELoss()(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    state, got_losses = pool.run(party_optimizer_steps, name, steps)[0]
    tol = OPTIMIZERS[name][1]
    for k, v in model.state_dict().items():
        torch.testing.assert_close(state[k], v, **tol, msg=lambda m, k=k: f"{name} {k}: {m}")
    torch.testing.assert_close(torch.tensor(got_losses), torch.tensor(losses), **tol)


@pytest.mark.parametrize("name", sorted(OPTIMIZERS))
def test_optimizer_matches_torch(pool2, name):
    if name == "adam":
        needs("inv_sqrt")
    _check_optimizer(pool2, name)


@pytest.fixture(params=["pool3", "pool3_rss"], ids=["3pc", "3rss"])
def pool3_any(request):
    """3 parties: additive (with the dealer) and rss (no dealer)."""
    return request.getfixturevalue(request.param)


@pytest.mark.parametrize("name", ["sgd_momentum", "adam"])
def test_optimizer_with_state_3_parties(pool3_any, name):
    if name == "adam":
        needs("inv_sqrt")
    _check_optimizer(pool3_any, name)


# ----------------------------------------------------------------- training reduces the loss
def _digits(n: int = 120):
    from sklearn.datasets import load_digits
    data = load_digits()
    x = torch.tensor(data.data[:n], dtype=torch.float32) / 16.0
    y = torch.tensor(data.target[:n])
    return x, y


def party_train_mlp(epochs: int, batch: int):
    x, y = _digits()
    torch.manual_seed(0)  # test model only
    model = cnn.Sequential(cnn.Linear(64, 16), cnn.ReLU(), cnn.Linear(16, 10)).encrypt(src=0)
    rank = crypten_lite.get_rank()
    onehot = torch.nn.functional.one_hot(y, 10).float()
    xs = crypten_lite.cryptensor(x if rank == 1 else None, src=1)
    ys = crypten_lite.cryptensor(onehot if rank == 1 else None, src=1)
    opt = coptim.SGD(model.parameters(), lr=0.5, momentum=0.5)
    loss_fn = cnn.CrossEntropyLoss()
    losses = []
    for _ in range(epochs):
        total = 0.0
        for i in range(0, x.shape[0], batch):
            opt.zero_grad()
            loss = loss_fn(model(xs[i:i + batch]), ys[i:i + batch])
            loss.backward()
            opt.step()
            total += loss.get_plain_text().item()
        losses.append(total)
    with crypten_lite.no_grad():
        pred = model(xs).get_plain_text().argmax(1)
    return losses, (pred == y).float().mean().item()


def _plain_mlp(epochs: int, batch: int):
    x, y = _digits()
    torch.manual_seed(0)  # the same initialization as the private run
    init = cnn.Sequential(cnn.Linear(64, 16), cnn.ReLU(), cnn.Linear(16, 10)).state_dict()
    model = nn.Sequential(nn.Linear(64, 16), nn.ReLU(), nn.Linear(16, 10))
    model.load_state_dict(init)
    opt = torch.optim.SGD(model.parameters(), lr=0.5, momentum=0.5)
    losses = []
    for _ in range(epochs):
        total = 0.0
        for i in range(0, x.shape[0], batch):
            opt.zero_grad()
            loss = nn.functional.cross_entropy(model(x[i:i + batch]), y[i:i + batch])
            loss.backward()
            opt.step()
            total += loss.item()
        losses.append(total)
    return losses, (model(x).argmax(1) == y).float().mean().item()


def test_short_training_reduces_loss_like_torch(pool_all):
    pool = pool_all  # 2 and 3 parties additive, 3 parties rss
    needs("relu", "log_softmax")
    losses, accuracy = pool.run(party_train_mlp, 4, 30)[0]
    plain_losses, plain_accuracy = _plain_mlp(4, 30)
    assert losses[-1] < 0.5 * losses[0], losses
    torch.testing.assert_close(torch.tensor(losses), torch.tensor(plain_losses), atol=0.1, rtol=0.05)
    assert abs(accuracy - plain_accuracy) <= 0.05
