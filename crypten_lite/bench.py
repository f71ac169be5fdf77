"""`crypten-lite bench`: workloads between local parties over gRPC, with the dealer process
(protocol additive) or without one (--protocol rss: 3 parties, replicated secret sharing).

Every workload runs on a persistent pool of party processes; each repetition resets the
communication counters, runs the private computation, and reports seconds (wall clock of the
slowest party, for the computation alone: not the reveal that checks it nor the torch reference), rounds and bytes sent per party (online), dealer bytes received by rank 0
(0 under rss), and the max error against torch. A workload that needs an operation the chosen
protocol does not implement yet is reported as not run, naming the operation. Output: a table on stderr and one JSON line per workload on
stdout (or --out FILE). Rounds and bytes are deterministic; seconds are medians of --repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from typing import Callable

import torch

import crypten_lite
from crypten_lite import comm
from crypten_lite.mpc import PartyPool
from crypten_lite.provider.correlations import ring_gemm_choice

WORKLOADS: dict[str, Callable] = {}


def workload(name: str):
    def register(fn):
        WORKLOADS[name] = fn
        return fn
    return register


_PLANS: dict[str, list] = {}
# Set in the party processes by `bench --no-offline`: every run goes without an offline phase
# (no plan kept: the dealer answers online; under rss truncations run the helper protocol).
NO_OFFLINE_ENV = "CRYPTEN_LITE_BENCH_NO_OFFLINE"
# Workloads that take minutes: run only when named (--only) or with --large.
LARGE = {"bert_base_layer_seq128", "bert_base_seq128", "gpt2_small_token", "vit_tiny", "llama_tiny"}


def _measure(run: Callable[[], tuple[torch.Tensor, torch.Tensor]], plan_name: str | None = None) -> dict:
    """Run `run` (returns private result revealed and the torch reference) and collect stats.

    The first run of a workload records its correlation plan; later runs fetch the
    corrections in an offline phase first (timed and counted separately), then run online.
    Under rss there is no dealer: the offline phase is the parties making the plan's
    truncation pairs themselves (their bytes counted as offline_bytes_sent).
    `plan_name` keeps a variant's plan apart from its workload's (default: the workload's name).
    """
    import sys
    from crypten_lite.mpc import offline
    from crypten_lite.session import current
    # The plan belongs to the workload being run (lenet_b1, lenet_b64 and resnet18_b1 share
    # the helper that calls _measure, so the caller's own name would mix up their plans).
    codes = {fn.__code__: workload_name for workload_name, fn in WORKLOADS.items()}
    frame = sys._getframe(1)
    while frame is not None and frame.f_code not in codes:
        frame = frame.f_back
    name = codes[frame.f_code] if frame is not None else sys._getframe(1).f_code.co_name
    name = plan_name or name
    c = comm.get()
    provider = current().provider
    no_offline = os.environ.get(NO_OFFLINE_ENV) == "1"
    plan = None if no_offline else _PLANS.get(name)
    offline_seconds, offline_dealer, offline_sent = 0.0, 0, 0
    if plan is not None:
        # what offline.prefetch does first: the free heap the load left beyond its keep is
        # handed back, so that the window's peak starts from the memory the run holds
        offline._release_free_heap()
    _reset_peak_memory()
    if plan is not None:
        c.reset_communication_stats()
        before, sent_before = _dealer_bytes(provider), _pairwise_sent(provider)
        start = time.perf_counter()
        offline.prefetch(plan)
        offline_seconds = time.perf_counter() - start
        offline_dealer = _dealer_bytes(provider) - before
        # what this party sent: the plan's messages, and under pairwise its offline messages to
        # the other party (their own channel, counted by the provider)
        offline_sent = c.get_communication_stats()["bytes_sent"] + _pairwise_sent(provider) - sent_before
    c.barrier()
    c.reset_communication_stats()
    dealer_before = _dealer_bytes(provider)
    recording = offline.record() if plan is None else None
    if recording is not None:
        new_plan = recording.__enter__()
    _OP_SECONDS[0] = None
    start = time.perf_counter()
    got, ref = run()
    seconds = time.perf_counter() - start
    if _OP_SECONDS[0] is not None:
        seconds = _OP_SECONDS[0]
    if recording is not None:
        recording.__exit__(None, None, None)
        if not no_offline:
            _PLANS[name] = new_plan
    stats = c.get_communication_stats()
    err = float((got.double() - ref.double()).abs().max()) if ref is not None else 0.0
    return {"seconds": seconds, "rounds": stats["rounds"], "bytes_sent": stats["bytes_sent"],
            "bytes_received": stats["bytes_received"], "messages": stats["messages"],
            "comm_seconds": stats["seconds"], "dealer_bytes": _dealer_bytes(provider) - dealer_before,
            "offline_seconds": offline_seconds, "offline_dealer_bytes": offline_dealer,
            "offline_bytes_sent": offline_sent, "max_error": err,
            "peak_memory_bytes": _peak_memory_bytes(), "ring_gemm": ring_gemm_choice()}


def _reset_peak_memory() -> None:
    """Start a new peak-memory window for this process (Linux: VmHWM := current RSS)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def _peak_memory_bytes() -> int:
    """This process's peak resident memory since _reset_peak_memory (Linux VmHWM), else since
    it started (getrusage)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _pairwise_sent(provider) -> int:
    """Bytes of offline messages this party sent to the other party (provider pairwise; 0 else)."""
    return int((getattr(provider, "stats", None) or {}).get("pairwise_bytes_sent", 0))


def _dealer_bytes(provider) -> int:
    """Bytes of correlations this party received so far: from the dealer, or with provider
    pairwise from the other party's offline messages (0 where there is neither)."""
    stats = getattr(provider, "stats", None) or {}
    return int(stats.get("dealer_bytes", 0)) + int(stats.get("pairwise_bytes_received", 0))


def _data(seed: int, *shape, scale: float = 1.0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)  # insecure-ok: benchmark inputs and public model init, not shares
    return torch.randn(*shape, generator=g) * scale  # insecure-ok: benchmark inputs, not shares


@workload("mul_1M")
def mul_1m():
    a, b = _data(1, 1_000_000), _data(2, 1_000_000)
    x, y = crypten_lite.cryptensor(a, src=0), crypten_lite.cryptensor(b, src=1)
    return _measure(lambda: (_reveal_after(lambda: x * y), a * b))


# Seconds spent inside _reveal_after's fn() since _measure started its clock (None: no
# _reveal_after ran, the whole run is timed).
_OP_SECONDS: list = [None]


def _reveal_after(fn):
    """Run fn (timed, counted) and reveal outside the counters and the clock: every figure,
    seconds included, is for the op alone (from shared inputs to shared outputs), not for
    the reveal that checks it or the plaintext reference computed beside it."""
    start = time.perf_counter()
    out = fn()
    _OP_SECONDS[0] = (_OP_SECONDS[0] or 0.0) + time.perf_counter() - start
    c = comm.get()
    saved = c.get_communication_stats()
    value = out.get_plain_text()
    c._stats.update(saved)
    return value


@workload("matmul_256")
def matmul_256():
    a, b = _data(3, 256, 256), _data(4, 256, 256)
    x, y = crypten_lite.cryptensor(a, src=0), crypten_lite.cryptensor(b, src=1)
    return _measure(lambda: (_reveal_after(lambda: x @ y), a @ b))


@workload("matmul_1024")
def matmul_1024():
    a, b = _data(5, 1024, 1024), _data(6, 1024, 1024)
    x, y = crypten_lite.cryptensor(a, src=0), crypten_lite.cryptensor(b, src=1)
    return _measure(lambda: (_reveal_after(lambda: x @ y), a @ b))


def _ints(seed: int, *shape) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)  # insecure-ok: benchmark inputs, not shares
    return torch.randint(-(1 << 20), 1 << 20, shape, generator=g)  # insecure-ok: benchmark inputs


