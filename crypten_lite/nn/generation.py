"""Private greedy decoding with a secret-shared KV cache (GPT-2, LLaMA-style causal LMs).

    private = nn.from_pytorch(model if rank == src else None, dummy, src=src).encrypt(src=src)
    tokens = nn.generate(private, prompt_ids if rank == owner else None, max_new_tokens=8, owner=owner)
    # party `owner`: a LongTensor (1, prompt length + 8), prompt then generated ids; others: None

Parties: the model owner `src` (the HuggingFace model, its weights secret-shared by
`encrypt`) and the data owner `owner` (the prompt's token ids). Both may be the same party.

How a generation runs (every party runs the same program):

1. The prompt is shared by its owner as a one-hot matrix (`share_tokens`).
2. The model owner exports two graphs of its model through `from_pytorch(..., src=src)`
   (architecture and public constants broadcast, no weights) and every party attaches the
   weights already shared by `encrypt` (the same CrypTensors: a weight masked once,
   crypten_lite.mpc.fixed, stays masked for both graphs):
   * **prefill**: the prompt (L tokens) -> the last position's logits and every layer's keys
     and values (the KV cache, secret-shared);
   * **decode step**: one token, the cache of P = L + max_new_tokens - 2 slots -> its logits
     and the cache with its own key and value appended. Only the new token goes through the
     model: its projections, MLP and LM head are one row, its attention one query against
     the P + 1 cached keys. The graph is exported once, with fixed shapes: the cache is kept
     left-aligned-empty (valid entries at the right end) and a public attention mask marks the
     empty slots, so every step runs the same graph and costs exactly the same.
   Both graphs are the model's own forward (HuggingFace's code with `DynamicCache`, traced by
   torch.export), the code path its pretrained weights use.
3. After each forward, the next token is chosen privately: `argmax(logits, one_hot=True,
   method="grouped")` (a tournament of all-pairs groups of private comparisons) gives its one-hot, secret-shared, which is the next
   step's token input as it is (a one-hot x embedding-table product, like a shared prompt).
   Nothing is revealed during the loop.
4. At the end, the generated ids (the one-hots' indices, computed locally) are opened to the
   data owner only: one message from each other party to it.

What each party learns: the model owner's architecture and the prompt length are public
(shapes), as are max_new_tokens and the positions; the data owner learns the generated ids;
no party learns the prompt, the weights, the logits or the KV cache. Generation always runs
max_new_tokens steps (stopping at an end-of-sequence token would reveal when it was produced).

Public values are computed in the clear: positions (position_ids) and the attention mask of
the cache slots are plain tensors every party builds from the public step number.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from ..cryptensor import CrypTensor
from ..cryptensor import no_grad as _no_grad
from ..errors import ProtocolError, UnsupportedError


class _CausalLMStep(torch.nn.Module):
    """The model owner's HuggingFace causal LM as a function of tensors only (what torch.export
    traces): (ids, attention_mask, position_ids, k_0, v_0, k_1, v_1, ...) -> (last logits,
    k_0, v_0, ...), the cache given and returned as one key and one value tensor per layer."""

    def __init__(self, model: torch.nn.Module, layers: int) -> None:
        super().__init__()
        self.model = model
        self.layers = layers
        params = inspect.signature(model.forward).parameters
        self.cache_arg = "cache" if "cache" in params else "past_key_values"

    def forward(self, input_ids, attention_mask, position_ids, *past):
        from transformers import DynamicCache  # only the model owner runs this (it has the model)
        cache = DynamicCache(ddp_cache_data=[(past[2 * i], past[2 * i + 1]) for i in range(self.layers)]) \
            if past else DynamicCache()
        out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                         use_cache=True, logits_to_keep=1, **{self.cache_arg: cache})
        cache = getattr(out, "cache", None) or out.past_key_values
        flat = []
        for layer in cache.layers:
            flat += [layer.keys, layer.values]
        return (out.logits[:, -1],) + tuple(flat)


def _step_module(model: torch.nn.Module) -> _CausalLMStep:
    """The model owner's model wrapped for export; a clear refusal for an unsupported model."""
    name = type(model).__name__
    config = getattr(model, "config", None)
    layers = getattr(config, "num_hidden_layers", None)
    params = inspect.signature(model.forward).parameters
    if config is None or not isinstance(layers, int) or "logits_to_keep" not in params or \
            not ({"cache", "past_key_values"} & set(params)):
        raise UnsupportedError(
            f"nn.generate: {name} is not a HuggingFace causal language model with a KV cache "
            "(a transformers *ForCausalLM / *LMHeadModel whose forward takes a cache and "
            "logits_to_keep); generation supports GPT-2 and LLaMA-style decoders")
    if getattr(config, "is_encoder_decoder", False):
        raise UnsupportedError(f"nn.generate: {name} is an encoder-decoder model; only decoder-only "
                               "causal language models are supported")
    return _CausalLMStep(model, layers).eval()


