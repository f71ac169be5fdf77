"""Pure parts of the secure core: encoding, PRG, zero-sharing, correlations, config, serde."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from crypten_lite import encoding
from crypten_lite.comm import serde
from crypten_lite.comm.mailbox import Mailbox
from crypten_lite.config import Config
from crypten_lite.errors import CommunicationError, ConfigError, ProtocolError
from crypten_lite.provider import correlations
from crypten_lite.random import PRG, KeyPair, fresh_seed, pair_info, zero_share

floats = st.floats(min_value=-1e6, max_value=1e6, allow_nan=False)


@given(st.lists(floats, min_size=1, max_size=50), st.integers(0, 24))
def test_encode_decode_roundtrip(values, precision):
    t = torch.tensor(values, dtype=torch.float64)
    back = encoding.decode(encoding.encode(t, precision), precision, torch.float64)
    assert (back - t).abs().max() <= 2.0 ** -(precision + 1) + 1e-9 * t.abs().max()


def test_encode_rejects_out_of_range_and_nan():
    with pytest.raises(ProtocolError, match="fixed-point range"):
        encoding.encode(torch.tensor([2.0 ** 50]), 16)
    with pytest.raises(ProtocolError, match="NaN"):
        encoding.encode(torch.tensor([float("nan")]), 16)


def test_integers_encode_at_scale_one_exactly():
    t = torch.tensor([2 ** 40, -5, 0])
    assert torch.equal(encoding.decode(encoding.encode(t, 0), 0, torch.int64), t)


def test_prg_is_deterministic_and_domain_separated():
    seed = fresh_seed()
    a, b = PRG(seed), PRG(seed)
    assert torch.equal(a.draw((100,)), b.draw((100,)))
    assert not torch.equal(a.draw((100,)), PRG(seed).draw((100,)))  # counter advanced
    assert not torch.equal(PRG(seed).draw((8,), counter=5, domain=0), PRG(seed).draw((8,), counter=5, domain=1))
    x = PRG(seed).draw((100_000,))
    # Uniform 64-bit words: each bit is set about half of the time.
    bits = torch.stack([(x >> i) & 1 for i in range(64)]).float().mean(1)
    assert ((bits - 0.5).abs() < 0.01).all()
    assert "seed" not in repr(a) and seed.hex() not in repr(a)


def test_x25519_seed_agreement_is_symmetric():
    a, b = KeyPair(), KeyPair()
    info = pair_info("s", 0, 1)
    assert a.shared_seed(b.public_bytes, info) == b.shared_seed(a.public_bytes, pair_info("s", 1, 0))
    assert a.shared_seed(b.public_bytes, info) != a.shared_seed(b.public_bytes, pair_info("t", 0, 1))


@settings(max_examples=20, deadline=None)
@given(st.integers(2, 5), st.integers(1, 30))
def test_zero_sharing_sums_to_zero(world, n):
    seeds = {(i, j): fresh_seed() for i in range(world) for j in range(i + 1, world)}
    total = torch.zeros(n, dtype=torch.int64)
    shares = []
    for r in range(world):
        prgs = {p: PRG(seeds[tuple(sorted((r, p)))]) for p in range(world) if p != r}
        shares.append(zero_share(prgs, r, (n,)))
        total += shares[-1]
    assert torch.equal(total, torch.zeros(n, dtype=torch.int64))
    assert not torch.equal(shares[0], torch.zeros(n, dtype=torch.int64))


@pytest.mark.parametrize("world", [2, 3])
@pytest.mark.parametrize("kind,op,shapes,params", [
    ("triple", "mul", [(5,), (5,)], ()),
    ("triple", "matmul", [(3, 4), (4, 2)], ()),
    ("triple", "conv2d", [(1, 2, 5, 5), (3, 2, 3, 3)], (1, 1, 0, 0, 1, 1, 1)),
    ("square", "", [(6,)], ()),
    ("bit", "", [(7,)], ()),
    ("binary_triple", "", [(4,)], ()),
    ("trunc", "", [(9,)], (16,)),
])
def test_dealer_corrections_give_correct_correlations(world, kind, op, shapes, params):
    seeds = {r: fresh_seed() for r in range(world)}
    parts = {r: correlations.derive(seeds[r], 7, kind, op, shapes, params) for r in range(world)}
    fixes = correlations.corrections(seeds, 7, kind, op, shapes, params)
    parts[0][len(parts[0]) - len(fixes):] = fixes

    def add(j):
        return sum(parts[r][j] for r in range(world))

    def xor(j):
        out = torch.zeros_like(parts[0][j])
        for r in range(world):
            out ^= parts[r][j]
        return out
    if kind == "triple":
        assert torch.equal(correlations.TRIPLE_OPS[op](add(0), add(1), params), add(2))
    elif kind == "square":
        assert torch.equal(add(0) * add(0), add(1))
    elif kind == "bit":
        assert torch.equal(xor(0), add(1)) and set(xor(0).tolist()) <= {0, 1}
    elif kind == "binary_triple":
        assert torch.equal(xor(0) & xor(1), xor(2))
    elif kind == "trunc":
        r = add(0)
        assert torch.equal(correlations.logical_shift(r, 16), add(1))
        assert torch.equal(correlations.logical_shift(r, 63), add(2))


def test_config_from_env_and_errors(tmp_path):
    env = {"CRYPTEN_LITE_RANK": "1", "CRYPTEN_LITE_WORLD_SIZE": "2",
           "CRYPTEN_LITE_PARTIES": "a:1, b:2", "CRYPTEN_LITE_TIMEOUT": "5"}
    c = Config.from_env(env)
    assert c.rank == 1 and c.parties == ("a:1", "b:2") and c.timeout == 5.0
    toml = tmp_path / "c.toml"
    toml.write_text('rank = 0\nworld_size = 3\nparties = ["h:1", "h:2", "h:3"]\nprecision = 12\n')
    c = Config.from_env({"CRYPTEN_LITE_CONFIG": str(toml)})
    assert c.world_size == 3 and c.precision == 12
    with pytest.raises(ConfigError, match="out of range"):
        Config.from_env({"CRYPTEN_LITE_RANK": "2", "CRYPTEN_LITE_WORLD_SIZE": "2"})
    with pytest.raises(ConfigError, match="lists 1 addresses"):
        Config.from_env({"CRYPTEN_LITE_WORLD_SIZE": "2", "CRYPTEN_LITE_PARTIES": "a:1"})
    with pytest.raises(ConfigError, match="host:port"):
        Config.from_env({"CRYPTEN_LITE_WORLD_SIZE": "1", "CRYPTEN_LITE_PARTIES": "nope"})
    assert Config(precision=16).digest() != Config(precision=12).digest()


def test_serde_roundtrip_and_validation():
    for t in [torch.arange(10), torch.randn(3, 4), torch.tensor([True, False]), torch.zeros(0, 3)]:
        dtype, shape, data = serde.to_bytes(t)
        assert torch.equal(serde.from_bytes(dtype, shape, bytes(data)), t)
    with pytest.raises(CommunicationError):
        serde.from_bytes("int64", (3,), b"\x00" * 16)
    with pytest.raises(CommunicationError):
        serde.from_bytes("pickle", (1,), b"x")
    with pytest.raises(CommunicationError):
        serde.check_header("int64", (1 << 40,), 1 << 20)


def test_mailbox_orders_by_sequence_and_refuses_duplicates():
    box = Mailbox(rank=0, world_size=2, timeout=0.2)
    box.put(1, 1, torch.tensor([2]))
    box.put(1, 0, torch.tensor([1]))
    assert box.take(1).item() == 1 and box.take(1).item() == 2
    with pytest.raises(CommunicationError, match="duplicate"):
        box.put(1, 0, torch.tensor([3]))
    with pytest.raises(CommunicationError, match="within"):
        box.take(1)
    box.fail(1, "connection lost")
    with pytest.raises(CommunicationError, match="party 1 is unreachable"):
        box.take(1)


def test_library_uses_no_insecure_randomness():
    import re
    root = os.path.join(os.path.dirname(__file__), "..", "..", "crypten_lite")
    pattern = re.compile(r"torch\.(rand|randn|randint|randperm|manual_seed|Generator)\b|numpy\.random|np\.random|^\s*import random\b|from random import", re.M)
    offenders = []
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f.endswith(".py") and "_proto" not in dirpath:
                text = open(os.path.join(dirpath, f)).read()
                for m in pattern.finditer(text):
                    line = text[:m.start()].count("\n") + 1
                    if "# insecure-ok" not in text.splitlines()[line - 1]:
                        offenders.append(f"{f}:{line}")
    assert not offenders, f"non-cryptographic randomness in the library: {offenders}"


def test_layering():
    """A lower layer never imports a higher one (docs/design.md section 3)."""
    import re
    order = ["config", "errors", "encoding", "random", "comm", "provider", "session", "mpc",
             "cryptensor", "torch_functions", "functions", "autograd", "nn", "optim", "quantized", "cli"]
    root = os.path.join(os.path.dirname(__file__), "..", "..", "crypten_lite")
    lower = {"comm": ["provider", "session", "mpc", "cryptensor", "functions", "autograd", "nn", "optim", "quantized"],
             "provider": ["session", "mpc", "cryptensor", "functions", "autograd", "nn", "optim", "quantized"]}
    bad = []
    for layer, forbidden in lower.items():
        for dirpath, _, files in os.walk(os.path.join(root, layer)):
            for f in files:
                if f.endswith(".py"):
                    text = open(os.path.join(dirpath, f)).read()
                    for name in forbidden:
                        if re.search(rf"from \.\.{name}\b|import crypten_lite\.{name}\b", text):
                            bad.append(f"{layer}/{f} imports {name}")
    grpc_users = []
    for dirpath, _, files in os.walk(root):
        for f in files:
            if f.endswith(".py") and "comm" not in dirpath and "_proto" not in dirpath:
                if re.search(r"^\s*import grpc|^\s*from grpc", open(os.path.join(dirpath, f)).read(), re.M):
                    grpc_users.append(f)
    assert not bad and not grpc_users and order