@workload("mul_int_1M")
def mul_int_1m():
    """The protocol's product alone: integer tensors (scale 1), so no truncation follows it
    (mul_1M is the fixed-point product: the same product with its truncation fused in)."""
    a, b = _ints(11, 1_000_000), _ints(12, 1_000_000)
    x, y = crypten_lite.cryptensor(a, src=0), crypten_lite.cryptensor(b, src=1)
    return _measure(lambda: (_reveal_after(lambda: x * y), a * b))


@workload("matmul_int_256")
def matmul_int_256():
    """[256, 256] @ [256, 256] on integer tensors: the protocol's matmul without a truncation."""
    a, b = _ints(13, 256, 256) >> 8, _ints(14, 256, 256) >> 8
    x, y = crypten_lite.cryptensor(a, src=0), crypten_lite.cryptensor(b, src=1)
    return _measure(lambda: (_reveal_after(lambda: x @ y), a @ b))


@workload("relu_1M")
def relu_1m():
    a = _data(7, 1_000_000, scale=10)
    x = crypten_lite.cryptensor(a, src=0)
    return _measure(lambda: (_reveal_after(lambda: x.relu()), a.relu()))


@workload("lt_1M")
def lt_1m():
    a, b = _data(8, 1_000_000, scale=10), _data(9, 1_000_000, scale=10)
    x, y = crypten_lite.cryptensor(a, src=0), crypten_lite.cryptensor(b, src=1)
    return _measure(lambda: (_reveal_after(lambda: x < y), (a < b)))


@workload("softmax_1000x10")
def softmax():
    a = _data(10, 1000, 10, scale=5).clamp(-10, 10)
    x = crypten_lite.cryptensor(a, src=0)
    return _measure(lambda: (_reveal_after(lambda: x.softmax(-1)), a.softmax(-1)))


def _lenet():
    from crypten_lite.models import lenet
    torch.manual_seed(0)  # insecure-ok: benchmark inputs and public model init, not shares
    return lenet()


def _private_model_run(model: torch.nn.Module, images: torch.Tensor, torch_time: bool = False):
    from crypten_lite import nn
    rank = comm.get().rank
    private = nn.from_pytorch(model, torch.zeros(1, *images.shape[1:]), fold_batch_norm=not model.training)
    private.encrypt(src=0)
    private.eval()
    x = crypten_lite.cryptensor(images if rank == 1 else None, src=1)
    with torch.no_grad():
        ref = model(images)
    result = _measure(lambda: (_reveal_after(lambda: private(x)), ref))
    if torch_time:
        result["torch_seconds"] = _torch_seconds(model, images)
    return result


def _torch_seconds(model: Callable, inputs, repeat: int = 3) -> float:
    """Median seconds of the plaintext torch forward (model(inputs), or model() if inputs is
    None), in the same process and run."""
    times = []
    with torch.no_grad():
        for _ in range(repeat):
            start = time.perf_counter()
            model() if inputs is None else model(inputs)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


class EncoderLayer(torch.nn.Module):
    """The math of torch.nn.TransformerEncoderLayer(d, heads, ffn, activation="gelu",
    batch_first=True) in eval mode (post-norm), written out with Linear layers so that
    from_pytorch imports it: one BERT encoder layer."""

    def __init__(self, d: int, heads: int, ffn: int):
        super().__init__()
        self.heads = heads
        self.q, self.k, self.v, self.o = (torch.nn.Linear(d, d) for _ in range(4))
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.fc1, self.fc2 = torch.nn.Linear(d, ffn), torch.nn.Linear(ffn, d)

    def forward(self, x):
        b, s, d = x.shape
        h, dh = self.heads, d // self.heads
        q = self.q(x).reshape(b, s, h, dh).transpose(1, 2)
        k = self.k(x).reshape(b, s, h, dh).transpose(1, 2)
        v = self.v(x).reshape(b, s, h, dh).transpose(1, 2)
        # softmax(q k^T / sqrt(dh)) v, as torch's own MultiheadAttention computes it
        ctx = torch.nn.functional.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(b, s, d)
        x = self.ln1(x + self.o(ctx))
        return self.ln2(x + self.fc2(torch.nn.functional.gelu(self.fc1(x))))


