"""provider._spec (memoised for hashable arguments) gives the canonical form of every way a
request's shapes and params are written, and still refuses what is not an integer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from crypten_lite.provider import _spec, _spec_of


@pytest.mark.parametrize("shapes, params", [
    ([(432,)], (7, -1, -1, 3, 5)),
    ([torch.Size([2, 3]), (3, 4)], [1, 0]),
    ([[2, 3], [3, 4]], ()),  # lists: not hashable, the slow path
    ((torch.Size([5]),), (np.int64(4), True)),
])
def test_spec_is_the_canonical_form(shapes, params):
    want = _spec_of("triple", "mul", shapes, params)
    for _ in range(2):  # computed, then from the cache
        got = _spec("triple", "mul", shapes, params)
        assert got == want
        assert all(type(d) is int for shape in got[2] for d in shape) and all(type(p) is int for p in got[3])


def test_spec_refuses_a_non_integer_every_time():
    for _ in range(2):
        with pytest.raises(ValueError):
            _spec("triple", "mul", [("a",)], ())


def test_spec_of_a_tensor_changed_in_place_is_its_new_value():
    # a tensor hashes by identity: a memo keyed by the caller's objects answered the old value
    t = torch.tensor(3)
    assert _spec("triple", "mul", [(4,)], (t,))[3] == (3,)
    t.fill_(5)
    assert _spec("triple", "mul", [(4,)], (t,))[3] == (5,)
    shape = torch.tensor(6)
    assert _spec("triple", "mul", [(shape,)], ())[2] == ((6,),)
    shape.fill_(7)
    assert _spec("triple", "mul", [(shape,)], ())[2] == ((7,),)


def test_spec_of_a_str_subclass_kind_is_str_of_it():
    import enum

    class Kind(str, enum.Enum):
        TRIPLE = "triple"

    _spec("triple", "mul", [(4,)], ())
    assert _spec(Kind.TRIPLE, "mul", [(4,)], ()) == _spec_of(Kind.TRIPLE, "mul", [(4,)], ())
