"""Agreement of private inference with torch over many inputs, per HuggingFace transformers model.

    python benchmarks/hf_agreement.py [INPUTS] [model,model,...] [--json FILE]

For each tiny model of tests/protocol/_hf_models.py (BERT, DistilBERT, RoBERTa sequence
classification; GPT-2 and a LLaMA-style causal LM; ViT image classification; random weights
from configs, the classes from_pretrained builds): INPUTS random inputs (seed 17) in one batch
through the model shipped in-band by party 0, party 1's inputs private (token ids as a secret
one-hot; images), each input's attention mask public with a random amount of padding. Two
parties and the dealer. Per model one JSON line: the share of inputs whose private argmax
equals torch's (the sequence classifiers' class, the language models' next token after the
last real position, ViT's class), the largest error of an input relative to that input's
logit range, and the smallest top-2 gap relative to the range (a gap below the error is a
near-tie that no approximate computation decides reliably).
"""

from __future__ import annotations

import argparse
import importlib
import json
import pathlib
import sys
import warnings

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "protocol"))
MODELS = ("bert", "distilbert", "roberta", "gpt2", "llama", "vit")
VOCAB, SEQ, IMAGE = 100, 8, 16
OWNER, DATA = 0, 1


def inputs_for(name: str, n: int) -> dict:
    """n random inputs of `name` (test data, seed 17): ids and a public mask, or images."""
    g = torch.Generator().manual_seed(17)  # test data, not cryptographic
    if name == "vit":
        return {"pixel_values": torch.randn(n, 3, IMAGE, IMAGE, generator=g)}
    ids = torch.randint(2, VOCAB, (n, SEQ), generator=g)
    real = torch.randint(SEQ // 2, SEQ + 1, (n,), generator=g)      # real tokens per input
    mask = (torch.arange(SEQ)[None, :] < real[:, None]).long()
    if name == "roberta":
        ids[mask == 0] = 1          # RoBERTa's pad id: its position ids come from the padding
    return {"input_ids": ids, "attention_mask": mask}


def party_logits(name: str, inputs: dict) -> torch.Tensor:
    """Party 0 ships its model; party 1's inputs; the private logits revealed to both."""
    import crypten_lite
    warnings.simplefilter("ignore")
    rank = crypten_lite.get_rank()
    model = importlib.import_module("_hf_models").build(name) if rank == OWNER else None
    private = crypten_lite.nn.from_pytorch(model, inputs, src=OWNER)
    private.encrypt(src=OWNER)
    private.eval()
    run = {k: v for k, v in inputs.items() if k == "attention_mask"}
    mine = {k: v if rank == DATA else None for k, v in inputs.items()}
    if name == "vit":
        run["pixel_values"] = crypten_lite.cryptensor(mine["pixel_values"], src=DATA)
    else:
        run["input_ids"] = crypten_lite.nn.share_tokens(mine["input_ids"], VOCAB, src=DATA,
                                                        pad_token_id=1 if name == "roberta" else None)
    with torch.no_grad():
        return private(**run)["logits"].get_plain_text()


def _per_input(name: str, logits: torch.Tensor, inputs: dict) -> torch.Tensor:
    """The logits each input is judged on (n, classes): the language models' last real position."""
    if name in ("gpt2", "llama"):
        last = inputs["attention_mask"].sum(1) - 1
        return logits[torch.arange(logits.shape[0]), last]
    return logits


def agreement(name: str, n: int, pool) -> dict:
    hf = importlib.import_module("_hf_models")
    inputs = inputs_for(name, n)
    with torch.no_grad():
        ref = hf.build(name)(**inputs).logits.double()
    got = pool.run(party_logits, name, inputs)
    y = got[OWNER].double()
    span = (ref.reshape(n, -1).max(1).values - ref.reshape(n, -1).min(1).values)
    err = (y - ref).abs().reshape(n, -1).max(1).values / span
    judged_ref, judged_y = _per_input(name, ref, inputs), _per_input(name, y, inputs)
    same = (judged_ref.argmax(-1) == judged_y.argmax(-1)).double()
    top2 = judged_ref.topk(2, -1).values
    gap = (top2[:, 0] - top2[:, 1]) / span
    return {"model": name, "inputs": n, "argmax_agreement": float(same.mean()),
            "max_error_of_range": float(err.max()), "min_top2_gap_of_range": float(gap.min()),
            "disagreeing_gaps_of_range": [float(g) for g, s in zip(gap, same) if not s]}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("inputs", nargs="?", type=int, default=100, help="random inputs per model (default 100)")
    ap.add_argument("models", nargs="?", default=",".join(MODELS), help="comma-separated, default all")
    ap.add_argument("--json", help="append the JSON lines to this file too")
    args = ap.parse_args(argv)
    names = args.models.split(",")
    unknown = sorted(set(names) - set(MODELS))
    if unknown:
        ap.error(f"unknown models {unknown}; known: {', '.join(MODELS)}")
    from crypten_lite.mpc import PartyPool
    with PartyPool(2, provider="dealer", timeout=1800) as pool:
        for name in names:
            row = agreement(name, args.inputs, pool)
            line = json.dumps(row)
            print(line, flush=True)
            if args.json:
                with open(args.json, "a") as f:
                    f.write(line + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
