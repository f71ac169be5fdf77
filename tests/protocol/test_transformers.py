"""HuggingFace transformers models through from_pytorch, run privately by 2 parties.

Each model (tests/protocol/_hf_models.py: tiny configs, random weights, the classes that
`from_pretrained` builds, eval mode) is shipped in-band by party 0, which alone imports
transformers; party 1 owns the input (token ids or an image); the attention mask is public.
The private logits are checked against the model's own torch forward: max abs error <= 1e-2
of the logit range, and the same argmax on every row whose top-2 gap exceeds twice that. Rounds and bytes of the BERT run are asserted
exactly. Public computations (positions, masks, rotary tables) never touch a CrypTensor:
a public-only op meeting a secret operand is refused, naming the node.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import time
import warnings

import pytest
import torch

import crypten_lite
from crypten_lite import comm
from crypten_lite.errors import UnsupportedError

# transformers is not imported here (the parties must not import it; only the model owner does)
needs_transformers = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None,
    reason="transformers is not installed (pip install 'crypten_lite[transformers]')")

OWNER, DATA = 0, 1
HF = (f"{__package__}." if __package__ else "") + "_hf_models"
VOCAB, SEQ = 100, 8
REL_TOL = 1e-2

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning",
                                        "ignore::FutureWarning")


def _inputs(name: str) -> dict:
    """Party 1's input and the public attention mask (the last two positions are padding)."""
    gen = torch.Generator().manual_seed(5)  # test data, not cryptographic
    if name == "vit":
        return {"pixel_values": torch.randn(1, 3, 16, 16, generator=gen)}
    ids = torch.randint(2, VOCAB, (1, SEQ), generator=gen)
    mask = torch.ones(1, SEQ, dtype=torch.long)
    mask[:, -2:] = 0
    if name == "roberta":
        ids[:, -2:] = 1  # RoBERTa's pad id: its position ids come from the padding
    return {"input_ids": ids, "attention_mask": mask}


def _reference(name: str, inputs: dict) -> torch.Tensor:
    hf = importlib.import_module(HF)
    with torch.no_grad():
        return hf.build(name)(**inputs).logits


# ------------------------------------------------------------------ party functions
def party_run(name: str, inputs: dict, private_ids: bool = True) -> dict:
    """Party 0 ships its model; party 1's ids (private: one-hot shared) or image; logits to all."""
    warnings.simplefilter("ignore")
    rank = crypten_lite.get_rank()
    c = comm.get()
    imported_before = HF in sys.modules
    model = importlib.import_module(HF).build(name) if rank == OWNER else None
    private = crypten_lite.nn.from_pytorch(model, inputs, src=OWNER)
    private.encrypt(src=OWNER)
    private.eval()
    run = {k: v for k, v in inputs.items() if k == "attention_mask"}  # public
    mine = {k: v if rank == DATA else None for k, v in inputs.items()}
    c.reset_communication_stats()
    start = time.perf_counter()  # reported by the benchmark script, never asserted
    if name == "vit":
        run["pixel_values"] = crypten_lite.cryptensor(mine["pixel_values"], src=DATA)
    elif private_ids:
        run["input_ids"] = crypten_lite.nn.share_tokens(mine["input_ids"], VOCAB, src=DATA,
                                                        pad_token_id=1 if name == "roberta" else None)
    else:
        run["input_ids"] = inputs["input_ids"]  # public ids: a plain lookup
    out = private(**run)
    y = out["logits"].get_plain_text()
    seconds = time.perf_counter() - start
    stats = c.get_communication_stats()
    return {"y": y, "seconds": seconds, "rounds": int(stats["rounds"]), "bytes": int(stats["bytes_sent"]),
            "imported_before": imported_before, "imported": HF in sys.modules,
            "transformers": "transformers" in sys.modules}


def party_refusal() -> str:
    """A public-only op (the mask's bool conversion) fed a secret-shared mask is refused."""
    warnings.simplefilter("ignore")
    rank = crypten_lite.get_rank()
    inputs = _inputs("bert")
    model = importlib.import_module(HF).build("bert") if rank == OWNER else None
    private = crypten_lite.nn.from_pytorch(model, inputs, src=OWNER)
    private.encrypt(src=OWNER)
    mask = crypten_lite.cryptensor(inputs["attention_mask"].float() if rank == DATA else None, src=DATA)
    try:
        private(input_ids=inputs["input_ids"], attention_mask=mask)
    except UnsupportedError as e:
        return str(e)
    return "no error"


