"""Tiny HuggingFace transformers models built from configs with random weights.

No hub download is possible in the tests: every model is built from its config class, in eval
mode, with the classes `from_pretrained` instantiates (same modules and forward; default
attention implementation). Only the model owner imports this module
(tests/protocol/test_transformers.py checks that the other parties never do).
"""

from __future__ import annotations

import torch
import transformers as T

VOCAB = 100
SEQ = 8
BATCH = 1
IMAGE = 16

_COMMON = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)


def _config(name: str):
    if name == "bert":
        return T.BertConfig(vocab_size=VOCAB, max_position_embeddings=32, num_labels=3, **_COMMON)
    if name == "distilbert":
        return T.DistilBertConfig(vocab_size=VOCAB, dim=32, n_layers=2, n_heads=2, hidden_dim=64,
                                  max_position_embeddings=32, num_labels=3)
    if name == "roberta":
        return T.RobertaConfig(vocab_size=VOCAB, max_position_embeddings=40, num_labels=3,
                               pad_token_id=1, **_COMMON)
    # The language models draw their random weights with std 0.1 (HF's default 0.02 leaves
    # activations of ~0.02, a few hundred units of the 16-bit fixed point, and logits within
    # 1% of each other: the private error is then up to 1% of the logit range, 0.03% at 0.1).
    if name == "gpt2":
        return T.GPT2Config(vocab_size=VOCAB, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                            bos_token_id=0, eos_token_id=0, initializer_range=0.1)
    if name == "llama":  # RMSNorm, SiLU-gated MLP, rotary embeddings, grouped-query attention
        return T.LlamaConfig(vocab_size=VOCAB, max_position_embeddings=32, num_key_value_heads=1,
                             bos_token_id=0, eos_token_id=0, initializer_range=0.1, **_COMMON)
    if name == "vit":
        return T.ViTConfig(image_size=IMAGE, patch_size=8, num_channels=3, num_labels=3, **_COMMON)
    raise KeyError(name)


_CLASSES = {"bert": "BertForSequenceClassification", "distilbert": "DistilBertForSequenceClassification",
            "roberta": "RobertaForSequenceClassification", "gpt2": "GPT2LMHeadModel",
            "llama": "LlamaForCausalLM", "vit": "ViTForImageClassification"}


def build(name: str, seed: int = 0) -> torch.nn.Module:
    """The model `name` with seeded random weights (test weights, not cryptographic), eval mode.

    `name` may end in "-eager": the same model with HF's eager attention (scores plus a mask
    filled with the float32 minimum, softmax) instead of the default (sdpa)."""
    base, _, variant = name.partition("-")
    config = _config(base)
    if variant == "eager":
        config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = getattr(T, _CLASSES[base])(config)
    return model.eval()