def _share_weights(graph, private, prefix: str = "model.") -> None:
    """Give `graph` (a step graph of the same model) the CrypTensors of `private` (the model
    shared by encrypt), by state path: no new sharing, the fixed-weight masks are kept."""
    own = private.state_dict()
    for mprefix, m in graph.named_modules():
        for table in (m._parameters, m._buffers):
            for name in list(table):
                key = f"{mprefix}.{name}" if mprefix else name
                base = key[len(prefix):] if key.startswith(prefix) else key
                if base not in own:
                    raise UnsupportedError(f"nn.generate: the step graph uses {key!r}, which the shared "
                                           "model does not have")
                value = own[base]
                if tuple(value.shape) != tuple(table[name].shape):
                    raise ProtocolError(f"nn.generate: {base} has shape {tuple(value.shape)} in the shared "
                                        f"model, {tuple(table[name].shape)} in the step graph")
                table[name] = value
        object.__setattr__(m, "_encrypted", True)
    object.__setattr__(graph, "_architecture_only", False)


def _one_hot_index(one_hot: CrypTensor) -> CrypTensor:
    """The index of a secret one-hot (..., V): a local weighted sum, nothing opened."""
    ints = one_hot._new(one_hot.share, 0, torch.int64)
    return ints.mul(torch.arange(one_hot.shape[-1])).sum(-1)