class TorchEncoder(torch.nn.Module):
    """torch's own nn.TransformerEncoder (2 GELU layers) with a key padding mask, and a head."""

    def __init__(self) -> None:
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(16, 2, 32, batch_first=True, activation="gelu")
        self.encoder = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = torch.nn.Linear(16, 3)

    def forward(self, x, padding):
        return self.head(self.encoder(x, src_key_padding_mask=padding)[:, 0])


def _torch_encoder() -> torch.nn.Module:
    torch.manual_seed(2)  # test weights, not cryptographic
    return TorchEncoder().eval()


def party_torch_encoder(x: torch.Tensor, padding: torch.Tensor) -> torch.Tensor:
    """Party 0's torch encoder, party 1's sequence (private), the padding mask public."""
    rank = crypten_lite.get_rank()
    private = crypten_lite.nn.from_pytorch(_torch_encoder() if rank == OWNER else None, (x, padding),
                                           src=OWNER)
    private.encrypt(src=OWNER)
    private.eval()
    return private(crypten_lite.cryptensor(x if rank == DATA else None, src=DATA), padding).get_plain_text()


# ------------------------------------------------------------------ tests
def _check(name: str, got: list, inputs: dict) -> dict:
    ref = _reference(name, inputs)
    y = got[OWNER]["y"]
    assert torch.equal(y, got[DATA]["y"])
    err = (y - ref).abs().max().item()
    span = (ref.max() - ref.min()).item()
    assert err <= REL_TOL * span, f"{name}: max error {err:.3g}, logit range {span:.3g}"
    # argmax: on every row whose top-2 gap an error within the tolerance cannot close (a
    # near-tie may flip within the tolerance; the error bound above covers those rows)
    top2 = ref.topk(2, -1).values
    clear = (top2[..., 0] - top2[..., 1]) > 2 * REL_TOL * span
    assert bool(clear.any()), f"{name}: no row with a clear argmax to check"
    assert torch.equal(y.argmax(-1)[clear], ref.argmax(-1)[clear])
    return got[OWNER]


@needs_transformers
@pytest.mark.parametrize("name", ["bert", "distilbert", "roberta", "gpt2", "llama", "vit", "llama-eager"])
def test_private_forward(pool2, name):
    inputs = _inputs(name)
    got = pool2.run(party_run, name, inputs)
    _check(name, got, inputs)
    # only the model owner imported the model's code; the data owner never did
    assert got[DATA]["imported"] is False and got[DATA]["transformers"] is False


# One private BERT forward (2 layers, hidden 32, 2 heads, seq 8), 2 parties, measured: rounds and
# bytes sent per party. Public ids cost nothing for the lookup; private ids add one Beaver
# product one_hot (8 x 100) @ table (100 x 32): one round, both masked operands opened.
BERT_PUBLIC_IDS = (126, 449_288)
EMBEDDING_PRODUCT = (1, 8 * (SEQ * VOCAB + VOCAB * 32))


@needs_transformers
def test_bert_token_ids_cost(pool2):
    """Exact cost of a private BERT forward with public ids, and what private ids add."""
    inputs = _inputs("bert")
    public = _check("bert", pool2.run(party_run, "bert", inputs, False), inputs)
    private = _check("bert", pool2.run(party_run, "bert", inputs, True), inputs)
    assert (public["rounds"], public["bytes"]) == BERT_PUBLIC_IDS
    assert (private["rounds"] - public["rounds"], private["bytes"] - public["bytes"]) == EMBEDDING_PRODUCT


@needs_transformers
def test_secret_mask_refused(pool2):
    errors = pool2.run(party_refusal)
    for e in errors:
        assert "node 'to' (aten.to.device)" in e and "secret-shared" in e, e


def test_torch_transformer_encoder(pool2):
    """torch.nn.TransformerEncoder(Layer) imports (traced through, then exported) and runs."""
    gen = torch.Generator().manual_seed(4)  # test data
    x = torch.randn(1, 6, 16, generator=gen)
    padding = torch.zeros(1, 6, dtype=torch.bool)
    padding[:, -2:] = True
    with torch.no_grad():
        ref = _torch_encoder()(x, padding)
    y = pool2.run(party_torch_encoder, x, padding)[DATA]
    span = (ref.max() - ref.min()).item()
    assert (y - ref).abs().max().item() <= REL_TOL * span
    top2 = ref.topk(2, -1).values
    assert bool(((top2[..., 0] - top2[..., 1]) > 2 * REL_TOL * span).all())  # a clear argmax
    assert torch.equal(y.argmax(-1), ref.argmax(-1))