_LOADED: dict[tuple, tuple] = {}


def _loaded_model_run(key: tuple, build: Callable[[], torch.nn.Module], inputs: torch.Tensor):
    """A model loaded once per party process (imported, encrypted, and run once: its fixed
    weights masked, crypten_lite.mpc.fixed), then measured per inference: the figures of a
    deployed model answering queries. The one-time loading is not in the figures."""
    from crypten_lite import nn
    rank = comm.get().rank
    if key not in _LOADED:
        model = build().eval()
        private = nn.from_pytorch(model, torch.zeros(1, *inputs.shape[1:]))
        private.encrypt(src=0)
        private.eval()
        warm = crypten_lite.cryptensor(inputs if rank == 1 else None, src=1)
        private(warm)
        _LOADED[key] = (model, private)
    model, private = _LOADED[key]
    x = crypten_lite.cryptensor(inputs if rank == 1 else None, src=1)
    with torch.no_grad():
        ref = model(inputs)

    def infer():  # inference: no autograd graph (what backward would need is not computed)
        with crypten_lite.no_grad():
            return private(x)
    result = _measure(lambda: (_reveal_after(infer), ref))
    result["torch_seconds"] = _torch_seconds(model, inputs)
    return result


def _encoder_layer_run(d: int, heads: int, ffn: int, seq: int):
    def build():
        torch.manual_seed(0)  # insecure-ok: benchmark inputs and public model init, not shares
        return EncoderLayer(d, heads, ffn)
    return _loaded_model_run(("encoder", d, heads, ffn, seq), build, _data(19, 1, seq, d))


def _hf_model(kind: str):
    """HuggingFace transformers models from configs with seeded random weights (no hub
    download; the classes from_pretrained builds), eval mode."""
    import transformers as T
    torch.manual_seed(0)  # insecure-ok: benchmark inputs and public model init, not shares
    if kind == "bert_base":
        model = T.BertForSequenceClassification(T.BertConfig(num_labels=2))
    elif kind == "gpt2_small":
        model = T.GPT2LMHeadModel(T.GPT2Config())
    elif kind == "vit_tiny":  # ViT-Ti/16: hidden 192, 12 layers, 3 heads, 224x224 images
        model = T.ViTForImageClassification(T.ViTConfig(hidden_size=192, num_hidden_layers=12,
                                                        num_attention_heads=3, intermediate_size=768,
                                                        num_labels=1000))
    elif kind == "llama_tiny":  # RMSNorm, SiLU-gated MLP, rotary embeddings, grouped-query attention
        model = T.LlamaForCausalLM(T.LlamaConfig(vocab_size=1000, hidden_size=256, num_hidden_layers=4,
                                                 num_attention_heads=4, num_key_value_heads=2,
                                                 intermediate_size=688, max_position_embeddings=128))
    else:
        raise KeyError(kind)
    return model.eval()


def _hf_run(kind: str, seq: int = 0, vocab: int = 0, image: int = 0, last_only: bool = False):
    """A HuggingFace model through nn.from_pytorch, loaded once per party process (party 0's
    model shipped in-band, its weights masked at load), party 1's private input (token ids as
    a secret one-hot, or an image), a public attention mask; figures per inference."""
    import warnings
    warnings.simplefilter("ignore")
    from crypten_lite import nn
    rank = comm.get().rank
    if image:
        inputs = {"pixel_values": _data(21, 1, 3, image, image)}
    else:
        g = torch.Generator().manual_seed(22)  # insecure-ok: benchmark inputs, not shares
        ids = torch.randint(0, vocab, (1, seq), generator=g)  # insecure-ok: benchmark token ids, not shares
        inputs = {"input_ids": ids,
                  "attention_mask": torch.ones(1, seq, dtype=torch.long)}

    def private_inputs():
        run = {k: v for k, v in inputs.items() if k == "attention_mask"}  # public
        if image:
            run["pixel_values"] = crypten_lite.cryptensor(inputs["pixel_values"] if rank == 1 else None, src=1)
        else:
            run["input_ids"] = nn.share_tokens(inputs["input_ids"] if rank == 1 else None, vocab, src=1)
        return run

    key = ("hf", kind)
    if key not in _LOADED:
        from crypten_lite.mpc.offline import mapped_transients
        # the load's large blocks (the owner's float32 model, the conversion's copies) mapped
        # on their own: freed, they leave no hole in the heap that a run would fault in again
        with mapped_transients():
            model = _hf_model(kind) if rank == 0 else None
            private = nn.from_pytorch(model, inputs, src=0)
        private.encrypt(src=0)
        private.eval()
        with crypten_lite.no_grad():  # load: every fixed weight masked once (no autograd graph)
            private(**private_inputs())
        ref, torch_s = None, 0.0
        if rank == 0:
            with torch.no_grad():
                ref = model(**inputs).logits
            torch_s = _torch_seconds(lambda: model(**inputs), None)
        # party 0's torch model (its plaintext float32 weights) freed: the peak counts what an
        # inference holds
        private.release_torch_model()
        model = None
        _LOADED[key] = (private, ref, torch_s)
    private, ref, torch_s = _LOADED[key]

    def infer():  # inference: no autograd graph, as in _loaded_model_run
        with crypten_lite.no_grad():
            return _select(private(**private_inputs())["logits"], last_only)

    def run():
        logits = _reveal_after(infer)
        want = ref if ref is None or not last_only else ref[:, -1:].argmax(-1).double()
        return logits, (want if want is not None else logits)
    result = _measure(run)
    result["torch_seconds"] = torch_s
    result["memory_floor_bytes"] = _memory_floor(private)
    return result


def _memory_floor(private) -> int:
    """A private model's memory floor per party: its weight shares and the fixed-weight masks'
    D (mpc/fixed.py), 8 bytes each per parameter (a tied tensor counted once); the
    activations come on top (a few MB for these rows)."""
    return 16 * sum(p.numel() for p in private.parameters())


def _select(logits, last_only: bool):
    if not last_only:
        return logits
    return logits[:, -1:].argmax(-1)


