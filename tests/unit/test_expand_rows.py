"""circuits.expand_rows (a small job's masked polynomial on whole numpy arrays) against the
per-product expansion, and provider.Correlation.rows (a correlation's components as one
numpy array on their memory) against its components, with the cases where it must refuse."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from crypten_lite.mpc import circuits
from crypten_lite.provider import Correlation, consecutive_rows
from crypten_lite.provider import correlations

JOBS = [[circuits.CARRY4_G, circuits.CARRY4_P], [circuits.CARRY4_G_ONLY], [circuits.CARRY2_G, circuits.CARRY2_P],
        [circuits.CARRY2_G_ONLY], [circuits.AND4], [circuits.GROUP2_G, circuits.GROUP2_P], [circuits.MAJ3],
        [[(0, 1, 2)]]]


def _rand(gen, *shape):
    return torch.randint(-(1 << 63), (1 << 63) - 1, shape, dtype=torch.int64, generator=gen)


@pytest.mark.parametrize("outputs", JOBS)
@pytest.mark.parametrize("lead", [True, False])
@pytest.mark.parametrize("words", [1, 9, 130])
def test_expand_rows_is_expand_outputs(outputs, lead, words):
    """The same shares as expand_outputs (torch's path) for every circuit shape the protocols
    use, on both ranks (lead: rank 0 adds the public products), inputs unchanged."""
    gen = torch.Generator().manual_seed(words * 7 + len(outputs))
    k = 1 + max(j for out in outputs for t in out for j in t)
    monos = circuits.monomials([t for out in outputs for t in out])
    opened = _rand(gen, k, words).numpy()
    masks = _rand(gen, k, words).numpy()
    mono_rows = _rand(gen, max(len(monos), 1), words).numpy()[:len(monos)]
    before = [opened.copy(), masks.copy(), mono_rows.copy()]
    got = circuits.expand_rows(outputs, opened, masks, mono_rows, monos, lead)
    lead_t = torch.full((words,), -1 if lead else 0, dtype=torch.int64)
    want = circuits.expand_outputs(outputs, [torch.from_numpy(o) for o in opened],
                                   [torch.from_numpy(m) for m in masks],
                                   {m: torch.from_numpy(mono_rows[i]) for i, m in enumerate(monos)}, lead_t)
    assert got.shape == (len(outputs), words) and got.dtype == np.int64
    for g, w in zip(got, want):
        assert np.array_equal(g, w.numpy())
    assert all(np.array_equal(a, b) for a, b in zip(before, [opened, masks, mono_rows]))


def test_expand_rows_reconstructs_the_polynomial():
    """Two parties' expand_rows XOR to the plain polynomial of the unmasked inputs."""
    gen = torch.Generator().manual_seed(5)
    words, outputs = 33, [circuits.CARRY4_G, circuits.CARRY4_P]
    monos = circuits.monomials(outputs[0] + outputs[1])
    x = _rand(gen, 7, words).numpy()
    m = _rand(gen, 7, words).numpy()
    m1 = _rand(gen, 7, words).numpy()
    prods = np.stack([np.bitwise_and.reduce(m[list(mo)], 0) for mo in monos])
    p1 = _rand(gen, len(monos), words).numpy()
    opened = x ^ m
    shares = [circuits.expand_rows(outputs, opened, m ^ m1, prods ^ p1, monos, True),
              circuits.expand_rows(outputs, opened, m1, p1, monos, False)]
    total = shares[0] ^ shares[1]
    for out, got in zip(outputs, total):
        want = np.zeros(words, dtype=np.int64)
        for term in out:
            want ^= np.bitwise_and.reduce(x[list(term)], 0)
        assert np.array_equal(got, want)


def test_correlation_rows_are_its_components():
    """rows() of a seeded request (one keystream) and of rank 0's joined corrections are the
    components' values on their memory; across the cut between them it is None."""
    shapes = ((40,),) * 10
    parts = correlations.derive(bytes(32), 3, "binary_monomials", "", [(40,)], (4, -1, -1, -1, -1, 3, 5, 6, 7, 12, 15),
                                upto=4)
    assert len(parts) == 4
    fixes_joint = torch.arange(6 * 40, dtype=torch.int64)
    corr = Correlation(parts + [None] * 6, lambda: list(fixes_joint.split_with_sizes([40] * 6)), shapes)
    masks = corr.rows(0, 4)
    assert masks.shape == (4, 40) and all(np.array_equal(masks[j], parts[j].numpy()) for j in range(4))
    comps = corr.corrected()
    monos = corr.rows(4, 6)
    assert monos.shape == (6, 40) and all(np.array_equal(monos[j], comps[4 + j].numpy()) for j in range(6))
    assert np.shares_memory(monos, fixes_joint.numpy())
    assert corr.rows(2, 4) is None  # two masks and two corrections: two memories


def test_correlation_rows_refuse_what_is_not_one_array():
    """Separate tensors, parts of unequal sizes, multi-dimensional or out-of-order parts: None."""
    separate = [torch.arange(8, dtype=torch.int64) for _ in range(3)]
    assert Correlation(separate, None, ((8,),) * 3).rows(0, 3) is None
    assert consecutive_rows(separate) is None
    buf = torch.arange(24, dtype=torch.int64)
    uneven = list(buf.split_with_sizes([8, 6, 10]))
    assert Correlation(uneven, None, ((8,), (6,), (10,))).rows(0, 3) is None
    assert consecutive_rows(uneven) is None
    even = list(buf.split_with_sizes([8, 8, 8]))
    assert consecutive_rows(even[::-1]) is None
    assert consecutive_rows([even[0], even[2]]) is None
    assert consecutive_rows(even).shape == (3, 8)
    assert Correlation([buf.view(3, 8)], None, ((3, 8),)).rows(0, 1) is None
    assert Correlation(even, None).rows(0, 3).shape == (3, 8)  # no shapes: every part checked
    assert Correlation(even[:2] + [None], lambda: [torch.zeros(8, dtype=torch.int64)],
                       ((8,),) * 3).rows(0, 3) is None



def test_rows_refuse_strided_and_expanded_parts():
    """Parts at the offsets consecutive parts would have but not on their memory: a strided
    view (every other word) or an expanded one (one word repeated) are not rows of the base."""
    base = torch.arange(32, dtype=torch.int64)
    strided = [base[0:8:2], base[4:12:2], base[8:16:2]]
    assert consecutive_rows(strided) is None
    assert Correlation(strided, None, ((4,),) * 3).rows(0, 3) is None
    expanded = [base[0:1].expand(4), base[4:5].expand(4)]
    assert consecutive_rows(expanded) is None
    assert Correlation(expanded, None, ((4,),) * 2).rows(0, 2) is None
    good = list(base[:12].split(4))
    assert (consecutive_rows(good) == base[:12].numpy().reshape(3, 4)).all()
