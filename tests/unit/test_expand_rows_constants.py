"""circuits.expand_rows against expand_outputs for outputs that have no row on a party: an
output with no terms (0), or only the empty term (the constant 1, added by rank 0 alone).
np.bitwise_xor.reduceat gives an empty segment the next row (or an IndexError at the end),
not 0, so _row_plan leaves such outputs out of the reduction and expand_rows gives them 0. No
protocol's circuit has such an output today (binary.eval_polys' jobs): a latent gap found by
the review of issue 32, fixed."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from crypten_lite.mpc import circuits


@pytest.mark.parametrize("outputs, lead", [
    ([[()], [(0, 1)]], False), ([[(0, 1)], [()]], False),      # the constant 1 on rank 1
    ([[], [(0, 1)]], True), ([[], [(0, 1)]], False), ([[(0, 1)], []], True), ([[(0, 1)], []], False)])
def test_expand_rows_of_an_output_without_rows(outputs, lead):
    gen = torch.Generator().manual_seed(5)
    words = 3

    def rand(*shape):
        return torch.randint(-(1 << 63), (1 << 63) - 1, shape, dtype=torch.int64, generator=gen).numpy()
    monos = circuits.monomials([t for out in outputs for t in out])
    opened, masks = rand(2, words), rand(2, words)
    mono_rows = rand(max(len(monos), 1), words)[:len(monos)]
    lead_t = torch.full((words,), -1 if lead else 0, dtype=torch.int64)
    want = circuits.expand_outputs(outputs, [torch.from_numpy(o) for o in opened],
                                   [torch.from_numpy(m) for m in masks],
                                   {m: torch.from_numpy(mono_rows[i]) for i, m in enumerate(monos)}, lead_t)
    got = circuits.expand_rows(outputs, opened, masks, mono_rows, monos, lead)
    assert all(np.array_equal(g, w.numpy()) for g, w in zip(got, want))