@workload("bert_base_seq128")
def bert_base_seq128():
    """BERT-base (12 layers, hidden 768, 12 heads, FFN 3072) sequence classification, seq 128."""
    return _hf_run("bert_base", seq=128, vocab=30522)


@workload("gpt2_small_token")
def gpt2_small_token():
    """GPT-2 small (124M): one decode step with the secret KV cache of a 32-token private
    prompt (nn.generate's step: the new token against 32 cached keys and values, its greedy
    argmax over 50257, the id opened to the prompt's owner only)."""
    return _decode_step_run("gpt2_small", seq=32)


def _decode_step_run(kind: str, seq: int):
    """A causal LM loaded once per party process (party 0's model shipped in-band and shared,
    party 1's prompt of `seq` tokens prefilled: the secret KV cache and the first token), then
    measured per decode step; the token checked against torch's greedy decoding at load."""
    import warnings
    warnings.simplefilter("ignore")
    from crypten_lite import nn
    rank = comm.get().rank
    key = ("decode", kind, seq)
    if key not in _LOADED:
        model = _hf_model(kind) if rank == 0 else None
        vocab = 50257 if kind == "gpt2_small" else 1000
        g = torch.Generator().manual_seed(22)  # insecure-ok: benchmark token ids, not shares
        ids = torch.randint(0, vocab, (1, seq), generator=g)  # insecure-ok: benchmark token ids, not shares
        private = nn.from_pytorch(model, {"input_ids": ids, "attention_mask": torch.ones_like(ids)}, src=0)
        private.encrypt(src=0)
        private.eval()
        gen = nn.PrivateGenerator(private, owner=1)
        state = gen.start(ids if rank == 1 else None, 2)   # prefill: every fixed weight masked once
        warm = state.copy()
        gen.step(warm)                                      # the step graph's weights too
        got = gen.reveal(warm.chosen)                       # party 1: its 2 tokens
        torch_s, ok = 0.0, None
        if rank == 0:
            with torch.no_grad():
                out = model(input_ids=ids, use_cache=True)
                first = out.logits[:, -1].argmax(-1, keepdim=True)
                cache = out.past_key_values
                want = torch.cat([first, model(input_ids=first, past_key_values=cache).logits[:, -1].argmax(-1, keepdim=True)], 1)

            def torch_step():  # the plaintext decode step: one token against the 32 cached
                cache.crop(-1)  # back to the prompt's entries
                model(input_ids=first, past_key_values=cache)
            torch_s = _torch_seconds(torch_step, None)
        # party 1 tells party 0 whether its tokens are torch's (a bench check, not a protocol step)
        theirs = comm.get().broadcast(got if rank == 1 else None, 1)
        ok = bool(torch.equal(theirs, want)) if rank == 0 else None
        # The step graph is exported and torch's tokens computed: party 0's torch model (its
        # plaintext float32 weights) is freed, so that the peak counts what a decode step holds.
        gen.release_torch_model()
        model = out = cache = torch_step = None  # noqa: F841
        _LOADED[key] = (gen, state, torch_s, ok)
    gen, state, torch_s, ok = _LOADED[key]

    def run():
        st = state.copy()
        token = gen.reveal([gen.step(st)])
        value = token.double() if token is not None else torch.zeros(1, 1, dtype=torch.double)
        return value, value
    result = _measure(run)
    result["torch_seconds"] = torch_s
    result["memory_floor_bytes"] = _memory_floor(gen.model)
    if rank == 0 and not ok:
        result["max_error"] = float("inf")  # the private tokens differ from torch's greedy ones
    return result


@workload("vit_tiny")
def vit_tiny():
    """ViT-Ti/16 (hidden 192, 12 layers, 3 heads) on one 224x224 image."""
    return _hf_run("vit_tiny", image=224)


@workload("llama_tiny")
def llama_tiny():
    """A LLaMA-style decoder (hidden 256, 4 layers, 4 heads, 2 KV heads, vocab 1000), seq 32."""
    return _hf_run("llama_tiny", seq=32, vocab=1000)


@workload("bert_layer_tiny")
def bert_layer_tiny():
    """One encoder layer at hidden 32, 2 heads, FFN 64, seq 8 (exact costs in the tests)."""
    return _encoder_layer_run(32, 2, 64, 8)


@workload("bert_base_layer_seq128")
def bert_base_layer_seq128():
    """One BERT-base encoder layer: hidden 768, 12 heads, FFN 3072, GELU, seq 128, batch 1."""
    return _encoder_layer_run(768, 12, 3072, 128)


# --------------------------------------------------------------- where a layer's costs go
# Phases of a transformer layer, by the outermost function on the call stack when a round,
# a byte or a dealer byte is counted: (file, function) -> phase; anything else: "other".
SPLIT_PHASES = {("fixed.py", "product"): "linear", ("nonlinear.py", "softmax"): "softmax",
                ("fast.py", "softmax_last"): "softmax", ("nonlinear.py", "gelu"): "gelu", ("normalization.py", "layer_norm"): "layernorm",
                ("cryptensor.py", "matmul"): "attention_matmul",
                ("cryptensor.py", "__matmul__"): "attention_matmul",
                ("cryptensor.py", "get_plain_text"): "reveal"}


_PHASE_ORDER = ("reveal", "linear", "softmax", "gelu", "layernorm", "attention_matmul")


def _phase() -> str:
    """The phase of the running code: of the phases on the call stack, the first in
    _PHASE_ORDER (a Linear's product runs inside CrypTensor.matmul: it is "linear")."""
    frame, found = sys._getframe(2), set()
    while frame is not None:
        code = frame.f_code
        phase = SPLIT_PHASES.get((os.path.basename(code.co_filename), code.co_name))
        if phase is not None:
            found.add(phase)
        frame = frame.f_back
    return next((p for p in _PHASE_ORDER if p in found), "other")


