"""Tied weights of a model shipped in-band (issue 32, memory): GPT-2's token embedding and LM
head are one tensor in torch; after encrypt every party holds ONE CrypTensor for both (not two
copies of a vocabulary-by-hidden share), with the sharing costs of before, and the private
model still equals torch. On private token ids the embedding (one_hot @ W) and the head
(x @ W^T, the "linear" product) share ONE fixed mask: the first forward opens W - B once (8
bytes per element fewer per party than with the head's own mask), the next ones cost the same. A description naming a bad tied group is refused."""

from __future__ import annotations

import importlib
import importlib.util
import warnings

import pytest
import torch

import crypten_lite
from crypten_lite import comm
from crypten_lite.mpc import fixed
from crypten_lite.nn import graph_desc as gd

pytestmark = [pytest.mark.skipif(importlib.util.find_spec("transformers") is None,
                                 reason="transformers is not installed"),
              pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning",
                                         "ignore::FutureWarning")]

HF = (f"{__package__}." if __package__ else "") + "_hf_models"
OWNER = 0
TIED = ["transformer.wte.weight", "lm_head.weight"]


def _dummy() -> dict:
    ids = torch.tensor([[3, 7, 11, 2]])
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids)}


def party_tied() -> dict:
    warnings.simplefilter("ignore")
    rank = comm.get().rank
    model = importlib.import_module(HF).build("gpt2") if rank == OWNER else None
    private = crypten_lite.nn.from_pytorch(model, _dummy(), src=OWNER)
    before = comm.get().get_communication_stats()
    private.encrypt(src=OWNER)
    after = comm.get().get_communication_stats()
    private.eval()
    untied = crypten_lite.nn.from_pytorch(model, _dummy(), src=OWNER)
    object.__setattr__(untied, "_tied", [])  # the same model, its tie dropped: two shares kept
    start = comm.get().get_communication_stats()
    untied.encrypt(src=OWNER)
    end = comm.get().get_communication_stats()
    wte, head = (private._get(p) for p in TIED)

    def forward(m):  # the costs of one forward on private token ids (the embedding a product
        # one_hot @ W, the LM head x @ W^T), its logits opened after the count
        ids = _dummy()["input_ids"]
        tokens = crypten_lite.nn.share_tokens(ids if rank == 1 else None, wte.shape[0], src=1)
        start = comm.get().get_communication_stats()
        with crypten_lite.no_grad():
            out = m(input_ids=tokens, attention_mask=_dummy()["attention_mask"])["logits"]
        end = comm.get().get_communication_stats()
        return out.get_plain_text(), (end["rounds"] - start["rounds"], end["bytes_sent"] - start["bytes_sent"])
    logits, first = forward(private)
    second = forward(private)[1]
    # the same tied model with the head's own mask, as before the "linear" product (a mask and
    # a D of W^T's layout, besides W's)
    two = crypten_lite.nn.from_pytorch(model, _dummy(), src=OWNER)
    two.encrypt(src=OWNER)
    two.eval()
    fixed.SHARE_TRANSPOSED_MASK = False
    try:
        two_logits, two_first = forward(two)
        two_second = forward(two)[1]
    finally:
        fixed.SHARE_TRANSPOSED_MASK = True
    return {"groups": private.__dict__.get("_tied"), "same": wte is head,
            "sharing": (after["rounds"] - before["rounds"], after["bytes_sent"] - before["bytes_sent"]),
            "untied_sharing": (end["rounds"] - start["rounds"], end["bytes_sent"] - start["bytes_sent"]),
            "untied_same": untied._get(TIED[0]) is untied._get(TIED[1]),
            "n_parameters": len(list(private.parameters())), "logits": logits,
            "two_logits": two_logits, "masks": sorted(wte.__dict__.get("_fixed_masks", {})),
            "two_masks": sorted(two._get(TIED[0]).__dict__.get("_fixed_masks", {})),
            "wte_numel": wte.numel(), "first": first, "two_first": two_first,
            "second": second, "two_second": two_second}


def test_tied_embedding_and_head_share_one_crypten(pool2):
    got = pool2.run(party_tied)
    model = importlib.import_module(HF).build("gpt2")
    with torch.no_grad():
        want = model(**_dummy()).logits
    n_torch = len(list(model.parameters()))  # torch counts a tied tensor once
    for g in got:
        assert g["groups"] == [TIED], g["groups"]
        assert g["same"]
        assert g["n_parameters"] == n_torch
        assert (g["logits"] - want).abs().max() < 0.05
        # both paths are still shared as before (the tie is kept afterwards): same costs
        assert g["sharing"] == g["untied_sharing"], g
        assert not g["untied_same"]
        # one fixed mask serves the embedding (W) and the LM head (W^T, the "linear" product):
        # the first forward opens W - B once, not a second D of the head's layout
        assert g["masks"] == [""], g["masks"]
        assert g["two_masks"] == ["", "t"], g["two_masks"]
        assert (g["two_logits"] - want).abs().max() < 0.05
        assert g["first"][0] == g["two_first"][0]  # same rounds (D opened with the first E)
        assert g["two_first"][1] - g["first"][1] == 8 * g["wte_numel"], (g["first"], g["two_first"])
        assert g["second"] == g["two_second"], (g["second"], g["two_second"])  # then: unchanged
    assert got[OWNER]["sharing"][1] > 0  # the owner announces every parameter path


def _payload(tied) -> bytes:
    model = importlib.import_module(HF).build("gpt2")
    converted = crypten_lite.nn.from_pytorch(model, _dummy(), check=False)
    assert converted.__dict__["_tied"] == [TIED]
    object.__setattr__(converted, "_tied", tied)
    return gd.describe_graph(converted, [[1, 4], [1, 4]])


@pytest.mark.parametrize("tied,expected", [
    ([["transformer.wte.weight", "nowhere.weight"]], "is not a parameter"),
    ([["transformer.wte.weight", "transformer.wpe.weight"]], "of one shape"),
    ([["transformer.wte.weight"]], "2 or more"),
])
def test_bad_tied_group_is_refused(tied, expected):
    with pytest.raises(gd.DescriptionError, match=expected):
        gd.rebuild_graph(gd.read(_payload(tied))[1])


def test_description_keeps_the_tie():
    rebuilt = gd.rebuild_graph(gd.read(_payload([TIED]))[1])
    assert rebuilt.__dict__["_tied"] == [TIED]
