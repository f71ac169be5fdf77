"""The Replicated share type without a network: every op applied to the three parties' shares
reconstructs to torch's result on the plain values; products of shares and unknown ops are
refused by name (never a silently wrong result)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from crypten_lite.config import Config
from crypten_lite.errors import CommunicationError, ConfigError
from crypten_lite.mpc.replicated import Replicated, of_party, reconstruct, split

_G = torch.Generator().manual_seed(0)  # test data and simulated randomness only


def _rnd(shape):
    return torch.randint(-2 ** 62, 2 ** 62, tuple(shape), generator=_G)


def _shares(v: torch.Tensor, binary: bool = False) -> list[Replicated]:
    comps = split(v, [_rnd(v.shape), _rnd(v.shape)], binary)
    return [of_party(comps, r) for r in range(3)]


X = torch.arange(12).reshape(3, 4) - 5
Y = torch.arange(12).reshape(3, 4) * 7
W = torch.tensor([[1, -2], [0, 3], [4, 1], [-1, -1]])
MASK = torch.tensor([True, False, True, False])


def _set(x, idx, v):
    x = x.clone()
    x[idx] = v
    return x


def _inplace(x, y):
    x = x.clone()
    x += y
    x += 2
    x *= 3
    return x


# (name, f) with f applied to shares and to plain tensors alike; arithmetic sharing
ARITH = [
    ("add", lambda x, y: x + y), ("sub", lambda x, y: x - y), ("add_scalar", lambda x, y: x + 5),
    ("rsub_scalar", lambda x, y: 5 - x), ("add_tensor", lambda x, y: x + torch.arange(4)),
    ("mul_scalar", lambda x, y: x * 3), ("mul_tensor", lambda x, y: x * torch.arange(4)),
    ("matmul_public", lambda x, y: x @ W), ("rmatmul_public", lambda x, y: W.T @ x.T),
    ("reshape_slice", lambda x, y: x.reshape(-1)[2:7]), ("permute", lambda x, y: x.permute(1, 0).reshape(2, 6)),
    ("sum", lambda x, y: x.sum(0)), ("sum_all", lambda x, y: x.sum()), ("cumsum", lambda x, y: x.cumsum(1)),
    ("cat", lambda x, y: torch.cat([x, y])), ("stack", lambda x, y: torch.stack([x, y])),
    ("cat_public", lambda x, y: torch.cat([x, torch.ones(1, 4, dtype=torch.int64)])),
    ("neg", lambda x, y: -x), ("lshift", lambda x, y: x << 3), ("index", lambda x, y: x[[0, 2]]),
    ("setitem_shared", lambda x, y: _set(x, 1, y[0])), ("setitem_public", lambda x, y: _set(x, (slice(1, None), 1), 7)),
    ("setitem_public_tensor", lambda x, y: _set(x, torch.tensor([0, 2]), torch.tensor([1, 2, 3, 4]))),
    ("fill_shared", lambda x, y: _set(x, (slice(None), slice(1, 3)), y[0, 0])),
    ("zeros_like", lambda x, y: torch.zeros_like(x)), ("ones_like", lambda x, y: torch.ones_like(x)),
    ("full_like", lambda x, y: torch.full_like(x, -3)),
    ("where", lambda x, y: torch.where(MASK, x, y)), ("where_public", lambda x, y: torch.where(MASK, x, 9)),
    ("inplace", _inplace), ("pad", lambda x, y: F.pad(x, (1, 1))),
    ("expand", lambda x, y: x[:, :1].expand(3, 4) + y), ("unbind", lambda x, y: x.unbind(0)[1]),
    ("split", lambda x, y: x.split(2, 1)[1]), ("flip_roll", lambda x, y: x.flip(0).roll(1, 1)),
    ("gather", lambda x, y: x.gather(1, torch.tensor([[0], [1], [2]]))),
]
BINARY = [
    ("xor", lambda x, y: x ^ y), ("xor_public", lambda x, y: x ^ 5), ("and_public", lambda x, y: x & 6),
    ("or_public", lambda x, y: x | 6), ("not", lambda x, y: ~x), ("rshift", lambda x, y: x >> 2),
]


@pytest.mark.parametrize("name,f", ARITH, ids=[n for n, _ in ARITH])
def test_linear_ops_on_arithmetic_shares(name, f):
    xs, ys = _shares(X), _shares(Y)
    assert torch.equal(reconstruct([f(xs[r], ys[r]) for r in range(3)]), f(X, Y))


@pytest.mark.parametrize("name,f", BINARY, ids=[n for n, _ in BINARY])
def test_linear_ops_on_binary_shares(name, f):
    xs, ys = _shares(X, True), _shares(Y, True)
    assert torch.equal(reconstruct([f(xs[r], ys[r]) for r in range(3)], binary=True), f(X, Y))


def test_conv2d_by_public_weight():
    img = torch.randint(-3, 3, (1, 1, 5, 5), generator=_G)
    w = torch.randint(-3, 3, (2, 1, 3, 3), generator=_G)
    xs = _shares(img)
    assert torch.equal(reconstruct([F.conv2d(xs[r], w, padding=1) for r in range(3)]),
                       F.conv2d(img, w, padding=1))


@pytest.mark.parametrize("f,words", [
    (lambda x, y: x * y, "mul of two replicated shares"),
    (lambda x, y: x @ y.T, "matmul of two replicated shares"),
    (lambda x, y: x & y, "bitwise_and of two replicated shares"),
    (lambda x, y: x.float(), "_to_copy"),
    (lambda x, y: torch.cat([x, y.float()]), "_to_copy"),
    (lambda x, y: x.numpy(), "two components"),
], ids=["mul", "matmul", "and", "float", "cat_float", "numpy"])
def test_products_and_unknown_ops_are_refused_by_name(f, words):
    xs, ys = _shares(X), _shares(Y)
    with pytest.raises(TypeError, match=words):
        f(xs[0], ys[0])


def test_comparisons_and_secret_or_are_refused():
    xs, ys = _shares(X), _shares(Y)
    for f in (lambda x, y: x < y, lambda x, y: x | y, lambda x, y: bool(x)):
        with pytest.raises(TypeError):
            f(xs[0], ys[0])


def test_components_are_checked():
    with pytest.raises(TypeError, match="int64"):
        Replicated(torch.zeros(2), torch.zeros(2))
    with pytest.raises(TypeError, match="same shape"):
        Replicated(torch.zeros(2, dtype=torch.int64), torch.zeros(3, dtype=torch.int64))
    assert "shape=(3, 4)" in repr(_shares(X)[0])  # never the values


def test_a_replicated_share_is_never_sent_whole():
    from crypten_lite.comm.communicator import Communicator

    class Probe(Communicator):
        def _send(self, tensor, dst):
            raise AssertionError("must be refused before the transport")

        def _recv(self, src):
            raise AssertionError

    with pytest.raises(CommunicationError, match="component"):
        Probe(0, 3).send(_shares(X)[0], 1)


def test_rss_config_needs_three_parties():
    assert Config(world_size=3, rank=2, protocol="rss").protocol == "rss"
    with pytest.raises(ConfigError, match="exactly 3 parties"):
        Config(world_size=2, protocol="rss")
    with pytest.raises(ConfigError, match="protocol must be one of"):
        Config(world_size=3, protocol="aby3")
    assert Config(world_size=3, protocol="rss").digest() != Config(world_size=3).digest()