class _Attributing(dict):
    """A counters dict that also adds every increment to the current phase's counters."""

    def __init__(self, base: dict, into: dict, fields: tuple[str, ...]):
        super().__init__(base)
        self.into, self.fields = into, fields

    def __setitem__(self, field, value):
        if field in self.fields:
            delta = value - self.get(field, 0)
            if delta:
                phase = self.into.setdefault(_phase(), {f: 0 for f in ("rounds", "bytes_sent", "dealer_bytes")})
                phase[field] += delta
        super().__setitem__(field, value)


def cost_split(name: str) -> dict:
    """Run workload `name` (bert_layer_tiny, bert_base_layer_seq128) with every round, byte
    sent and dealer byte of its measured inference attributed to a phase (SPLIT_PHASES):
    {"phases": {phase: {rounds, bytes_sent, dealer_bytes}}, "total": the bench's row}.
    Dealer bytes are counted online here (no offline prefetch before the recorded run)."""
    c = comm.get()
    from crypten_lite.session import current
    provider = current().provider
    phases: dict = {}
    reset = c.reset_communication_stats

    def attributing_reset():
        reset()
        phases.clear()
        c._stats = _Attributing(c._stats, phases, ("rounds", "bytes_sent"))
    _PLANS.pop(name, None)                                # the measured run: no prefetch
    c.reset_communication_stats = attributing_reset
    saved_stats = getattr(provider, "stats", None)
    try:
        WORKLOADS[name]()                                 # load (weights masked) and warm up
        _PLANS.pop(name, None)
        if saved_stats is not None:
            provider.stats = _Attributing(saved_stats, phases, ("dealer_bytes",))
        total = WORKLOADS[name]()
        phases.pop("reveal", None)                        # the result's reveal: not in the figures
    finally:
        c.reset_communication_stats = reset
        c._stats = dict(c._stats)
        if saved_stats is not None:
            provider.stats = dict(provider.stats)
    return {"phases": phases, "total": total}


@workload("lenet_b1")
def lenet_b1():
    return _private_model_run(_lenet(), _data(11, 1, 1, 28, 28))


_SERVED: dict[str, object] = {}   # served workloads: the private model kept per party process


@workload("lenet_b1_served")
def lenet_b1_served():
    """A loaded model's later query, as `crypten-lite serve` runs it: LeNet encrypted once per
    party process and one first forward made (its fixed-weight masks drawn; provider pairwise
    keeps the peer's encrypted masks, provider/he_kept.py) outside any timing; every call then
    measures one batch-1 inference of that same model (offline phase and run)."""
    from crypten_lite import nn
    from crypten_lite.session import current
    key = f"lenet_b1/{id(current())}"     # a model belongs to its session (pool)
    kept = _SERVED.get(key)
    images = _data(11, 1, 1, 28, 28)
    if kept is None:
        model = _lenet().eval()
        private = nn.from_pytorch(model, torch.zeros(1, 1, 28, 28), fold_batch_norm=True)
        private.encrypt(src=0)
        private.eval()
        with torch.no_grad():
            private(crypten_lite.cryptensor(images if comm.get().rank == 1 else None, src=1))
        _SERVED.clear()
        _SERVED[key] = kept = (model, private)
    model, private = kept
    x = crypten_lite.cryptensor(images if comm.get().rank == 1 else None, src=1)
    with torch.no_grad():
        ref = model(images)
    return _measure(lambda: (_reveal_after(lambda: private(x)), ref))


@workload("lenet_b64")
def lenet_b64():
    return _private_model_run(_lenet(), _data(12, 64, 1, 28, 28))


@workload("resnet18_b1")
def resnet18_b1():
    from crypten_lite.models import build_model
    model = build_model(width=64, seed=0)
    return _private_model_run(model, _data(13, 1, 3, 32, 32))


@workload("logreg_sgd_step")
def logreg_step(read_loss: bool = False):
    """One SGD step of logistic regression (100 features, batch 100, BCE-with-logits): party
    0's model, party 1's data. read_loss=True also reveals the loss value inside the step
    (abs, exp, log: computed only because it is read; scripts/gen_doc_figures.py's
    logreg_sgd_step_loss)."""
    from crypten_lite import nn, optim
    rank = comm.get().rank
    torch.manual_seed(0)  # insecure-ok: benchmark inputs and public model init, not shares
    features, labels = _data(14, 100, 100), (_data(15, 100, 1) > 0).float()
    model = nn.Sequential(nn.Linear(100, 1))
    model.encrypt(src=0)
    x = crypten_lite.cryptensor(features if rank == 1 else None, src=1)
    y = crypten_lite.cryptensor(labels if rank == 1 else None, src=1)
    opt = optim.SGD(model.parameters(), lr=0.1)
    loss_fn = nn.BCEWithLogitsLoss()

    def step():  # forward, backward, update (the loss value only with read_loss)
        opt.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        opt.step()
        return (loss.get_plain_text().reshape(1) * 0 if read_loss else torch.zeros(1)), None
    return _measure(step, "logreg_sgd_step_loss" if read_loss else None)


@workload("transport_16MB")
def transport():
    """Exchange a 16 MB tensor between the 2 parties; bytes/s per direction."""
    c = comm.get()
    t = torch.zeros(2 * 1024 * 1024, dtype=torch.int64)
    c.barrier()
    c.reset_communication_stats()
    start = time.perf_counter()
    other = 1 - c.rank
    c.exchange({other: t}, [other])
    seconds = time.perf_counter() - start
    stats = c.get_communication_stats()
    return {"seconds": seconds, "rounds": stats["rounds"], "bytes_sent": stats["bytes_sent"],
            "bytes_received": stats["bytes_received"], "messages": stats["messages"],
            "comm_seconds": stats["seconds"], "dealer_bytes": 0, "max_error": 0.0,
            "mb_per_s": t.numel() * 8 / seconds / 1e6}


def _loopback_tcp_pair(c):
    """A plain loopback TCP connection between parties 0 and 1 (the port travels through the
    session, untimed): (socket, listener or None); the caller closes both."""
    import socket
    if c.rank == 0:
        listener = socket.create_server(("127.0.0.1", 0))
        c.send(torch.tensor([listener.getsockname()[1]]), 1)
        listener.settimeout(60)
        sock, _ = listener.accept()
        return sock, listener
    return socket.create_connection(("127.0.0.1", int(c.recv(0)[0])), timeout=60), None


