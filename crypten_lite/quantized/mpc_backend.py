"""Private execution of a quantized program: :class:`MpcBackend` and :func:`run_private`.

The model owner (``src_model``) secret-shares the integer weights and biases, the data owner
(``src_input``) its quantized input; every other party holds the program's public part
(:meth:`~crypten_lite.quantized.ir.QuantizedProgram.public_copy`). Values are int64
additive shares at scale 1 (integers, no fixed point), so:

* conv2d / linear / secret products: one round each (Beaver's under additive, a reshare under
  rss: protocol.mul), exact in the ring, no truncation;
* public multipliers, additions, pooling sums, reshapes, nearest upsampling: local;
* requantization ``round(v / 2**shift)``: :func:`crypten_lite.quantized.mpc_ops.round_shift`,
  exact rounding (not the one-round probabilistic truncation, whose result is one too large
  for about half of the values and so changes int8 outputs; docs/quantized.md has the
  measurement);
* clamps and max pooling: comparisons on the converter's ``bits`` bounds (9 to 12 bits for
  int8 values) instead of 64 (:mod:`crypten_lite.quantized.mpc_ops`).

Before running, :func:`optimize_for_mpc` moves each max pooling in front of the clamps
that precede it (``max`` commutes with any non-decreasing function, so the integers are
unchanged: the clamps then compare a quarter of the values of a 2x2 pooling) and merges
consecutive clamps. With 2 parties a requantization and its clamp run together
(:func:`crypten_lite.quantized.mpc_ops.requantize_clamp`).

What the parties learn: the public program (shapes, scales, zero points, multipliers, bit
bounds), the input's shape, and the revealed output; with ``debug=True`` every
intermediate value is revealed as well.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from typing import Any, Sequence

import torch

from crypten_lite.cryptensor import CrypTensor
from crypten_lite.errors import ProtocolError, UnsupportedError
from crypten_lite.mpc import primitives, protocol
from crypten_lite.quantized import mpc_ops
from crypten_lite.quantized.backend import Backend, Public
from crypten_lite.quantized.executor import EXECUTORS, LayerDiff, decode_output, diff_values, encode_input
from crypten_lite.quantized.ir import FIXED, Node, QuantizedProgram, Rescale, ValueInfo
from crypten_lite.session import current

# The dealer answers a request in one 4 MiB message: Beaver products are split along the
# batch so that each triple's output stays below this many elements.
MAX_TRIPLE_ELEMENTS = 3 << 17


class MpcBackend(Backend):
    """:class:`~crypten_lite.quantized.backend.Backend` on the session protocol's shares:
    int64 additive shares (any N, dealer) or replicated shares (``rss``: 3 parties, no dealer).

    ``src_model`` shares the weights (memoized by ``id``: a weight is shared once per
    backend), ``src_input`` the input. ``truncation``: ``"auto"`` (local exact rounding for
    2 parties, dealer-assisted for more, under rss the replicated exact rounding),
    ``"local"``, ``"dealer"`` (additive only) or ``"probabilistic"`` (one-round truncation,
    off by one on about half the values; for measurements).
    ``carry_bits``: low bits the rounding's carry looks at (exact for shifts up to it; see
    :func:`crypten_lite.quantized.mpc_ops.round_shift`).
    """

    def __init__(self, src_model: int = 0, src_input: int = 1, truncation: str = "auto",
                 carry_bits: int = mpc_ops.DEFAULT_CARRY_BITS):
        if truncation not in ("auto", "local", "dealer", "probabilistic"):
            raise ValueError(f"truncation must be auto, local, dealer or probabilistic, got {truncation!r}")
        s = current()
        if protocol.is_rss() and truncation in ("local", "dealer"):
            # the additive protocol's rounding methods; rss has its own exact one ("auto")
            raise UnsupportedError(
                f"truncation={truncation!r} is a method of the additive protocol; under protocol "
                "'rss' use truncation='auto' (exact rounding, no dealer) or 'probabilistic'")
        for what, src in (("src_model", src_model), ("src_input", src_input)):
            if not 0 <= src < s.world_size:
                raise ProtocolError(f"{what}={src} is out of range: ranks are 0..{s.world_size - 1}")
        self.src_model = src_model
        self.src_input = src_input
        self.truncation = truncation
        self.carry_bits = carry_bits
        self._weights: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._programs: dict[int, tuple[QuantizedProgram, QuantizedProgram]] = {}

    # --- data in and out -------------------------------------------------------------
    def input(self, x: torch.Tensor) -> torch.Tensor:
        mine = x if current().rank == self.src_input else None
        return protocol.share(mine, self.src_input, tuple(x.shape))

    def weight(self, w: torch.Tensor) -> torch.Tensor:
        hit = self._weights.get(id(w))
        if hit is not None and hit[0] is w:
            return hit[1]
        if current().rank == self.src_model and w.device.type == "meta":
            raise ProtocolError(f"party {self.src_model} is the model owner but holds no weights "
                                f"(meta tensor of shape {tuple(w.shape)})")
        mine = w if current().rank == self.src_model else None
        if mine is None:  # a shape from the owner's description: bounded before allocating
            primitives.check_share_size(tuple(w.shape), self.src_model, "int8 weight")
        share = protocol.share(mine, self.src_model, tuple(w.shape))
        self._weights[id(w)] = (w, share)
        return share

    def reveal(self, x: torch.Tensor) -> torch.Tensor:
        return protocol.open_(x)

    def shape(self, x: torch.Tensor) -> torch.Size:
        return x.shape

    # --- local linear operations ----------------------------------------------------
    def add(self, x, y):
        return x + y

    def sub(self, x, y):
        return x - y

    def add_public(self, x, c: Public):
        return x + mpc_ops.public_share(c, x)

    def mul_public(self, x, c: Public):
        return x * torch.as_tensor(c, dtype=torch.int64)

    # --- multiplications ------------------------------------------------------------
    def mul(self, x, y):
        return _batched_beaver("mul", x, y, ())

    def matmul(self, x, w):
        return _batched_beaver("matmul", x, w, ())

    def conv2d(self, x, w, stride, padding, dilation, groups):
        params = (*stride, *padding, *dilation, groups)
        return _batched_beaver("conv2d", x, w, params)

    # --- truncation and comparisons -------------------------------------------------
    def truncate(self, x, shift: int, bits: int, rounding: str):
        method = "probabilistic" if self.truncation == "probabilistic" else self.truncation
        return mpc_ops.round_shift(x, shift, bits, rounding, self.carry_bits, method)

    def rescale(self, v, rs: Rescale, bias=None):
        """Requantization; with 2 parties the rounding and the clamp run together
        (:func:`crypten_lite.quantized.mpc_ops.requantize_clamp`: 4 rounds fewer)."""
        fuse = self.truncation in ("auto", "local") and mpc_ops.can_fuse(
            rs.shift, rs.rounding, rs.lo, rs.hi, rs.in_bits, rs.out_bits)
        if not fuse:
            return super().rescale(v, rs, bias)
        if rs.pre_shift:
            v = self.truncate(v, rs.pre_shift, rs.pre_bits, "half_up")
        if not (isinstance(rs.multiplier, int) and rs.multiplier == 1):
            v = self.mul_public(v, rs.multiplier)
        if bias is not None:
            v = self.add(v, bias)
        return mpc_ops.requantize_clamp(v, rs.shift, rs.offset, rs.lo, rs.hi, rs.out_bits, self.carry_bits)

    def clamp(self, x, lo, hi, bits: int):
        return mpc_ops.clamp(x, lo, hi, bits)

    def max_pool2d(self, x, kernel_size, stride, padding, dilation, ceil_mode, bits):
        return mpc_ops.max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode, bits)

    # --- local data movement --------------------------------------------------------
    def sum_pool2d(self, x, kernel_size, stride, padding, ceil_mode):
        return mpc_ops.sum_pool2d(x, kernel_size, stride, padding, ceil_mode)

    def cat(self, xs: Sequence[torch.Tensor], dim: int):
        return torch.cat(list(xs), dim)

    def reshape(self, x, shape):
        return x.reshape(list(shape))

    def permute(self, x, dims):
        return x.permute(list(dims))

    def index_select(self, x, dim: int, index: torch.Tensor):
        return torch.index_select(x, dim, index)

    # --- programs -------------------------------------------------------------------
    def prepare(self, program: QuantizedProgram, optimize: bool = True) -> QuantizedProgram:
        """What this party runs: its copy of the program (public part only unless it is the
        model owner), checked against the model owner's public part, optimized for MPC.

        Cached per program object, so that weights keep their identity across runs (every
        party memoizes the same weights, keeping the parties' sharing in step).
        """
        hit = self._programs.get(id(program))
        if hit is not None and hit[0] is program:
            return hit[1]
        mine = program if current().rank == self.src_model else program.public_copy()
        check_same_program(mine, self.src_model)
        prepared = optimize_for_mpc(mine) if optimize else mine
        self._programs[id(program)] = (program, prepared)
        return prepared


def _batched_beaver(op: str, x: torch.Tensor, y: torch.Tensor, params: Sequence[int]) -> torch.Tensor:
    """Beaver product (one round), split along the batch (dim 0) when the triple is large.

    conv2d / matmul: ``y`` is a weight used by every chunk; mul: both operands are split
    when they have the same shape.
    """
    numel = math.prod(_product_shape(op, x.shape, y.shape, params))
    split_y = op == "mul" and x.shape == y.shape
    if numel <= MAX_TRIPLE_ELEMENTS or x.dim() < 2 or x.shape[0] < 2 or (op == "mul" and not split_y):
        return protocol.mul(op, x, y, params)
    rows = max(1, MAX_TRIPLE_ELEMENTS * x.shape[0] // numel)
    parts = [protocol.mul(op, x[i:i + rows], y[i:i + rows] if split_y else y, params)
             for i in range(0, x.shape[0], rows)]
    return torch.cat(parts)


def _product_shape(op: str, a, b, params) -> tuple[int, ...]:
    from crypten_lite.provider.correlations import triple_shape

    return triple_shape(op, a, b, params)


# ---------------------------------------------------------------------- program checks
def _canonical(v: Any) -> Any:
    """A hashable, exact description of a public attribute (tensors by value)."""
    if isinstance(v, torch.Tensor):
        values = None if v.device.type == "meta" else tuple(v.flatten().tolist())
        return ("tensor", str(v.dtype), tuple(v.shape), values)
    if dataclasses.is_dataclass(v) and not isinstance(v, type):
        return (type(v).__name__,) + tuple((f.name, _canonical(getattr(v, f.name))) for f in dataclasses.fields(v))
    if isinstance(v, dict):
        return tuple(sorted((str(k), _canonical(x)) for k, x in v.items()))
    if isinstance(v, (list, tuple)):
        return tuple(_canonical(x) for x in v)
    if isinstance(v, float):
        return float.hex(v)
    return v


def public_digest(program: QuantizedProgram) -> bytes:
    """SHA-256 of everything public in the program (nodes, attributes, bounds, weight shapes)."""
    parts = [(n.op, n.name, n.inputs, _canonical(n.out), _canonical(n.attrs),
              tuple((k, tuple(w.shape)) for k, w in n.weights.items())) for n in program.nodes]
    return hashlib.sha256(repr((parts, program.output)).encode()).digest()


def check_same_program(program: QuantizedProgram, src_model: int) -> None:
    """Every party must run the model owner's public program: one all-gather of digests.

    Bounds and bit widths are derived from the weights, so a party that converted a model
    with other weights would run different protocols; every party fails here instead.
    """
    s = current()
    mine = torch.frombuffer(bytearray(public_digest(program)), dtype=torch.int64)
    digests = s.comm.all_gather(mine)
    differ = [r for r, d in enumerate(digests) if not torch.equal(d, digests[src_model])]
    if differ:
        raise ProtocolError(
            f"the quantized programs of parties {differ} differ from the model owner's (party "
            f"{src_model}): shapes, scales, zero points or bounds disagree; every party must "
            "convert the same model (or run the owner's program.public_copy())")


def save_public_program(program: QuantizedProgram, f) -> None:
    """Write what the other parties need (``program.public_copy()``: no weight values) to ``f``.

    The model owner publishes this file; :func:`load_public_program` reads it without
    unpickling anything but the program's own classes and tensors.
    """
    torch.save(program.public_copy(), f)


def load_public_program(f) -> QuantizedProgram:
    """Read a program written by :func:`save_public_program` (``torch.load(weights_only=True)``)."""
    from crypten_lite.quantized.ir import Divide

    with torch.serialization.safe_globals([QuantizedProgram, Node, ValueInfo, Rescale, Divide]):
        program = torch.load(f, weights_only=True)
    if not isinstance(program, QuantizedProgram):
        raise ProtocolError(f"{f!r} holds a {type(program).__name__}, not a QuantizedProgram")
    return program


# ---------------------------------------------------------------------- MPC rewrite
def _users(program: QuantizedProgram) -> dict[str, int]:
    count = {n.name: 0 for n in program.nodes}
    for node in program.nodes:
        for name in node.inputs:
            count[name] += 1
    count[program.output] += 1
    return count


def _merge_clamp(lo, hi, c_lo, c_hi):
    """clamp(clamp(y, lo, hi), c_lo, c_hi) as one clamp; None if the intervals are disjoint."""
    new_lo = c_lo if lo is None else (lo if c_lo is None else max(lo, c_lo))
    new_hi = c_hi if hi is None else (hi if c_hi is None else min(hi, c_hi))
    if (lo is not None and c_hi is not None and c_hi < lo) or (hi is not None and c_lo is not None and c_lo > hi):
        return None
    return new_lo, new_hi


def pool_before_clamp(program: QuantizedProgram) -> QuantizedProgram:
    """Move every ``max_pool2d`` in front of the clamps before it; merge those clamps.

    ``producer (rescale with clamp) -> clamp* -> max_pool2d`` becomes
    ``producer (no clamp) -> max_pool2d -> clamp``: ``max`` commutes with the
    non-decreasing clamp, so the integers are the same (PlainBackend checks it in the tests),
    and a 2x2 pooling leaves a quarter of the values to clamp. Values that no longer exist
    leave ``program.sources``.
    """
    nodes = list(program.nodes)
    for pool in list(nodes):
        if pool.op != "max_pool2d":
            continue
        users = _users(QuantizedProgram(nodes, program.output))
        by_name = {n.name: n for n in nodes}
        clamps = []
        cur = by_name[pool.inputs[0]]
        while cur.op == "clamp" and users[cur.name] == 1:
            clamps.append(cur)
            cur = by_name[cur.inputs[0]]
        rescale = cur.attrs.get("rescale") if users[cur.name] == 1 else None
        absorb = isinstance(rescale, Rescale) and (rescale.lo is not None or rescale.hi is not None)
        if not clamps and not absorb:
            continue
        lo = hi = None
        if absorb:
            lo, hi = rescale.lo, rescale.hi
        merged = (lo, hi)
        for c in reversed(clamps):
            merged = _merge_clamp(merged[0], merged[1], c.attrs["lo"], c.attrs["hi"]) if merged else None
        if merged is None:
            continue
        if absorb:
            bits = rescale.out_bits
            raw_info = cur.out.with_bounds(-(1 << bits), (1 << bits) - 1)
            attrs = dict(cur.attrs, rescale=dataclasses.replace(rescale, lo=None, hi=None))
            source_node = dataclasses.replace(cur, attrs=attrs, out=raw_info)
        else:
            source_node = cur
            raw_info = cur.out
            bits = cur.out.bits
        pooled_info = pool.out.with_bounds(raw_info.lo, raw_info.hi)
        raw_pool = dataclasses.replace(pool, name=f"{pool.name}__raw", inputs=(source_node.name,),
                                       attrs=dict(pool.attrs, bits=bits), out=pooled_info)
        clamp = Node("clamp", pool.name, (raw_pool.name,), pool.out,
                     dict(lo=merged[0], hi=merged[1], bits=bits), source=pool.source)
        removed = {c.name for c in clamps}
        rebuilt = []
        for n in nodes:
            if n.name in removed:
                continue
            if n.name == source_node.name:
                rebuilt.append(source_node)
            elif n.name == pool.name:
                rebuilt += [raw_pool, clamp]
            else:
                rebuilt.append(n)
        nodes = rebuilt
        stale = removed | ({source_node.name} if absorb else set())
        program = QuantizedProgram(nodes, program.output,
                                   {k: v for k, v in program.sources.items() if v[0] not in stale})
    return program


def merge_clamps(program: QuantizedProgram) -> QuantizedProgram:
    """Fold each clamp node into the clamp of the value it reads (a rescale's clamp or another
    clamp node) when nothing else reads that value: one comparison round trip instead of two.

    ``clamp(clamp(y, a, b), c, d) == clamp(y, max(a, c), min(b, d))`` when the intervals
    overlap (eager ``conv -> ReLU`` modules left unfused, PT2E float ReLUs).
    """
    nodes = list(program.nodes)
    sources = dict(program.sources)
    merged_one = True
    while merged_one:
        merged_one = False
        users = _users(QuantizedProgram(nodes, program.output))
        by_name = {n.name: n for n in nodes}
        for clamp in nodes:
            if clamp.op != "clamp":
                continue
            prod = by_name[clamp.inputs[0]]
            rescale = prod.attrs.get("rescale")
            if users[prod.name] != 1 or not (prod.op == "clamp" or isinstance(rescale, Rescale)):
                continue
            old = (prod.attrs["lo"], prod.attrs["hi"]) if prod.op == "clamp" else (rescale.lo, rescale.hi)
            bounds = _merge_clamp(old[0], old[1], clamp.attrs["lo"], clamp.attrs["hi"])
            if bounds is None:
                continue
            if prod.op == "clamp":
                attrs = dict(prod.attrs, lo=bounds[0], hi=bounds[1])
            else:
                attrs = dict(prod.attrs, rescale=dataclasses.replace(rescale, lo=bounds[0], hi=bounds[1]))
            new = dataclasses.replace(prod, name=clamp.name, out=clamp.out, attrs=attrs, source=clamp.source)
            nodes = [new if n.name == prod.name else n for n in nodes if n.name != clamp.name]
            sources = {k: v for k, v in sources.items() if v[0] != prod.name}
            merged_one = True
            break
    return QuantizedProgram(nodes, program.output, sources)


def optimize_for_mpc(program: QuantizedProgram) -> QuantizedProgram:
    """:func:`pool_before_clamp`, then :func:`merge_clamps`: the same integers, fewer comparisons."""
    return merge_clamps(pool_before_clamp(program))


# ---------------------------------------------------------------------- running
def execute(program: QuantizedProgram, first: torch.Tensor, backend: Backend) -> dict[str, Any]:
    """Run the program's nodes after its input, whose backend value is ``first``."""
    values: dict[str, Any] = {program.input.name: first}
    for node in program.nodes[1:]:
        args = [values[name] for name in node.inputs]
        weights = {key: backend.weight(w) for key, w in node.weights.items()}
        values[node.name] = EXECUTORS[node.op](backend, node, args, weights)
    return values


def _input_value(node: Node, x, backend: MpcBackend, clamp_input: bool = False) -> torch.Tensor:
    """Shares of the encoded input: shared by the data owner, or quantized in MPC.

    The owner encodes (and range-checks) its input while it is still plaintext, before
    anything is sent: an input outside the program's range is refused in the shape
    announcement, so every party raises ProtocolError (no extra byte)."""
    if isinstance(x, CrypTensor):
        from crypten_lite.quantized.tensor import encode_private_input

        return encode_private_input(node, x)
    s = current()
    owner = s.rank == backend.src_input
    encoded, refuse = None, ""
    if owner and not isinstance(x, torch.Tensor):
        # refused through the announcement (below), so the other parties do not wait for it
        x, refuse = torch.empty(0), f"party {s.rank} is the data owner (src_input) but passed no input tensor"
    elif owner:
        try:
            encoded = encode_input(node, x, clamp_input)
        except ProtocolError as e:
            refuse = str(e)
    shape, _ = primitives.announce(x if owner else None, backend.src_input, refuse)
    if x is not None and not owner and tuple(x.shape) != shape:
        # the owner goes on sharing its input: take our share too, so the streams stay in step
        backend.input(torch.empty(shape, dtype=torch.int64, device="meta"))
        raise ProtocolError(f"party {s.rank} passed an input of shape {tuple(x.shape)}; the data owner's is {shape}")
    if not owner:
        encoded = torch.empty(shape, dtype=torch.int64, device="meta")
    return backend.input(encoded)


def _as_program(program_or_model, x, dummy_input) -> tuple[QuantizedProgram, torch.nn.Module | None]:
    if isinstance(program_or_model, QuantizedProgram):
        return program_or_model, None
    if not isinstance(program_or_model, torch.nn.Module):
        raise TypeError(f"run_private takes a QuantizedProgram or a quantized torch model, "
                        f"got {type(program_or_model).__name__}")
    from crypten_lite.quantized.convert import from_quantized

    if dummy_input is None:
        if isinstance(x, CrypTensor):
            dummy_input = torch.zeros(tuple(x.shape))
        elif isinstance(x, torch.Tensor):
            dummy_input = torch.zeros_like(x, dtype=torch.float32)
        else:
            raise UnsupportedError("run_private on a torch model needs dummy_input on parties "
                                   "that pass no input (it fixes the traced shapes)")
    return from_quantized(program_or_model, dummy_input), program_or_model


def output_value(info: ValueInfo, share: torch.Tensor):
    """The secret output as a QuantizedCrypTensor (int8 output) or a float CrypTensor (fixed)."""
    if info.kind == FIXED:
        return CrypTensor(share, info.frac_bits, torch.float32)
    from crypten_lite.quantized.tensor import QuantizedCrypTensor, dtype_for_range

    ints = CrypTensor(share, 0, torch.int64)
    return QuantizedCrypTensor(ints, info.scale, info.zero_point, dtype_for_range(info.lo, info.hi))


def run_private(program_or_model, x=None, src_model: int = 0, src_input: int = 1, debug: bool = False, *,
                reveal: bool = True, dummy_input: torch.Tensor | None = None, backend: MpcBackend | None = None,
                reference: torch.nn.Module | None = None, optimize: bool = True, clamp_input: bool = False,
                **backend_options):
    """Run a quantized model privately: the model owner's weights, the data owner's input.

    ``program_or_model``: a :class:`~crypten_lite.quantized.ir.QuantizedProgram` or a torch
    quantized model (eager, FX or PT2E; converted on every party with ``from_quantized``,
    the same model everywhere: only the model owner's weights are used, the others' public
    parts are checked against it). ``x``: the data owner's float tensor (others pass None or
    a tensor of the same shape, which is ignored), or a CrypTensor that every party holds
    (quantized in MPC, :func:`crypten_lite.quantized.tensor.quantize_per_tensor`).
    A float input outside the program's range (``|x| < 256`` for a float-input program,
    :func:`~crypten_lite.quantized.executor.input_range`) raises ProtocolError on every party;
    ``clamp_input=True`` clamps it into the range instead (the data owner's plaintext).

    Returns what the torch model returns (float, revealed to every party), or with
    ``reveal=False`` the secret output (:class:`QuantizedCrypTensor`, or a float CrypTensor
    for a float output). ``debug=True`` reveals every intermediate value and returns
    ``(output, layers)``: one :class:`~crypten_lite.quantized.executor.LayerDiff` per torch
    graph value the program holds, against ``reference`` (default: the torch model passed)
    on the revealed input; ``layers`` is empty without a torch model.
    """
    program, model = _as_program(program_or_model, x, dummy_input)  # fails before any message
    s = current()
    backend = backend or MpcBackend(src_model, src_input, **backend_options)
    prepared = backend.prepare(program, optimize)
    first = _input_value(prepared.input, x, backend, clamp_input)
    values = execute(prepared, first, backend)
    out = values[prepared.output]
    info = prepared.output_info
    result = decode_output(info, backend.reveal(out)) if reveal else output_value(info, out)
    if not debug:
        return result
    names = [n.name for n in prepared.nodes]
    opened = dict(zip(names, protocol.open_many([values[n] for n in names])))
    reference = reference if reference is not None else model
    layers = layer_report(prepared, reference, opened, x if s.rank == backend.src_input else None)
    return result, layers


def layer_report(program: QuantizedProgram, model: torch.nn.Module | None, opened: dict[str, torch.Tensor],
                 x: torch.Tensor | None = None) -> list[LayerDiff]:
    """Agreement of revealed program values with the torch model's values, layer by layer.

    ``x``: the float input; without it the torch model runs on the revealed input
    (dequantized), which torch quantizes back to the same integers.
    """
    if model is None:
        return []
    from crypten_lite.quantized.convert import record, trace

    if not isinstance(x, torch.Tensor) or x.device.type == "meta":
        x = program.input.out.to_real(opened[program.input.name]).to(torch.float32)
    gm = trace(model)
    samples = record(gm, x)
    rows = []
    for node in gm.graph.nodes:
        if node.op == "placeholder" or node.name not in program.sources:
            continue
        name, info = program.sources[node.name]
        if name in opened:
            rows.append(diff_values(node.name, info, opened[name], samples[node]))
    return rows


__all__ = ["MpcBackend", "check_same_program", "execute", "layer_report", "load_public_program",
           "merge_clamps", "optimize_for_mpc", "output_value", "pool_before_clamp", "public_digest", "run_private", "save_public_program"]
