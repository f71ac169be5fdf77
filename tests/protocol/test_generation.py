"""Private greedy decoding with a secret-shared KV cache (nn.generate), 2 parties.

Party 0 owns a tiny HuggingFace causal LM (tests/protocol/_hf_models.py: GPT-2 and a
LLaMA-style decoder, random weights, the classes from_pretrained builds) and ships it in-band;
party 1 owns the prompt. The private generation must equal torch's own greedy decoding (the
model with its KV cache, argmax at each step); only party 1 receives the tokens; every decode
step costs exactly the same (asserted) and less than re-running the whole sequence.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import warnings

import pytest
import torch

import crypten_lite
from crypten_lite import comm
from crypten_lite.errors import UnsupportedError

needs_transformers = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None,
    reason="transformers is not installed (pip install 'crypten_lite[transformers]')")

MODEL_OWNER, DATA = 0, 1
HF = (f"{__package__}." if __package__ else "") + "_hf_models"
PROMPT = 5
NEW = 8

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning",
                                        "ignore::FutureWarning")


def _prompt(seed: int = 3) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)  # test data, not cryptographic
    return torch.randint(2, 100, (1, PROMPT), generator=gen)


def _torch_greedy(name: str, prompt: torch.Tensor) -> tuple[torch.Tensor, float]:
    """torch's greedy decoding with the model's own KV cache; and the smallest top-2 logit gap
    met on the way, relative to the logit range (the private run's error must stay below it)."""
    model = importlib.import_module(HF).build(name)
    ids, cache, step, gap = prompt, None, prompt, float("inf")
    with torch.no_grad():
        for _ in range(NEW):
            out = model(input_ids=step, past_key_values=cache, use_cache=True)
            cache, logits = out.past_key_values, out.logits[0, -1]
            top = logits.topk(2).values
            gap = min(gap, float((top[0] - top[1]) / (logits.max() - logits.min())))
            step = logits.argmax().reshape(1, 1)
            ids = torch.cat([ids, step], 1)
        # HuggingFace's own generate agrees (greedy, no stop at the end-of-sequence id)
        generated = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=NEW,
                                   do_sample=False, eos_token_id=None, pad_token_id=0)
    assert torch.equal(generated, ids), (generated, ids)
    return ids, gap


def party_generate(name: str, prompt: torch.Tensor) -> dict:
    """Party 0's model, party 1's prompt: 8 private greedy tokens; then, for comparison, the
    cost of one private forward of the whole sequence (what a decoder without a cache pays)."""
    warnings.simplefilter("ignore")
    nn = crypten_lite.nn
    rank = crypten_lite.get_rank()
    c = comm.get()
    full = PROMPT + NEW - 1  # the sequence the last decode step extends
    dummy = {"input_ids": torch.zeros(1, full, dtype=torch.long),
             "attention_mask": torch.ones(1, full, dtype=torch.long)}
    model = importlib.import_module(HF).build(name) if rank == MODEL_OWNER else None
    private = nn.from_pytorch(model, dummy, src=MODEL_OWNER)
    private.encrypt(src=MODEL_OWNER)
    private.eval()
    gen = nn.PrivateGenerator(private, owner=DATA)
    tokens = nn.generate(private, prompt if rank == DATA else None, NEW, owner=DATA, generator=gen)
    # one private forward of the whole sequence (its ids shared by party 1), argmax of its last row
    seq = nn.share_tokens(tokens[:, :full] if rank == DATA else None, private_vocab(gen), src=DATA)
    before = c.get_communication_stats()
    logits = private(input_ids=seq, attention_mask=dummy["attention_mask"])["logits"]
    logits[:, -1].argmax(-1, one_hot=True, method="grouped")  # generation's argmax
    after = c.get_communication_stats()
    rerun = {"rounds": int(after["rounds"] - before["rounds"]),
             "bytes_sent": int(after["bytes_sent"] - before["bytes_sent"])}
    return {"tokens": tokens, "costs": gen.costs, "rerun": rerun,
            "transformers": "transformers" in sys.modules}


def private_vocab(gen) -> int:
    return gen.vocab_size


@needs_transformers
@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_private_greedy_decoding(pool2, name):
    prompt = _prompt()
    want, gap = _torch_greedy(name, prompt)
    # no near-tie on the way: each greedy token leads by > 0.2% of the logit range (the private
    # logits' error is about 0.03% of it), so the tokens must be exactly torch's
    assert gap > 2e-3, gap
    got = pool2.run(party_generate, name, prompt)
    # the private tokens are torch's
    assert got[DATA]["tokens"] is not None and torch.equal(got[DATA]["tokens"], want), \
        (got[DATA]["tokens"], want, gap)
    # only the data owner received them; the model owner learnt nothing but shapes
    assert got[MODEL_OWNER]["tokens"] is None
    assert got[MODEL_OWNER]["costs"]["reveal"]["bytes_received"] == 0  # nothing opened to party 0
    assert got[DATA]["costs"]["reveal"]["bytes_received"] == NEW * 8   # its share of each id
    assert got[DATA]["transformers"] is False  # the data owner never imported the model's code
    # every decode step costs the same (fixed shapes), on both parties
    for party in got:
        steps = party["costs"]["steps"]
        assert len(steps) == NEW - 1 and all(s == steps[0] for s in steps), steps
    step = got[DATA]["costs"]["steps"][0]
    assert (step["rounds"], step["bytes_sent"]) == STEP_COSTS[name], (step, got[DATA]["rerun"])
    # cheaper than one forward of the whole sequence (without a cache, every step pays that)
    rerun = got[DATA]["rerun"]
    assert step["bytes_sent"] < rerun["bytes_sent"] and step["rounds"] <= rerun["rounds"], (step, rerun)
    assert (rerun["rounds"], rerun["bytes_sent"]) == RERUN_COSTS[name], rerun