@workload("raw_tcp_16MB")
def raw_tcp():
    """The wire's limit for transport_16MB: the same two party processes exchange the same
    16 MB over one plain loopback TCP socket (no gRPC, no TLS, no framing: sendall from the
    tensor's memory on a thread, recv_into a preallocated tensor). Only the exchange is
    timed, as in transport_16MB; the port travels through the session first (untimed)."""
    import socket
    import threading
    c = comm.get()
    t = torch.zeros(2 * 1024 * 1024, dtype=torch.int64)
    got = torch.empty_like(t)
    sock, listener = _loopback_tcp_pair(c)
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(60)
        out, into = memoryview(t.numpy()).cast("B"), memoryview(got.numpy()).cast("B")
        c.barrier()
        start = time.perf_counter()
        sender = threading.Thread(target=sock.sendall, args=(out,))
        sender.start()
        n = 0
        while n < len(into):
            k = sock.recv_into(into[n:])
            if not k:
                raise ConnectionError("raw_tcp_16MB: the peer closed its socket early")
            n += k
        sender.join()
        seconds = time.perf_counter() - start
    finally:
        sock.close()
        if listener is not None:
            listener.close()
    return {"seconds": seconds, "rounds": 1, "bytes_sent": len(out), "bytes_received": n,
            "messages": 1, "comm_seconds": seconds, "dealer_bytes": 0, "max_error": 0.0,
            "mb_per_s": len(out) / seconds / 1e6}


@workload("reveal_4")
def reveal_4():
    """Reveal of 4 shared elements to both parties (one round): the per-round cost that small
    openings pay (compare raw_tcp_rtt, the wire's round trip)."""
    a = _data(1, 4)
    x = crypten_lite.cryptensor(a, src=0)
    return _measure(lambda: (x.get_plain_text(), a))


@workload("mul_4")
def mul_4():
    """Product of 4 shared elements (one round, truncation local; the dealer's correction
    fetched in the offline phase, as for every row): the per-op cost of a small product."""
    a, b = _data(1, 4), _data(2, 4)
    x, y = crypten_lite.cryptensor(a, src=0), crypten_lite.cryptensor(b, src=1)
    return _measure(lambda: (_reveal_after(lambda: x * y), a * b))


RTT_SAMPLES = 50


@workload("raw_tcp_rtt")
def raw_tcp_rtt():
    """The wire's limit for reveal_4: a 64-byte ping-pong between the same two party processes
    over one plain loopback TCP socket (TCP_NODELAY), median of RTT_SAMPLES round trips."""
    import socket
    c = comm.get()
    sock, listener = _loopback_tcp_pair(c)
    times = []
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(60)
        ping, got = bytes(64), bytearray(64)
        c.barrier()
        for _ in range(RTT_SAMPLES + 1):  # the first is a warm-up
            start = time.perf_counter()
            if c.rank == 0:
                sock.sendall(ping)
            n = 0
            while n < 64:
                k = sock.recv_into(memoryview(got)[n:])
                if not k:
                    raise ConnectionError("raw_tcp_rtt: the peer closed its socket early")
                n += k
            if c.rank == 1:
                sock.sendall(ping)
            times.append(time.perf_counter() - start)
    finally:
        sock.close()
        if listener is not None:
            listener.close()
    seconds = statistics.median(times[1:]) if c.rank == 0 else 0.0
    return {"seconds": seconds, "rounds": 1, "bytes_sent": 64, "bytes_received": 64,
            "messages": 1, "comm_seconds": seconds, "dealer_bytes": 0, "max_error": 0.0}


def bare_grpc_echo(nbytes: int = 16 * 1024 * 1024, repeat: int = 3) -> float:
    """Seconds for a bare gRPC stream to carry `nbytes` to a server and back (median)."""
    from crypten_lite.comm.bare import echo_seconds
    return statistics.median(echo_seconds(nbytes) for _ in range(repeat))


_UNSUPPORTED = re.compile(r"^(?:crypten_lite\.errors\.)?UnsupportedError: (.*)$", re.M)


def _failure_row(name: str, parties: int, protocol: str, error: Exception) -> dict:
    """The row of a workload that failed: `missing` names the operation the protocol lacks
    (an UnsupportedError on a party) where that is the cause."""
    text = str(error)
    row = {"workload": name, "parties": parties, "protocol": protocol,
           "error": text.splitlines()[0] if text else type(error).__name__}
    missing = _UNSUPPORTED.search(text)
    if missing:
        row["missing"] = missing.group(1).strip()
        row["error"] = f"not run: protocol {protocol} lacks an operation: {row['missing']}"
    return row