class PrivateGenerator:
    """Greedy decoding of a shared causal LM (see the module docstring); keeps its exported
    graphs per (prompt length, max_new_tokens) for later calls.

    `costs` (after `generate`): rounds, bytes sent and bytes received by this party for the
    prompt's sharing, the prefill (with its argmax), each decode step (with its argmax) and the
    final reveal, from the communication counters.
    """

    def __init__(self, model, owner: int) -> None:
        from .from_pytorch import GraphModule
        if not isinstance(model, GraphModule) or model.__dict__.get("_model_src") is None:
            raise UnsupportedError("nn.generate needs a model converted with nn.from_pytorch(model if rank == "
                                   "src else None, dummy, src=src) and shared with encrypt(src=src)")
        if model.__dict__.get("_architecture_only", True) is not False and not model.encrypted:
            raise ProtocolError("nn.generate: call encrypt(src=...) on the model first")
        self.model = model
        self.src = model.__dict__["_model_src"]
        self.owner = owner
        self._graphs: dict[tuple, Any] = {}
        self.costs: dict[str, Any] = {}
        self.vocab_size: int | None = None
        self._released = False  # release_torch_model() was called

    # -------------------------------------------------------------- graphs
    def _torch_model(self):
        return self.model.__dict__.get("_torch_model")

    def release_torch_model(self) -> None:
        """Drop the converted model's reference to the owner's torch model (every party may
        call it; only the model owner holds one). The torch model is only needed to export a
        graph for a new (prompt length, max_new_tokens); the graphs already exported keep
        running on the shared weights. The owner's plaintext copy of the weights (GPT-2
        small: 475 MiB in float32) is freed once the caller drops its own reference too. A
        later start() that needs a new graph then fails on every party, naming this call."""
        for graph in (self.model, *self._graphs.values()):  # each exported graph keeps its module
            graph.__dict__.pop("_torch_model", None)
        self._released = True

    def _vocab(self) -> int:
        """The model owner's vocabulary size, broadcast (a model it cannot run is refused here,
        on every party: the owner sends -1)."""
        from ..session import current
        if self.vocab_size is not None:
            return self.vocab_size
        s = current()
        problem, vocab = None, -1
        if s.rank == self.src:
            try:
                model = self._torch_model()
                if model is None:
                    raise UnsupportedError("nn.generate: the model owner's converted model has no torch model "
                                           "attached (convert it with nn.from_pytorch(..., src=src))")
                _step_module(model)
                vocab = int(model.get_input_embeddings().num_embeddings)
            except UnsupportedError as e:
                problem = e
        got = int(s.comm.broadcast(torch.tensor([vocab]) if s.rank == self.src else None, self.src)[0])
        if problem is not None:
            raise problem
        if got <= 0:
            raise UnsupportedError(f"nn.generate: the model owner (party {self.src}) refused: its model is "
                                   "not a supported causal language model")
        self.vocab_size = got
        return got

    def _graph(self, kind: str, length: int, past: tuple | None):
        """The prefill (past None) or decode-step graph, exported by the model owner, shared weights."""
        from .from_pytorch import from_pytorch
        from ..session import current
        key = (kind, length, past)
        if key in self._graphs:
            return self._graphs[key]
        rank = current().rank
        ids = torch.zeros(1, 1 if past else length, dtype=torch.long)
        mask = torch.ones(1, length, dtype=torch.long)
        positions = torch.arange(length - ids.shape[1], length)[None]
        dummy = (ids, mask, positions)
        if past:  # (layers, batch, kv heads, P, head dim) -> per-layer k, v of (batch, heads, P, dim)
            dummy = (ids, mask, positions) + tuple(torch.zeros(past[1:]) for _ in range(2 * past[0]))
        torch_model = self._torch_model()
        if rank == self.src and torch_model is None and self._released:
            try:  # from_pytorch tells the other parties that no graph comes (no hang)
                from_pytorch(None, dummy, src=self.src)
            except UnsupportedError:
                pass
            raise UnsupportedError(
                f"nn.generate: party {rank} released its torch model (release_torch_model), but a "
                f"{kind} graph for {length} positions was not exported before; keep the torch model "
                "until every prompt length and max_new_tokens has been started once")
        module = _step_module(torch_model) if rank == self.src else None
        graph = from_pytorch(module, dummy, src=self.src)
        _share_weights(graph, self.model)
        graph.eval()
        self._graphs[key] = graph
        return graph

    # -------------------------------------------------------------- decoding
    @staticmethod
    def _next(logits: CrypTensor) -> CrypTensor:
        """The secret one-hot of the greedy token (torch's tie rule: the first largest logit), by
        the grouped tournament (functions.reductions.argmax_grouped: 37 rounds over GPT-2's
        50257 logits between 2 parties, against 112 for the tree)."""
        return logits.argmax(-1, one_hot=True, method="grouped")

    @staticmethod
    def _tokens(one_hot: CrypTensor):
        from .transformer_ops import PrivateTokens
        return PrivateTokens(one_hot.reshape(1, 1, one_hot.shape[-1]), None, None)

    def generate(self, input_ids: torch.Tensor | None, max_new_tokens: int = 8) -> torch.Tensor | None:
        """The prompt and max_new_tokens greedy ids on the data owner; None elsewhere."""
        state = self.start(input_ids, max_new_tokens)
        while state.steps_left:
            self.step(state)
        new = self.reveal(state.chosen)
        if new is None:
            return None
        return torch.cat([input_ids.long(), new.reshape(1, -1)], 1)

    @_no_grad()
    def start(self, input_ids: torch.Tensor | None, max_new_tokens: int) -> "Decoding":
        """Share the prompt, run the prefill and choose the first token (secret): a Decoding.
        Generation records no autograd graph (nothing of the backward is computed)."""
        from .transformer_ops import share_tokens
        from .. import comm
        if not isinstance(max_new_tokens, int) or max_new_tokens < 1:
            raise UnsupportedError(f"nn.generate: max_new_tokens must be a positive int, got {max_new_tokens!r}")
        c = comm.get()
        problem = None
        if c.rank == self.owner and (not isinstance(input_ids, torch.Tensor) or input_ids.dim() != 2
                                     or input_ids.shape[0] != 1):
            shape = tuple(input_ids.shape) if isinstance(input_ids, torch.Tensor) else type(input_ids).__name__
            problem = f"nn.generate: the prompt must be a LongTensor of shape (1, length), got {shape}"
        vocab = self._vocab()
        if problem is not None:
            try:  # the others are told at once (the announcement refuses)
                share_tokens(None, vocab, src=self.owner)
            finally:
                raise UnsupportedError(problem)
        start = self._counters()
        prompt = share_tokens(input_ids if c.rank == self.owner else None, vocab, src=self.owner)
        length = prompt.shape[-1]
        prefill = self._graph("prefill", length, None)
        mark = self._counters()
        out = prefill(prompt, torch.ones(1, length, dtype=torch.long), torch.arange(length)[None])
        state = Decoding(length, max_new_tokens, [self._next(out[0])], list(out[1:]))
        self.costs = {"share_prompt": _diff(start, mark), "prefill": _diff(mark, self._counters()), "steps": []}
        if max_new_tokens > 1:
            state.past = self._left_pad(state.past, state.slots)
            b, h, _, d = state.past[0].shape
            state.graph = self._graph("step", state.slots + 1, (len(state.past) // 2, b, h, state.slots, d))
        return state

    @_no_grad()
    def step(self, state: "Decoding") -> CrypTensor:
        """One decode step: the last chosen token against the cache; the next token's secret one-hot."""
        if not state.steps_left:
            raise UnsupportedError(f"nn.generate: the cache holds {state.slots} positions: all "
                                   f"{state.max_new_tokens} tokens are generated")
        mark = self._counters()
        valid = state.length + len(state.chosen) - 1  # positions in the cache; the new one's position
        mask = torch.zeros(1, state.slots + 1, dtype=torch.long)
        mask[:, state.slots - valid:] = 1   # the valid entries (right end) and the new token
        out = state.graph(self._tokens(state.chosen[-1]), mask, torch.tensor([[valid]]), *state.past)
        state.chosen.append(self._next(out[0]))
        state.past = [t[:, :, 1:] for t in out[1:]]  # one empty slot dropped: `slots` again
        self.costs.setdefault("steps", []).append(_diff(mark, self._counters()))
        return state.chosen[-1]

    def reveal(self, one_hots: list) -> torch.Tensor | None:
        """The ids of secret one-hots, opened to the data owner only (None on the others)."""
        from ..cryptensor import stack
        mark = self._counters()
        ids = stack([_one_hot_index(t).reshape(-1) for t in one_hots], 1)
        new = ids.get_plain_text(dst=self.owner)
        self.costs["reveal"] = _diff(mark, self._counters())
        return None if new is None else new.long()

    @staticmethod
    def _left_pad(kv: list, slots: int) -> list:
        """Each (batch, heads, L, dim) cache tensor as (batch, heads, slots, dim), valid at the right."""
        from ..cryptensor import cat
        out = []
        for t in kv:
            b, h, n, d = t.shape
            if n > slots:
                raise ProtocolError(f"nn.generate: {n} cached positions for {slots} slots")
            empty = CrypTensor._public(torch.zeros(b, h, slots - n, d), t.precision, t.dtype)
            out.append(cat([empty, t], 2) if slots > n else t)
        return out

    @staticmethod
    def _counters() -> tuple[int, int, int]:
        from .. import comm
        stats = comm.get().get_communication_stats()
        return int(stats["rounds"]), int(stats["bytes_sent"]), int(stats["bytes_received"])


class Decoding:
    """A generation in progress: the chosen tokens' secret one-hots and the secret KV cache."""

    def __init__(self, length: int, max_new_tokens: int, chosen: list, past: list) -> None:
        self.length, self.max_new_tokens = length, max_new_tokens
        self.slots = length + max_new_tokens - 2  # cache positions a decode step reads
        self.chosen, self.past, self.graph = chosen, past, None

    @property
    def steps_left(self) -> int:
        return self.max_new_tokens - len(self.chosen)

    def copy(self) -> "Decoding":
        out = Decoding(self.length, self.max_new_tokens, list(self.chosen), list(self.past))
        out.graph = self.graph
        return out


def _diff(a: tuple, b: tuple) -> dict:
    return {"rounds": b[0] - a[0], "bytes_sent": b[1] - a[1], "bytes_received": b[2] - a[2]}


def generate(model, input_ids: torch.Tensor | None, max_new_tokens: int = 8, *, owner: int,
             generator: PrivateGenerator | None = None) -> torch.Tensor | None:
    """Greedy decoding of `model` (from nn.from_pytorch(..., src=src), encrypted) on party
    `owner`'s prompt (a LongTensor (1, length); None on the other parties), with a
    secret-shared KV cache. Returns, on party `owner` only, the prompt followed by the
    max_new_tokens generated ids (like HuggingFace's generate with do_sample=False, without
    stopping at an end-of-sequence token); None on every other party. Every party must call it.
    Pass a `PrivateGenerator` to reuse its exported graphs and read its `costs`."""
    gen = generator if generator is not None else PrivateGenerator(model, owner)
    if gen.model is not model or gen.owner != owner:
        raise UnsupportedError("nn.generate: the generator was made for another model or owner")
    return gen.generate(input_ids, max_new_tokens)
