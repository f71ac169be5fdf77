"""cryptensor() of something that is not a tensor (a string, a dict, complex numbers): a
ProtocolError from crypten_lite on every party, naming the type (never the value) and what to
pass; the session goes on (the next sharing is exact). Numbers and nested lists are shared."""

from __future__ import annotations

import pytest
import torch

import crypten_lite
from crypten_lite.errors import ProtocolError

BAD = {"str": "hello", "dict": {"a": 1}, "complex": [1 + 2j]}


def share_bad(kind: str, at_others: bool):
    rank = crypten_lite.get_rank()
    value = BAD[kind] if (rank == 0) != at_others else None
    if at_others and rank == 0:
        value = torch.ones(2)
    try:
        crypten_lite.cryptensor(value, src=0)
        error = ""
    except ProtocolError as e:
        error = str(e)
    after = crypten_lite.cryptensor([1.5, -2.0] if rank == 0 else None, src=0).get_plain_text()
    return error, after


@pytest.mark.parametrize("kind", sorted(BAD))
def test_not_a_tensor_at_the_source(pool_all, kind):
    results = pool_all.run(share_bad, kind, False)
    type_name = type(BAD[kind]).__name__ if kind != "complex" else "list"
    for rank, (error, after) in enumerate(results):
        if rank == 0:
            assert f"party 0: cryptensor() takes a torch.Tensor" in error, error
            assert f"got a {type_name};" in error, error
        else:
            assert f"party {rank}: party 0 refused to share its input" in error, error
        assert "hello" not in error and "'a'" not in error  # the type, never the value
        assert torch.equal(after, torch.tensor([1.5, -2.0]))


def test_not_a_tensor_at_another_party(pool2):
    (error0, after0), (error1, after1) = pool2.run(share_bad, "str", True)
    assert error0 == ""
    assert error1.startswith("party 1: cryptensor() takes a torch.Tensor") and "got a str" in error1
    assert torch.equal(after0, after1) and torch.equal(after0, torch.tensor([1.5, -2.0]))


def share_numbers():
    rank = crypten_lite.get_rank()
    return (crypten_lite.cryptensor(3 if rank == 0 else None, src=0).get_plain_text(),
            crypten_lite.cryptensor([[1, 2], [3, 4]] if rank == 0 else None, src=0).get_plain_text())


def test_numbers_and_lists_are_shared(pool2):
    for scalar, nested in pool2.run(share_numbers):
        assert torch.equal(scalar, torch.tensor(3))
        assert torch.equal(nested, torch.tensor([[1, 2], [3, 4]]))
