"""Private HuggingFace transformers built from their configs: no download, runs offline.

Party 0 owns the model, party 1 the token ids. Party 0 builds the model from its config class
(the classes `from_pretrained` builds, with seeded random weights standing in for trained
ones); `nn.from_pytorch` ships its description in-band (party 1 never imports its code), party
0's weights and party 1's token ids are secret-shared, and the result is revealed.

    pip install -e '.[transformers]'       # once: HuggingFace transformers (the model owner's)
    crypten-lite launch -n 2 examples/transformers_from_config.py                # BERT, classify
    crypten-lite launch -n 2 examples/transformers_from_config.py --model gpt2   # GPT-2, generate
    crypten-lite launch -n 2 examples/transformers_from_config.py --layers 12 --hidden 768 \\
        --heads 12 --seq 128                                   # BERT-base's sizes (minutes)

Online alternative: `--pretrained NAME` (e.g. bert-base-uncased, gpt2) has party 0 download
the pretrained weights with `from_pretrained(NAME)` instead (needs the HuggingFace hub).

With --verify (default), party 1 reveals its token ids to party 0 AFTER the private run, only so
that this demo can print torch's own answer beside the private one; a real deployment would not.
"""

from __future__ import annotations

import argparse

import torch

import crypten_lite
from crypten_lite import nn

OWNER, DATA = 0, 1


def build_model(args: argparse.Namespace) -> torch.nn.Module:
    """Party 0's model (only party 0 runs this, and only it needs transformers)."""
    import transformers as T

    cls = T.GPT2LMHeadModel if args.model == "gpt2" else T.BertForSequenceClassification
    if args.pretrained:  # online: downloads the weights
        return cls.from_pretrained(args.pretrained).eval()
    if args.model == "gpt2":
        config = T.GPT2Config(vocab_size=args.vocab, n_positions=64, n_embd=args.hidden,
                              n_layer=args.layers, n_head=args.heads, bos_token_id=0,
                              eos_token_id=0, initializer_range=0.1)
    else:
        config = T.BertConfig(vocab_size=args.vocab, hidden_size=args.hidden,
                              num_hidden_layers=args.layers, num_attention_heads=args.heads,
                              intermediate_size=4 * args.hidden,
                              max_position_embeddings=max(64, args.seq), num_labels=3)
    torch.manual_seed(0)  # the same weights every run (a stand-in for trained ones)
    return cls(config).eval()


def token_ids(args: argparse.Namespace, vocab: int) -> torch.Tensor:
    """Party 1's token ids (seeded: the same every run; test data, not cryptographic)."""
    gen = torch.Generator().manual_seed(1)
    return torch.randint(2, vocab, (1, args.seq), generator=gen)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", choices=("bert", "gpt2"), default="bert")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=100)
    parser.add_argument("--seq", type=int, default=8, help="tokens (the prompt's, for gpt2)")
    parser.add_argument("--new-tokens", type=int, default=4, help="gpt2: tokens to generate")
    parser.add_argument("--pretrained", default="", help="online: from_pretrained(NAME)")
    parser.add_argument("--verify", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()

    crypten_lite.init()
    rank = crypten_lite.get_rank()
    model = build_model(args) if rank == OWNER else None
    # The vocabulary size is public (the one-hot width of the shared ids): party 0 announces it.
    vocab = crypten_lite.cryptensor(
        torch.tensor(model.config.vocab_size) if rank == OWNER else None, src=OWNER)
    vocab = int(vocab.get_plain_text())
    ids = token_ids(args, vocab) if rank == DATA else None
    length = args.seq + args.new_tokens - 1 if args.model == "gpt2" else args.seq
    example = {"input_ids": torch.zeros(1, length, dtype=torch.long),  # the public shapes
               "attention_mask": torch.ones(1, length, dtype=torch.long)}
    private = nn.from_pytorch(model, example, src=OWNER)
    private.encrypt(src=OWNER)
    private.eval()

    if args.model == "gpt2":
        tokens = nn.generate(private, ids, max_new_tokens=args.new_tokens, owner=DATA)
        if rank == DATA:  # only party 1 receives the tokens
            print(f"private generation: {tokens[0].tolist()}", flush=True)
        answer = tokens
    else:
        inputs = {"input_ids": nn.share_tokens(ids, vocab, src=DATA),
                  "attention_mask": torch.ones(1, args.seq, dtype=torch.long)}
        logits = private(**inputs)["logits"].get_plain_text()
        print(f"private logits: {[round(v, 4) for v in logits[0].tolist()]}", flush=True)
        answer = logits

    if args.verify:  # demo only: party 1's ids to party 0, to compare with torch
        shown = crypten_lite.cryptensor(ids if rank == DATA else None, src=DATA).get_plain_text(dst=OWNER)
        if args.model == "gpt2":
            answer = crypten_lite.cryptensor(answer if rank == DATA else None, src=DATA)
            answer = answer.get_plain_text(dst=OWNER)
        if rank == OWNER:
            ids = shown.long()
            with torch.no_grad():
                if args.model == "gpt2":
                    plain = model.generate(ids, attention_mask=torch.ones_like(ids),
                                           max_new_tokens=args.new_tokens, do_sample=False,
                                           eos_token_id=None, pad_token_id=0)
                    print(f"torch generation:   {plain[0].tolist()}", flush=True)
                    print(f"equal to torch's greedy tokens: {torch.equal(plain, answer.long())}")
                else:
                    plain = model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits
                    print(f"torch logits:   {[round(v, 4) for v in plain[0].tolist()]}")
                    print(f"max difference: {(plain - answer).abs().max().item():.2e}; "
                          f"same class: {plain.argmax().item() == answer.argmax().item()}")
    crypten_lite.uninit()


if __name__ == "__main__":
    main()