def run(names: list[str], parties: int, provider: str, repeat: int, tls_dir: str = "",
        protocol: str = "additive", offline: bool = True) -> list[dict]:
    env = {"CRYPTEN_LITE_TLS_DIR": tls_dir} if tls_dir else {}
    if not offline:
        env[NO_OFFLINE_ENV] = "1"
    rows, machine = [], cpu_model()
    # A large workload's load and one inference take minutes on a small machine.
    timeout = 3600 if LARGE & set(names) else 300
    from .mpc.launcher import inherited_settings
    with PartyPool(parties, provider=provider, timeout=timeout, env=env, protocol=protocol) as pool:
        for name in names:
            if name in TRANSPORT_ROWS + LATENCY_ROWS and parties != 2:
                continue
            samples = []
            try:
                pool.run(WORKLOADS[name])  # warm-up (imports, first dealer contact)
                for _ in range(repeat):
                    samples.append(pool.run(WORKLOADS[name]))
            except Exception as e:  # report and go on with the other workloads
                rows.append(_failure_row(name, parties, protocol, e))
                continue
            seconds = [max(r["seconds"] for r in s) for s in samples]
            first = samples[-1]
            row = {"workload": name, "parties": parties, "protocol": protocol,
                   "provider": provider if protocol == "additive" else None, "tls": bool(tls_dir),
                   "offline_phase": offline,
                   "seconds_median": statistics.median(seconds), "seconds_min": min(seconds),
                   "seconds_max": max(seconds), "rounds": first[0]["rounds"],
                   "bytes_sent_per_party": [r["bytes_sent"] for r in first],
                   "online_dealer_bytes": first[0]["dealer_bytes"],
                   "offline_seconds": statistics.median(max(r.get("offline_seconds", 0.0) for r in s) for s in samples),
                   # one inference with its own offline phase (the recorded plan sent to the
                   # dealer in one exchange before the first op, its first chunk of
                   # corrections returned; later chunks pulled in the run) and its run: the slower
                   # party's sum per repetition, median
                   "end_to_end_seconds_median": statistics.median(
                       max(r.get("offline_seconds", 0.0) + r["seconds"] for r in s) for s in samples),
                   "offline_dealer_bytes": first[0].get("offline_dealer_bytes", 0),
                   # correlation bytes each party received (dealer, or the other party's with
                   # provider pairwise), offline phase and run
                   "offline_dealer_bytes_per_party": [r.get("offline_dealer_bytes", 0) for r in first],
                   "online_dealer_bytes_per_party": [r["dealer_bytes"] for r in first],
                   "offline_bytes_sent_per_party": [r.get("offline_bytes_sent", 0) for r in first],
                   "max_error": first[0]["max_error"],
                   # each party's peak resident memory over the offline phase and the run
                   "peak_memory_mb_per_party": [round(r.get("peak_memory_bytes", 0) / 2**20, 1) for r in first],
                   # seconds depend on what else runs on the machine: record how busy it was
                   "load_average_1min": round(os.getloadavg()[0], 1), "cpus": os.cpu_count(),
                   "cpu_model": machine,
                   # how this party ran its large ring products: torch's int64 ops or float64 limbs
                   "ring_gemm": first[0].get("ring_gemm")}
            if provider == "pairwise" and protocol == "additive":   # which OT loops the parties ran
                from . import _native
                row["ot_kernel"] = _native.describe()
            settings = inherited_settings()   # e.g. CRYPTEN_LITE_TRUNCATION=exact, as the parties ran
            if settings:
                row["settings"] = settings
            if "torch_seconds" in first[0]:  # the plaintext forward, same run, same process
                row["torch_seconds"] = statistics.median(max(r["torch_seconds"] for r in s) for s in samples)
                row["ratio_to_torch"] = row["seconds_median"] / max(row["torch_seconds"], 1e-9)
            if "memory_floor_bytes" in first[0]:  # a private model's floor (_memory_floor)
                floor = first[0]["memory_floor_bytes"] / 2**20
                row["memory_floor_mb"] = round(floor, 1)
                row["peak_over_floor"] = [round(p / floor, 2) for p in row["peak_memory_mb_per_party"]]
            if name == "transport_16MB":
                row["mb_per_s"] = statistics.median(min(r["mb_per_s"] for r in s) for s in samples)
                bare = bare_grpc_echo()
                row["bare_grpc_mb_per_s"] = 16 * 1024 * 1024 / bare / 1e6
                row["fraction_of_bare"] = row["mb_per_s"] / row["bare_grpc_mb_per_s"]
            if name == "raw_tcp_16MB":
                row["mb_per_s"] = statistics.median(min(r["mb_per_s"] for r in s) for s in samples)
            rows.append(row)
    _against_the_wire(rows)
    return rows


# The transport rows: both exchange 16 MB each way between the two parties; raw_tcp_16MB is
# the limit (plain TCP, same processes, same run) each transport row is compared with.
TRANSPORT_ROWS = ("transport_16MB", "raw_tcp_16MB")


# The latency rows: raw_tcp_rtt (a 64-byte round trip on plain TCP) is the limit of reveal_4,
# and reveal_4 that of mul_4 (a small product is one opening plus local arithmetic).
LATENCY_ROWS = ("reveal_4", "mul_4", "raw_tcp_rtt")


def _with_the_wire(names: list[str]) -> list[str]:
    """`names`, with raw_tcp_16MB measured right after transport_16MB where it is not named
    (and raw_tcp_rtt after reveal_4 or mul_4, reveal_4 after mul_4)."""
    for row, limit in (("transport_16MB", "raw_tcp_16MB"), ("mul_4", "reveal_4"),
                       ("reveal_4", "raw_tcp_rtt")):
        if row in names and limit not in names:
            i = names.index(row)
            names = names[:i + 1] + [limit] + names[i + 1:]
    return names


def _against_the_wire(rows: list[dict]) -> None:
    """Each transport row's GB/s per direction, and its time as a multiple of raw TCP's."""
    raw = next((r for r in rows if r["workload"] == "raw_tcp_16MB" and "mb_per_s" in r), None)
    for r in rows:
        if r["workload"] in TRANSPORT_ROWS and "mb_per_s" in r:
            r["gb_per_s"] = r["mb_per_s"] / 1e3
            if raw is not None:
                r["times_raw_tcp"] = raw["mb_per_s"] / r["mb_per_s"]
    by_name = {r["workload"]: r for r in rows if "seconds_median" in r}
    for row, limit, field in (("reveal_4", "raw_tcp_rtt", "times_raw_tcp_rtt"),
                              ("mul_4", "reveal_4", "times_reveal_4")):
        if row in by_name and limit in by_name and by_name[limit]["seconds_median"] > 0:
            by_name[row][field] = by_name[row]["seconds_median"] / by_name[limit]["seconds_median"]


def cpu_model() -> str:
    """This machine's CPU as /proc/cpuinfo names it, and whether it has AVX-512 (int64
    matmuls and convolutions, which the products of both protocols run locally, are several
    times slower without it): seconds compare only between lines of the same CPU."""
    try:
        info = open("/proc/cpuinfo").read()
    except OSError:
        return "unknown"
    name = re.search(r"^model name\s*:\s*(.+)$", info, re.M)
    flags = re.search(r"^flags\s*:\s*(.+)$", info, re.M)
    avx512 = bool(flags and "avx512f" in flags.group(1).split())
    return f"{name.group(1).strip() if name else 'unknown'}, {os.cpu_count()} cpus, " \
           f"{'AVX-512' if avx512 else 'no AVX-512'}"