STEP_COSTS = {"gpt2": (106, 197_424), "llama": (114, 199_040)}
# one forward of the whole 12-token sequence + argmax, without a cache (docs/transformers.md)
RERUN_COSTS = {"gpt2": (122, 597_608), "llama": (130, 617_000)}


def party_unsupported() -> str:
    """A model that is not a causal LM with a KV cache is refused on every party."""
    rank = crypten_lite.get_rank()
    model = torch.nn.Sequential(torch.nn.Linear(4, 10)).eval() if rank == MODEL_OWNER else None
    private = crypten_lite.nn.from_pytorch(model, torch.zeros(1, 4), src=MODEL_OWNER)
    private.encrypt(src=MODEL_OWNER)
    try:
        crypten_lite.nn.generate(private, torch.tensor([[1, 2, 3]]) if rank == DATA else None, 2, owner=DATA)
    except UnsupportedError as e:
        return str(e)
    return "no error"


def test_unsupported_model_refused(pool2):
    errors = pool2.run(party_unsupported)
    assert "Sequential is not a HuggingFace causal language model" in errors[MODEL_OWNER], errors
    assert "party 0" in errors[DATA] and "refused" in errors[DATA], errors


def party_bad_prompt() -> str:
    """A prompt that is not (1, length) ids: the data owner's error; the model owner told at once."""
    from crypten_lite.errors import CryptenLiteError

    warnings.simplefilter("ignore")
    rank = crypten_lite.get_rank()
    model = importlib.import_module(HF).build("gpt2") if rank == MODEL_OWNER else None
    private = crypten_lite.nn.from_pytorch(model, {"input_ids": torch.zeros(1, 4, dtype=torch.long)},
                                           src=MODEL_OWNER)
    private.encrypt(src=MODEL_OWNER)
    try:
        crypten_lite.nn.generate(private, torch.tensor([1, 2, 3]) if rank == DATA else None, 2, owner=DATA)
    except CryptenLiteError as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


@needs_transformers
def test_bad_prompt_refused(pool2):
    errors = pool2.run(party_bad_prompt)
    assert "the prompt must be a LongTensor of shape (1, length), got (3,)" in errors[DATA], errors
    assert errors[MODEL_OWNER].startswith("ProtocolError") and "party 1 refused" in errors[MODEL_OWNER], errors


def party_release() -> dict:
    """release_torch_model: the owner's torch model (and its weights) freed, the exported
    graphs still run; a prompt length never started before is refused on every party."""
    import gc
    import weakref

    from crypten_lite.errors import CryptenLiteError

    warnings.simplefilter("ignore")
    rank = crypten_lite.get_rank()
    model = importlib.import_module(HF).build("gpt2") if rank == MODEL_OWNER else None
    refs = [weakref.ref(model), weakref.ref(model.transformer.wte.weight)] if model is not None else []
    private = crypten_lite.nn.from_pytorch(model, {"input_ids": torch.zeros(1, 3, dtype=torch.long)},
                                           src=MODEL_OWNER)
    private.encrypt(src=MODEL_OWNER)
    private.eval()
    gen = crypten_lite.nn.PrivateGenerator(private, owner=DATA)
    prompt = _prompt()[:, :3]
    first = gen.generate(prompt if rank == DATA else None, 2)
    gen.release_torch_model()
    del model
    gc.collect()
    freed = all(r() is None for r in refs)
    again = gen.generate(prompt if rank == DATA else None, 2)  # the same graphs: no torch model needed
    try:
        gen.generate(_prompt()[:, :4] if rank == DATA else None, 2)
        error = "no error"
    except CryptenLiteError as e:
        error = f"{type(e).__name__}: {e}"
    return {"freed": freed, "same": first is None or torch.equal(first, again), "error": error}


@needs_transformers
def test_release_torch_model(pool2):
    got = pool2.run(party_release)
    assert got[MODEL_OWNER]["freed"], "the owner's torch model or its weights are still referenced"
    assert got[DATA]["same"]
    assert got[MODEL_OWNER]["error"].startswith("UnsupportedError") and \
        "release_torch_model" in got[MODEL_OWNER]["error"], got
    assert got[DATA]["error"].startswith("ProtocolError") and "party 0" in got[DATA]["error"], got
