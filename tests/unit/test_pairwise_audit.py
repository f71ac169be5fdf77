"""Issue 29's audit: more of the existing protocol suite's own programs under provider
'pairwise' (test_pairwise_provider.py runs arithmetic, offline and nn layers): the
comparisons, reductions, pooling, softmax and the other functions agree with torch as the
suite asserts under the dealer, and their online rounds and bytes are the dealer's exactly
(the provider changes nothing online)."""

from __future__ import annotations

import pytest

pytest.importorskip("tenseal")
pytest.importorskip("nacl")

from tests.conftest import get_pool  # noqa: E402
from tests.protocol import test_comparisons as comparisons  # noqa: E402
from tests.protocol import test_functions as functions  # noqa: E402


@pytest.fixture(scope="module")
def pw():
    return get_pool(2, provider="pairwise")


@pytest.mark.parametrize("fn", [comparisons.comparison_results, comparisons.piecewise_results,
                                comparisons.reduction_results, comparisons.pooling_results,
                                comparisons.binary_results])
def test_comparison_suite_under_pairwise(pw, fn):
    comparisons.test_matches_torch(pw, fn)


def test_functions_suite_under_pairwise(pw):
    """test_functions' own assertions (2-party branch: softmax in 25 rounds, as the dealer).
    Its misc functions (12 s under pairwise, the correlations made on demand) add only the
    probabilistic truncation pair ("trunc") to the kinds softmax and rounding use, whose
    relation tests/protocol/test_pairwise_provider.py checks; they are left to the dealer's run."""
    functions.test_softmax(pw)
    functions.test_rounding_is_exact(pw)


def test_comparison_counts_are_the_dealers():
    """Rounds and bytes of lt, ltz, ge, relu, abs, eq and max on 1000 elements: the same under
    both providers (and the suite's exact formula holds under pairwise too)."""
    n = 1000
    dealer = get_pool(2).run(comparisons.counts, n)[0]
    pairwise = get_pool(2, provider="pairwise").run(comparisons.counts, n)[0]
    assert pairwise == dealer
    msb, bits = comparisons.msb_words_sent(n, 2), comparisons._ceil(n, 64)
    assert pairwise["lt"] == (5, 8 * (msb + bits)) and pairwise["relu"] == (5, 8 * (msb + bits + n))


@pytest.mark.parametrize("name", ["mlp", "lenet", "attention"])
def test_converted_models_under_pairwise(pw, name):
    """test_nn's converted private models (relu, pools, softmax, relu6) under pairwise: the
    dealer suite's own tolerance and the same predicted classes as torch."""
    import torch

    from tests.protocol import test_nn as nn_tests
    make, shape = nn_tests._models().MODELS[name]
    x = nn_tests.randn(2, *shape[1:], seed=5)
    with torch.no_grad():
        expected = make()(x)
    got = pw.run(nn_tests.party_private_model, name, x)[0]
    assert torch.equal(got.argmax(-1), expected.argmax(-1))
    assert (got - expected).abs().max().item() <= nn_tests.MODEL_TOL