def default_workloads(large: bool = False) -> list[str]:
    """The workloads a bench run without --only runs (LARGE ones only with --large)."""
    return [w for w in WORKLOADS if large or w not in LARGE]


PROVIDERS = ("dealer", "pairwise", "tfp")


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``crypten-lite bench``."""
    parser = argparse.ArgumentParser(prog="crypten-lite bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parties", type=int, default=2,
                        help="number of computing parties (default %(default)s)")
    parser.add_argument("--protocol", choices=("additive", "rss"), default=None,
                        help="sharing scheme: additive (any number of parties, with --provider) or "
                             "rss (exactly 3 parties, no dealer); default CRYPTEN_LITE_PROTOCOL, "
                             "else additive")
    parser.add_argument("--provider", choices=PROVIDERS, default=None,
                        help="additive protocol's correlated randomness: dealer process, "
                             "pairwise (2 parties, no dealer: homomorphic encryption and OT) or tfp "
                             "(INSECURE, party 0 deals); default CRYPTEN_LITE_PROVIDER, else dealer; "
                             "ignored under rss")
    parser.add_argument("--tls", action="store_true", help="run with mutual TLS (fresh certificates)")
    parser.add_argument("--only", action="append", choices=sorted(WORKLOADS), metavar="NAME",
                        help="run only this workload (repeatable); one of: " + ", ".join(sorted(WORKLOADS)))
    parser.add_argument("--large", action="store_true",
                        help="also run the large workloads (minutes each): " + ", ".join(sorted(LARGE)))
    parser.add_argument("--repeat", type=int, default=3,
                        help="timed repetitions after one warm-up; seconds are their median (default %(default)s)")
    parser.add_argument("--no-offline", dest="offline", action="store_false",
                        help="run every repetition without an offline phase: the dealer's corrections "
                             "are fetched online, and under rss each truncation runs the helper "
                             "protocol (two rounds, no pair made); seconds are then end to end")
    parser.add_argument("--out", default="-", help="append the JSON lines to this file (default stdout)")
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    from crypten_lite.errors import ConfigError
    from crypten_lite.mpc.launcher import resolve_protocol
    try:
        protocol = resolve_protocol(args.parties, args.protocol)
    except ConfigError as e:
        parser.error(str(e))
    if args.provider is None:     # as launch does: the environment's provider, else the dealer
        env = os.environ.get("CRYPTEN_LITE_PROVIDER", "")
        if env and env not in PROVIDERS:
            parser.error(f"CRYPTEN_LITE_PROVIDER={env!r} is not one of {', '.join(PROVIDERS)}: set it "
                         "to one of them, or unset it and pass --provider")
        args.provider = env or "dealer"
    if protocol == "additive" and args.provider == "pairwise" and args.parties != 2:
        parser.error(f"--provider pairwise (no dealer) runs exactly 2 parties, got --parties "
                     f"{args.parties}: use --parties 2, or for {args.parties} parties the dealer "
                     "provider (--provider dealer)" + (" or --protocol rss" if args.parties == 3 else ""))
    tls_dir = ""
    if args.tls:
        import tempfile
        from . import certs
        tls_dir = tempfile.mkdtemp(prefix="crypten-lite-bench-certs-")
        certs.generate(tls_dir, parties=args.parties)
    names = args.only or default_workloads(args.large)
    names = _with_the_wire(names)
    rows = run(names, args.parties, args.provider, args.repeat, tls_dir, protocol, args.offline)
    out = sys.stdout if args.out == "-" else open(args.out, "a")
    for row in rows:
        out.write(json.dumps(row) + "\n")
    print(f"{'workload':18} {'parties':>7} {'protocol':>8} {'median s':>9} {'offline s':>9} {'rounds':>7} "
          f"{'MB sent/party':>14} {'corr MB':>9} {'max err':>9} {'peak MB/party':>13}", file=sys.stderr)
    for r in rows:
        if "error" in r:
            status = r["error"] if "missing" in r else f"error: {r['error'][:80]}"
            print(f"{r['workload']:18} {r['parties']:>7} {r['protocol']:>8} {status}", file=sys.stderr)
            continue
        dealer_mb = (r["online_dealer_bytes"] + r["offline_dealer_bytes"]) / 1e6
        print(f"{r['workload']:18} {r['parties']:>7} {r['protocol']:>8} {r['seconds_median']:>9.3f} "
              f"{r.get('offline_seconds', 0.0):>9.3f} {r['rounds']:>7} {max(r['bytes_sent_per_party']) / 1e6:>14.3f} {dealer_mb:>9.2f} "
              f"{r['max_error']:>9.2e} {max(r.get('peak_memory_mb_per_party') or [0]):>13.0f}", file=sys.stderr)
    print("(median s: the online run; offline s: its offline phase; corr MB: correlation bytes "
          "party 0 received, from the dealer or, under pairwise, from the other party; the JSON "
          "lines give both parties' offline bytes)", file=sys.stderr)
    for r in rows:
        if "gb_per_s" in r:
            ratio = f", {r['times_raw_tcp']:.2f}x raw TCP's time" if "times_raw_tcp" in r else ""
            print(f"{r['workload']}: {r['gb_per_s']:.2f} GB/s per direction{ratio}", file=sys.stderr)
        if "peak_over_floor" in r:
            print(f"{r['workload']}: peak {r['peak_memory_mb_per_party']} MB per party = "
                  f"{r['peak_over_floor']}x its floor of {r['memory_floor_mb']} MB (weight shares and "
                  "fixed-weight masks, 16 B per parameter)", file=sys.stderr)
        for field, limit in (("times_raw_tcp_rtt", "a raw TCP round trip"), ("times_reveal_4", "reveal_4")):
            if field in r:
                print(f"{r['workload']}: {r[field]:.2f}x {limit}'s time", file=sys.stderr)
    return 0 if all("error" not in r for r in rows) else 1
