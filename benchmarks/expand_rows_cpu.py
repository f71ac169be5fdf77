"""Thread CPU of one masked-polynomial job's local expansion, expand_rows against expand_outputs.

binary.eval_polys expands a job whose inputs every party sends with circuits.expand_rows (the
job on whole numpy arrays: gathers, one AND, one XOR reduction) up to ROW_EXPAND_WORDS words
per input, and with circuits.expand_outputs (two numpy operations per product) above. This
script times both on random shares of a radix-4 carry level (CARRY4_G and CARRY4_P, 7
inputs, 22 monomials), for rank 0 (adds the public products) and rank 1, at several word
counts, by turns in one process (--repeat calls each, --turns times), each result checked
equal to the other's. LeNet b1's jobs have 2 to 1080 words per input.

    python benchmarks/expand_rows_cpu.py [--words 8 54 270 432 1080 1280 1536 2040] [--repeat 300] [--turns 3]

Prints one JSON line per (words, rank): microseconds per call of each, per turn, and the load.
"""

from __future__ import annotations

import argparse
import json
import os
import time

import numpy as np
import torch

from crypten_lite.mpc import circuits


def _case(words: int, rank: int, repeat: int, turns: int) -> dict:
    gen = torch.Generator().manual_seed(words)
    outputs = [circuits.CARRY4_G, circuits.CARRY4_P]
    monos = circuits.monomials(outputs[0] + outputs[1])

    def rand(*shape):
        return torch.randint(-(1 << 62), 1 << 62, shape, dtype=torch.int64, generator=gen)
    opened, masks, mono_rows = rand(7, words).numpy(), rand(7, words), rand(len(monos), words)
    lead = torch.full((words,), -1 if rank == 0 else 0, dtype=torch.int64)

    def per_product():  # what eval_polys did for every job: a tensor per share
        return circuits.expand_outputs(outputs, list(opened), list(masks),
                                       {m: mono_rows[i] for i, m in enumerate(monos)}, lead)

    def rows():
        return circuits.expand_rows(outputs, opened, masks.numpy(), mono_rows.numpy(), monos, rank == 0)
    for a, b in zip(per_product(), rows()):
        if not np.array_equal(a.numpy(), b):
            raise AssertionError("expand_rows and expand_outputs disagree")
    us: dict[str, list[float]] = {"expand_outputs": [], "expand_rows": []}
    for _ in range(turns):
        for name, fn in (("expand_outputs", per_product), ("expand_rows", rows)):
            start = time.thread_time()
            for _ in range(repeat):
                fn()
            us[name].append(round((time.thread_time() - start) / repeat * 1e6, 1))
    return {"words": words, "rank": rank, "us_per_call": us, "load_average_1min": round(os.getloadavg()[0], 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--words", type=int, nargs="+", default=[8, 54, 270, 432, 1080, 1280, 1536, 2040])
    parser.add_argument("--repeat", type=int, default=300)
    parser.add_argument("--turns", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for words in args.words:
        for rank in (0, 1):
            print(json.dumps(_case(words, rank, args.repeat, args.turns)))


if __name__ == "__main__":
    main()