@needs_transformers
def test_public_values_folded_not_shared():
    """LLaMA's positions, causal mask pieces and rotary tables are folded into public constants
    at import (no arange / cos / sin left to run); its rotary inv_freq (a non-persistent buffer)
    is not part of the state that encrypt() shares; the folded cos table is torch's."""
    from crypten_lite.nn import transformer_ops

    hf = importlib.import_module(HF)
    model = hf.build("llama")
    inputs = _inputs("llama")
    converted = crypten_lite.nn.from_pytorch(model, inputs)
    targets = {str(n.target) for n in converted.graph.nodes if n.op == "call_function"}
    assert not targets & {"aten.arange.default", "aten.cos.default", "aten.sin.default"}, targets
    assert not any("rotary" in k for k in converted.state_dict())
    constants = [n.args[0] for n in converted.graph.nodes if n.target is transformer_ops.public_constant]
    with torch.no_grad():
        cos, _ = model.model.rotary_emb(torch.zeros(1), torch.arange(SEQ)[None])
    assert any(c.shape == cos.shape and torch.equal(c, cos) for c in constants)


class CausalAttention(torch.nn.Module):
    """F.scaled_dot_product_attention with is_causal=True and grouped heads (torch.fx path)."""

    def forward(self, q, k, v):
        return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)


def party_causal_attention(q, k, v) -> torch.Tensor:
    model = crypten_lite.nn.from_pytorch(CausalAttention(), (q, k, v))
    rank = crypten_lite.get_rank()
    shared = [crypten_lite.cryptensor(t if rank == DATA else None, src=DATA) for t in (q, k, v)]
    return model(*shared).get_plain_text()


def test_causal_grouped_attention(pool2):
    gen = torch.Generator().manual_seed(6)  # test data
    q = torch.randn(1, 4, 5, 8, generator=gen)
    k, v = torch.randn(1, 2, 5, 8, generator=gen), torch.randn(1, 2, 5, 8, generator=gen)
    ref = CausalAttention()(q, k, v)
    y = pool2.run(party_causal_attention, q, k, v)[DATA]
    assert (y - ref).abs().max().item() <= 1e-2


@needs_transformers
def test_gpt2_written_out_gelu_fused():
    """GPT-2's gelu_new (0.5 x (1 + tanh(...)), written in the model's code) becomes one private
    GELU per layer (no private cube or tanh left); the plaintext check still matches torch."""
    model = importlib.import_module(HF).build("gpt2")
    converted = crypten_lite.nn.from_pytorch(model, _inputs("gpt2"))
    targets = [str(n.target) for n in converted.graph.nodes if n.op == "call_function"]
    assert targets.count("aten.gelu.default") == 2
    assert "aten.tanh.default" not in targets and "aten.pow.Tensor_Scalar" not in targets


@needs_transformers
def test_llama_written_out_rms_norm_fused():
    """LLaMA's RMSNorm (x * rsqrt(mean(x^2) + eps) * weight, written in the model's code)
    becomes one private rms_norm per norm, its weight included (no private rsqrt or square
    left); the plaintext check still matches torch."""
    model = importlib.import_module(HF).build("llama")
    converted = crypten_lite.nn.from_pytorch(model, _inputs("llama"))
    nodes = [n for n in converted.graph.nodes if n.op == "call_function"]
    norms = [n for n in nodes if str(n.target) == "aten.rms_norm.default"]
    assert len(norms) == 5 and all(n.args[2] is not None for n in norms)   # 2 layers x 2, final
    targets = [str(n.target) for n in nodes]
    assert "aten.rsqrt.default" not in targets and "aten.pow.Tensor_Scalar" not in targets


def party_bad_tokens() -> str:
    """Ids outside the vocabulary: the owner's error, the others told at once (no wait)."""
    from crypten_lite.errors import CryptenLiteError

    rank = crypten_lite.get_rank()
    ids = torch.tensor([[3, VOCAB]]) if rank == DATA else None
    try:
        crypten_lite.nn.share_tokens(ids, VOCAB, src=DATA)
    except CryptenLiteError as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


def test_token_ids_outside_vocabulary_refused(pool2):
    errors = pool2.run(party_bad_tokens)
    assert "must lie in [0, 100)" in errors[DATA], errors
    assert errors[OWNER].startswith("ProtocolError") and "party 1 refused to share" in errors[OWNER], errors
