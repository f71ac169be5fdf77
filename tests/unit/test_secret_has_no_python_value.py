"""A CrypTensor refuses every conversion to a plain Python / NumPy value, with a hint."""

from __future__ import annotations

import operator

import pytest
import torch

from crypten_lite.cryptensor import CrypTensor
from crypten_lite.errors import ProtocolError

CONVERSIONS = {
    "item()": lambda x: x.item(),
    "tolist()": lambda x: x.tolist(),
    "numpy()": lambda x: x.numpy(),
    "float()": float,
    "int()": int,
    "complex()": complex,
    "operator.index": operator.index,
}


@pytest.mark.parametrize("what", sorted(CONVERSIONS))
def test_conversion_to_a_plain_value_says_to_reveal_first(what):
    x = CrypTensor(torch.zeros((), dtype=torch.int64), 16, torch.float32)  # a share, no session needed
    with pytest.raises(ProtocolError, match=r"get_plain_text\(\)"):
        CONVERSIONS[what](x)


def test_numpy_asarray_is_refused():
    np = pytest.importorskip("numpy")
    x = CrypTensor(torch.zeros(3, dtype=torch.int64), 16, torch.float32)
    with pytest.raises(ProtocolError, match=r"get_plain_text\(\)"):
        np.asarray(x)


def test_bool_keeps_its_message():
    x = CrypTensor(torch.zeros((), dtype=torch.int64), 16, torch.float32)
    with pytest.raises(ProtocolError, match="Python bool"):
        bool(x)
