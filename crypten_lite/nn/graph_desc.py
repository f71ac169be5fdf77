"""Model descriptions: what a model owner sends so that the other parties run its model.

`crypten_lite.nn.from_pytorch(model if rank == src else None, dummy, src=src)` converts the
model on party `src`, describes the result here and broadcasts the description over the
session; every other party rebuilds the same crypten_lite model from it, without the
model's Python class and without any file.

What a description holds (all of it is revealed to every party):

* float models (`GraphModule`): every layer (type from `LAYERS`, constructor arguments such
  as kernel sizes, strides, eps), every graph node (op from the converter tables
  `FUNCTIONS` / `METHODS` / the aten table of crypten_lite.nn.from_pytorch) with its
  constant arguments, and the name, dtype and shape of every parameter and buffer;
* int8 models (`QuantizedProgram`): every node (op from `crypten_lite.quantized.ir.OPS`)
  with its public attributes (scales, zero points, multipliers, shifts, clamp and bit
  bounds, index tensors) and the shape of every weight.

What it never holds: the values of floating parameters and buffers (float models) and of
the integer weights and biases (int8 models). They stay with the owner until it shares
them with `encrypt(src=...)`; the other parties hold meta-tensor placeholders of the right
shape. Integer buffers of float models (BatchNorm's `num_batches_tracked`) are public
constants, as `Module.encrypt` leaves them public.

Format: `MAGIC` (8 bytes) | length of the JSON part (8 bytes, little endian) | JSON (UTF-8)
| raw tensor bytes. The JSON part has a `tensors` table (dtype, shape, and for public tensors
the byte count; their bytes follow one after the other) and the model. Every value is a
JSON number, string, bool, null or list, or a one-key object whose key is a tag from a fixed
set (`t` tuple, `node`, `tensor`, `slice`, `const`, `dict`, `rescale`, `divide`,
`ellipsis`). Reading never unpickles, evaluates or imports anything: every name (layer type,
op, torch constant) is looked up in a table of this package, an unknown one is an error
naming it, and every size is bounded.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
import struct
from typing import Any

import torch

from ..errors import ProtocolError, UnsupportedError

MAGIC = b"CLMODEL1"
FORMAT_VERSION = 1
MAX_DESCRIPTION_BYTES = 64 << 20   # a description carries no weights: a few KB to a few MB
MAX_NODES = 100_000
MAX_TENSORS = 100_000
MAX_DEPTH = 32                     # nesting of argument values
MAX_DIMS = 8
MAX_ELEMENTS = 1 << 31             # per tensor, whatever the session's limits (below)
# A secret tensor becomes a share of 8 bytes per element (16 under rss) on every party: each
# is bounded by the session's max_message_bytes, and all of one description together by its
# max_model_bytes, before any is allocated (_Reader._tensors; the int8 weights' shares too).
MAX_STRING = 4096

DTYPES: dict[str, torch.dtype] = {str(d).removeprefix("torch."): d for d in (
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
    torch.int16, torch.int8, torch.uint8, torch.bool)}

# torch constants that appear in graph arguments (dtype=..., memory_format=..., layout=...,
# device=... in exported HF models: the CPU is the only device a receiver ever rebuilds)
CONSTANTS: dict[str, Any] = {str(c): c for c in (
    *DTYPES.values(), torch.contiguous_format, torch.preserve_format, torch.channels_last,
    torch.strided, torch.device("cpu"))}

_PART = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,199}")  # module names (torchvision's RegNet: "block1-0")
NODE_OPS = ("placeholder", "get_attr", "call_module", "call_function", "call_method", "output")


class DescriptionError(ProtocolError):
    """A model description that is malformed, oversized or names something unknown."""


# ---------------------------------------------------------------------- writing
class _Writer:
    """Collects the tensors table and the raw bytes while a model is described."""

    def __init__(self) -> None:
        self.tensors: list[dict] = []
        self.blob: list[bytes] = []

    def tensor(self, t: torch.Tensor, secret: bool) -> int:
        if str(t.dtype).removeprefix("torch.") not in DTYPES:
            raise UnsupportedError(f"cannot describe a tensor of dtype {t.dtype}")
        entry: dict[str, Any] = {"dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape)}
        if not secret:
            data = t.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
            entry["nbytes"] = len(data)
            self.blob.append(data)
        self.tensors.append(entry)
        return len(self.tensors) - 1

    def value(self, v: Any, nodes: bool = False) -> Any:
        """A JSON value for a plain Python value (fx nodes only where `nodes`)."""
        if v is None or isinstance(v, (bool, int, str)):
            return v
        if isinstance(v, float):
            return v if math.isfinite(v) else {"const": repr(v)}
        if isinstance(v, (list, tuple)):
            items = [self.value(x, nodes) for x in v]
            return {"t": items} if isinstance(v, tuple) and type(v) is tuple else items
        if isinstance(v, torch.fx.Node) and nodes:
            return {"node": v.name}
        if isinstance(v, slice):
            return {"slice": [self.value(v.start, nodes), self.value(v.stop, nodes), self.value(v.step, nodes)]}
        if v is Ellipsis:
            return {"ellipsis": True}
        if isinstance(v, dict):
            return {"dict": [[self.value(k), self.value(x, nodes)] for k, x in v.items()]}
        if isinstance(v, torch.Tensor):
            return {"tensor": self.tensor(v, secret=False)}
        for tag, cls in _dataclasses().items():
            if type(v) is cls:
                return {tag: {f.name: self.value(getattr(v, f.name)) for f in dataclasses.fields(v)}}
        try:
            if str(v) in CONSTANTS and CONSTANTS[str(v)] == v:
                return {"const": str(v)}
        except Exception:  # objects whose comparison with a dtype raises
            pass
        raise UnsupportedError(f"cannot describe a value of type {type(v).__name__} ({v!r:.80}) in a "
                               "model description; only numbers, strings, tuples, lists, slices, "
                               "dtypes and tensors are sent")

    def encode(self, kind: str, body: dict) -> bytes:
        doc = {"format": "crypten_lite.model", "version": FORMAT_VERSION, "kind": kind,
               "tensors": self.tensors, **body}
        text = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()
        out = MAGIC + struct.pack("<Q", len(text)) + text + b"".join(self.blob)
        if len(out) > MAX_DESCRIPTION_BYTES:
            raise UnsupportedError(f"the model description has {len(out)} bytes, more than "
                                   f"{MAX_DESCRIPTION_BYTES}")
        return out


def _dataclasses() -> dict[str, type]:
    from ..quantized.ir import Divide, Rescale  # int8 attributes; loaded only when used

    return {"rescale": Rescale, "divide": Divide}


# ---------------------------------------------------------------------- reading
def _fail(msg: str) -> DescriptionError:
    return DescriptionError(f"model description: {msg}")


class _Reader:
    """Parses and validates the envelope and the tensors; decodes values."""

    def __init__(self, data: bytes) -> None:
        if not isinstance(data, (bytes, bytearray)):
            raise _fail(f"expected bytes, got {type(data).__name__}")
        if len(data) > MAX_DESCRIPTION_BYTES:
            raise _fail(f"{len(data)} bytes exceed the limit of {MAX_DESCRIPTION_BYTES}")
        if len(data) < 16 or data[:8] != MAGIC:
            raise _fail("not a crypten_lite model description (bad magic)")
        (n,) = struct.unpack("<Q", data[8:16])
        if n > len(data) - 16:
            raise _fail(f"JSON part of {n} bytes does not fit in {len(data) - 16} bytes")
        try:
            doc = json.loads(bytes(data[16:16 + n]).decode("utf-8"), parse_constant=_no_constant)
        except DescriptionError:
            raise
        except (ValueError, RecursionError) as e:  # bad UTF-8 / JSON / huge integer literals
            raise _fail(f"the JSON part does not parse ({str(e)[:200]})") from e
        self.doc = _obj(doc, "description")
        if self.doc.get("format") != "crypten_lite.model" or self.doc.get("version") != FORMAT_VERSION:
            raise _fail(f"format {self.doc.get('format')!r} version {self.doc.get('version')!r} is not "
                        f"crypten_lite.model version {FORMAT_VERSION}")
        self.tensors = self._tensors(self.doc.get("tensors"), memoryview(data)[16 + n:])

    def _tensors(self, entries: Any, blob: memoryview) -> list[torch.Tensor]:
        from .. import config

        entries = _list(entries, "tensors", MAX_TENSORS)
        cfg = config.get()
        per_element = 16 if cfg.protocol == "rss" else 8
        out, offset, secret_bytes = [], 0, 0
        for i, e in enumerate(entries):
            e = _obj(e, f"tensor {i}")
            extra = set(e) - {"dtype", "shape", "nbytes"}
            if extra:
                raise _fail(f"tensor {i} has unknown fields {sorted(extra)}")
            dtype = DTYPES.get(e.get("dtype")) if isinstance(e.get("dtype"), str) else None
            if dtype is None:
                raise _fail(f"tensor {i} has unknown dtype {e.get('dtype')!r}; known: {sorted(DTYPES)}")
            shape = _shape(e.get("shape"), f"tensor {i}")
            numel = math.prod(shape)
            if "nbytes" not in e:  # a secret: the owner shares it with encrypt(src=...)
                share = numel * per_element
                if share > cfg.max_message_bytes:
                    raise _fail(f"secret tensor {i} of shape {shape} would take {share} bytes of "
                                f"shares, more than the session's limit of {cfg.max_message_bytes} "
                                "(CRYPTEN_LITE_MAX_MESSAGE_BYTES)")
                secret_bytes += numel * 8
                if secret_bytes > cfg.max_model_bytes:
                    raise _fail(f"its secret tensors up to tensor {i} take more than the session's "
                                f"limit of {cfg.max_model_bytes} bytes of shares per model "
                                "(CRYPTEN_LITE_MAX_MODEL_BYTES); raise it on every party for a "
                                "model that large")
                out.append(torch.empty(shape, dtype=dtype, device="meta"))
                continue
            nbytes = e["nbytes"]
            expected = numel * torch.empty((), dtype=dtype).element_size()
            if not _is_int(nbytes) or nbytes != expected:
                raise _fail(f"tensor {i} ({e['dtype']} {shape}) declares {nbytes!r} bytes, its shape "
                            f"needs {expected}")
            if offset + nbytes > len(blob):
                raise _fail(f"tensor {i} needs bytes {offset}..{offset + nbytes} but only {len(blob)} "
                            "follow the JSON part (wrong byte length)")
            raw = bytearray(blob[offset:offset + nbytes])
            t = (torch.frombuffer(raw, dtype=torch.uint8) if nbytes else torch.empty(0, dtype=torch.uint8))
            out.append(t.view(dtype).reshape(shape).clone())
            offset += nbytes
        if offset != len(blob):
            raise _fail(f"{len(blob) - offset} bytes after the last tensor (wrong byte length)")
        return out

    def value(self, v: Any, nodes: dict | None = None, depth: int = 0) -> Any:
        """The Python value of a JSON value (fx nodes resolved through `nodes`)."""
        if depth > MAX_DEPTH:
            raise _fail(f"values nested deeper than {MAX_DEPTH}")
        if v is None or isinstance(v, (bool, int, float)):
            return v
        if isinstance(v, str):
            if len(v) > MAX_STRING:
                raise _fail(f"a string of {len(v)} characters (limit {MAX_STRING})")
            return v
        if isinstance(v, list):
            return [self.value(x, nodes, depth + 1) for x in v]
        if not isinstance(v, dict) or len(v) != 1:
            raise _fail(f"a value must be a JSON scalar, a list or a one-key object, got {str(v)[:80]}")
        (tag, x), = v.items()
        if tag == "t":
            return tuple(self.value(y, nodes, depth + 1) for y in _list(x, "tuple", None))
        if tag == "node":
            if nodes is None or not isinstance(x, str) or x not in nodes:
                raise _fail(f"argument refers to {str(x)[:80]!r}, which is not an earlier node")
            return nodes[x]
        if tag == "tensor":
            if not _is_int(x) or not 0 <= x < len(self.tensors):
                raise _fail(f"tensor index {str(x)[:40]} out of range ({len(self.tensors)} tensors)")
            t = self.tensors[x]
            if t.device.type == "meta":
                raise _fail(f"tensor {x} is a secret placeholder where a public constant is needed")
            return t
        if tag == "slice":
            parts = _list(x, "slice", 3)
            if len(parts) != 3:
                raise _fail("a slice has 3 parts")
            return slice(*(self.value(p, nodes, depth + 1) for p in parts))
        if tag == "ellipsis":
            return Ellipsis
        if tag == "const":
            if x in ("inf", "-inf", "nan"):
                return float(x)
            if not isinstance(x, str) or x not in CONSTANTS:
                raise _fail(f"unknown constant {str(x)[:80]!r}; known: {sorted(CONSTANTS)}")
            return CONSTANTS[x]
        if tag == "dict":
            pairs = _list(x, "dict", None)
            out = {}
            for p in pairs:
                p = _list(p, "dict item", 2)
                if len(p) != 2 or not isinstance(p[0], (str, int)):
                    raise _fail("a dict item is [str or int key, value]")
                out[p[0]] = self.value(p[1], nodes, depth + 1)
            return out
        if tag in ("rescale", "divide"):
            cls = _dataclasses()[tag]
            fields = _obj(x, tag)
            names = [f.name for f in dataclasses.fields(cls)]
            if set(fields) - set(names) or set(names) - set(fields):
                raise _fail(f"{tag} has fields {sorted(fields)}, expected {sorted(names)}")
            values = {k: self.value(fields[k], None, depth + 1) for k in names}
            for k, val in values.items():
                if not (val is None or _is_int(val) or isinstance(val, (str, torch.Tensor))):
                    raise _fail(f"{tag}.{k} must be an integer, a tensor or null, got {str(val)[:80]}")
            if tag == "rescale":
                from ..quantized.ir import ROUNDINGS

                if values["rounding"] not in ROUNDINGS:
                    raise _fail(f"rescale rounding {str(values['rounding'])[:40]!r} is not one of {ROUNDINGS}")
            return cls(**values)
        raise _fail(f"unknown value tag {str(tag)[:80]!r}")


def _no_constant(name: str):
    raise _fail(f"JSON constant {name} is not allowed (non-finite floats travel as const)")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _obj(v: Any, what: str) -> dict:
    if not isinstance(v, dict):
        raise _fail(f"{what} must be a JSON object, got {type(v).__name__}")
    return v


def _list(v: Any, what: str, limit: int | None) -> list:
    if not isinstance(v, list):
        raise _fail(f"{what} must be a JSON list, got {type(v).__name__}")
    if limit is not None and len(v) > limit:
        raise _fail(f"{what} has {len(v)} entries (limit {limit})")
    return v


def _str(v: Any, what: str, limit: int = MAX_STRING) -> str:
    if not isinstance(v, str) or len(v) > limit:
        raise _fail(f"{what} must be a string of at most {limit} characters, got {str(v)[:80]!r}")
    return v


def _shape(v: Any, what: str) -> tuple[int, ...]:
    dims = _list(v, f"{what} shape", MAX_DIMS)
    if not all(_is_int(d) and 0 <= d <= MAX_ELEMENTS for d in dims):
        raise _fail(f"{what} has an invalid shape {str(dims)[:80]}")
    if math.prod(dims) > MAX_ELEMENTS:
        raise _fail(f"{what} of shape {tuple(dims)} has more than {MAX_ELEMENTS} elements")
    return tuple(dims)


def _path(v: Any, what: str) -> str:
    """A dotted module / parameter path: parts of letters, digits, '_' and '-' (not first), none
    starting with '__'."""
    v = _str(v, what, 1000)
    parts = v.split(".")
    if not all(_PART.fullmatch(p) and not p.startswith("__") for p in parts):
        raise _fail(f"{what} {v[:80]!r} is not a dotted path of names")
    return v


def read(data: bytes) -> tuple[str, _Reader]:
    """Validate the envelope: the description's kind ("graph" or "quantized") and a reader."""
    reader = _Reader(data)
    kind = reader.doc.get("kind")
    if kind not in ("graph", "quantized"):
        raise _fail(f"unknown model kind {str(kind)[:40]!r}; known: graph, quantized")
    return kind, reader


# ---------------------------------------------------------------------- over the session
def broadcast(payload: bytes | None, src: int) -> bytes:
    """`src`'s description at every party: its size (8 bytes), then its bytes (one round).

    `payload=None` on `src` tells the others that the owner failed (it raises its own error).
    """
    from ..session import current

    s = current()
    if not 0 <= src < s.world_size:
        raise ProtocolError(f"src={src} is out of range: ranks are 0..{s.world_size - 1}")
    mine = s.rank == src
    size = torch.tensor([-1 if payload is None else len(payload)], dtype=torch.int64) if mine else None
    # The size is a one-way announcement of public metadata, like primitives.announce.
    size = s.comm.broadcast(size, src, rounds=0)
    if size.dtype != torch.int64 or tuple(size.shape) != (1,):
        raise _fail(f"party {src} announced a size of dtype {size.dtype} shape {tuple(size.shape)}")
    n = int(size[0])
    if n == -1:
        raise ProtocolError(f"party {src} could not convert its model (its own error says why); "
                            "no model description was sent")
    if not 0 < n <= MAX_DESCRIPTION_BYTES:
        raise _fail(f"party {src} announced {n} bytes (limit {MAX_DESCRIPTION_BYTES})")
    data = torch.frombuffer(bytearray(payload), dtype=torch.uint8) if mine else None
    data = s.comm.broadcast(data, src)
    if data.dtype != torch.uint8 or tuple(data.shape) != (n,):
        raise _fail(f"party {src} announced {n} bytes but sent a {data.dtype} tensor of shape "
                    f"{tuple(data.shape)}")
    return payload if mine else data.numpy().tobytes()


# ---------------------------------------------------------------------- float models
def _fp():
    """The module crypten_lite.nn.from_pytorch (the package exports a function of that name)."""
    import importlib

    return importlib.import_module(".from_pytorch", __package__)


def layer_types() -> dict[str, type]:
    """Layer classes a description may name: those the converters of `CONVERTERS` build."""
    fp = _fp()
    from .module import Module

    out: dict[str, type] = {"Module": Module}
    for convert in fp.CONVERTERS.values():
        cls = getattr(convert, "__self__", None)
        if isinstance(cls, type) and issubclass(cls, Module):
            out[cls.__name__] = cls
    return out


def function_names(source: str) -> dict[str, Any]:
    """Name -> call_function target for a graph of `source` ("fx" or "export")."""
    fp = _fp()

    targets = [*fp.FUNCTIONS, *map(fp.named_stand_in, fp.NAMED_FUNCTIONS)] if source == "fx" else [
        *fp._aten(), torch.ops.aten.batch_norm.default, torch.ops.aten.dropout.default]
    out: dict[str, Any] = {}
    for t in targets:
        name = fp._target_name(t)
        if out.setdefault(name, t) is not t:
            raise UnsupportedError(f"two {source} targets share the name {name!r}; "
                                   "they cannot be told apart in a model description")
    return out


def describe_graph(model, input_shapes: list) -> bytes:
    """The description of a converted float model (a crypten_lite.nn GraphModule)."""
    from . import layers as L
    from .module import Module

    w = _Writer()
    types = layer_types()
    modules = []
    for path, m in model.named_modules():
        if m is model:
            continue
        # export's batch_norm binding turns a container into a bare _BatchNorm: replayed on rebuild
        name = "Module" if type(m) in (Module, L._BatchNorm) else type(m).__name__
        if types.get(name) is not (Module if name == "Module" else type(m)):
            raise UnsupportedError(f"layer {path!r} of type {type(m).__name__} cannot be described: "
                                   "only layers built by crypten_lite.nn.from_pytorch.CONVERTERS can")
        args = getattr(types[name], "_args", ()) if name != "Module" else ()
        modules.append({"path": path, "type": name, "training": m.training,
                        "attrs": {a: w.value(getattr(m, a)) for a in args}})
    state = []
    for path, m in model.named_modules():
        for kind, table in (("parameter", m._parameters), ("buffer", m._buffers)):
            for name, v in table.items():
                if v is not None and not isinstance(v, torch.Tensor):
                    raise UnsupportedError(f"{path}.{name} is a {type(v).__name__}; describe the model "
                                           "before encrypt()")
                ref = None if v is None else w.tensor(v, secret=v.is_floating_point())
                state.append({"path": f"{path}.{name}" if path else name, "kind": kind, "tensor": ref})
    nodes = []
    for node in model.graph.nodes:
        target = node.target
        if node.op == "call_function":
            fp = _fp()
            target = fp._target_name(target)
        entry = {"name": node.name, "op": node.op, "target": target,
                 "args": w.value(node.args, nodes=True), "kwargs": w.value(dict(node.kwargs), nodes=True)}
        if "state_path" in node.meta:
            entry["state_path"] = node.meta["state_path"]
        nodes.append(entry)
    out_spec = None
    if model._out_spec is not None:
        from torch.utils._pytree import tree_unflatten
        spec, n_user = model._out_spec
        out_spec = {"n_user": n_user, "structure": w.value(tree_unflatten(list(range(n_user)), spec))}
    body = {"source": model.source, "training": model.training, "inputs": list(model._input_names),
            "input_shapes": input_shapes, "modules": modules, "state": state, "nodes": nodes,
            "out_spec": out_spec, "inference_only": bool(model.__dict__.get("_inference_only", False))}
    if model.__dict__.get("_tied"):  # tied weights: one shared tensor per group after encrypt
        body["tied"] = [list(g) for g in model.__dict__["_tied"]]
    return w.encode("graph", body)


def rebuild_graph(reader: _Reader, values: dict[str, torch.Tensor] | None = None):
    """The GraphModule a description describes; `values` (the owner's) fill the tensors."""
    fp = _fp()
    from .module import Module

    doc = reader.doc
    source = doc.get("source")
    if source not in ("fx", "export"):
        raise _fail(f"unknown graph source {str(source)[:40]!r}")
    out = fp.GraphModule(torch.fx.Graph(), source)
    types = layer_types()
    for i, e in enumerate(_list(doc.get("modules"), "modules", MAX_NODES)):
        e = _obj(e, f"module {i}")
        path = _path(e.get("path"), f"module {i} path")
        name = e.get("type")
        cls = types.get(name) if isinstance(name, str) else None
        if cls is None:
            raise _fail(f"module {path!r} has unknown layer type {str(name)[:80]!r}; known: {sorted(types)}")
        attrs = _obj(e.get("attrs"), f"module {path!r} attrs")
        expected = set(getattr(cls, "_args", ())) if name != "Module" else set()
        if set(attrs) != expected:
            raise _fail(f"layer {path!r} ({name}) has arguments {sorted(attrs)}, expected {sorted(expected)}")
        layer = cls.__new__(cls)
        Module.__init__(layer)
        for a, v in attrs.items():
            object.__setattr__(layer, a, reader.value(v))
        object.__setattr__(layer, "training", bool(e.get("training")))
        owner, leaf = out._path(path)
        if leaf in owner._modules:
            raise _fail(f"module {path!r} is described twice")
        owner.add_module(leaf, layer)
    placeholders = False
    for i, e in enumerate(_list(doc.get("state"), "state", MAX_TENSORS)):
        e = _obj(e, f"state {i}")
        path = _path(e.get("path"), f"state {i} path")
        ref = e.get("tensor")
        if ref is None:
            value = None
        else:
            if not _is_int(ref) or not 0 <= ref < len(reader.tensors):
                raise _fail(f"state {path!r} refers to tensor {str(ref)[:40]}, out of range")
            value = reader.tensors[ref]
            if value.device.type == "meta" and values is not None:
                if path not in values or tuple(values[path].shape) != tuple(value.shape):
                    raise _fail(f"the owner's value of {path!r} does not match its description")
                value = values[path]
            placeholders |= value.device.type == "meta"
        owner, leaf = out._path(path)
        if e.get("kind") == "parameter":
            owner.register_parameter(leaf, value)
        elif e.get("kind") == "buffer":
            owner.register_buffer(leaf, value)
        else:
            raise _fail(f"state {path!r} has unknown kind {str(e.get('kind'))[:40]!r}")
    _rebuild_nodes(reader, out, source)
    out.train(bool(doc.get("training")))
    for e in doc["modules"]:  # per-layer modes as the owner had them
        object.__setattr__(out._get(e["path"]), "training", bool(e.get("training")))
    object.__setattr__(out, "_architecture_only", placeholders)
    object.__setattr__(out, "_inference_only", doc.get("inference_only") is True)
    object.__setattr__(out, "_tied", _tied_groups(doc.get("tied", []), out))
    return out


def _tied_groups(groups, out) -> list[list[str]]:
    """The description's tied-weight groups, each a list of 2+ parameter paths of one shape."""
    result = []
    for i, g in enumerate(_list(groups, "tied", MAX_TENSORS)):
        paths = [_path(p, f"tied {i} path") for p in _list(g, f"tied {i}", MAX_TENSORS)]
        values = []
        for p in paths:
            owner, leaf = out._path(p, create=False) if _has_path(out, p) else (None, None)
            if owner is None or owner._parameters.get(leaf) is None:
                raise _fail(f"tied weight {p!r} is not a parameter of the described model")
            values.append(owner._parameters[leaf])
        if len(paths) < 2 or len(set(paths)) != len(paths) or \
                any(tuple(v.shape) != tuple(values[0].shape) for v in values):
            raise _fail(f"tied group {i} must name 2 or more distinct parameters of one shape")
        result.append(paths)
    return result


def _has_path(out, path: str) -> bool:
    try:
        out._path(path, create=False)
    except (KeyError, AttributeError):
        return False
    return True


def _rebuild_nodes(reader: _Reader, out, source: str) -> None:
    fp = _fp()

    doc = reader.doc
    functions = function_names(source)
    graph: torch.fx.Graph = out.graph
    nodes: dict[str, torch.fx.Node] = {}
    inputs = _list(doc.get("inputs"), "inputs", MAX_NODES)
    entries = _list(doc.get("nodes"), "nodes", MAX_NODES)
    for i, e in enumerate(entries):
        e = _obj(e, f"node {i}")
        name = _str(e.get("name"), f"node {i} name", 200)
        op = e.get("op")
        if op not in NODE_OPS:
            raise _fail(f"node {name!r} has unknown kind {str(op)[:40]!r}; known: {NODE_OPS}")
        if name in nodes:
            raise _fail(f"node {name!r} is defined twice")
        raw = e.get("target")
        if op == "call_function":
            target = functions.get(raw) if isinstance(raw, str) else None
            if target is None:
                table = "FUNCTIONS" if source == "fx" else "the aten table"
                raise _fail(f"node {name!r} calls {str(raw)[:120]!r}, which is not an op of this party's "
                            f"crypten_lite.nn.from_pytorch ({table}); unknown ops are refused")
        elif op == "call_method":
            target = _str(raw, f"node {name!r} target", 200)
            if target not in fp.METHODS:
                raise _fail(f"node {name!r} calls the tensor method {target[:80]!r}, which is not in "
                            "crypten_lite.nn.from_pytorch.METHODS; unknown ops are refused")
        elif op in ("get_attr", "call_module"):
            target = _path(raw, f"node {name!r} target")
            try:
                found = out._get(target)
            except KeyError:
                found = None
            if op == "call_module" and not isinstance(found, fp.Module):
                raise _fail(f"node {name!r} calls module {target!r}, which the description does not define")
            if op == "get_attr" and not isinstance(found, torch.Tensor):
                raise _fail(f"node {name!r} reads {target!r}, which the description does not define")
        else:
            target = _str(raw, f"node {name!r} target", 200)
        args = reader.value(e.get("args", []), nodes)
        kwargs = reader.value(e.get("kwargs", {"dict": []}), nodes)
        if not isinstance(args, (list, tuple)) or not isinstance(kwargs, dict) or \
                not all(isinstance(k, str) for k in kwargs):
            raise _fail(f"node {name!r}: args must be a list and kwargs a dict of names")
        node = graph.create_node(op, target, tuple(args), kwargs, name=name)
        if "state_path" in e:
            path = _path(e["state_path"], f"node {name!r} state_path")
            try:
                out._get(path)
            except KeyError:
                raise _fail(f"node {name!r} reads {path!r}, which the description does not define") from None
            node.meta["state_path"] = path
        nodes[name] = node
        if op == "placeholder" and name in inputs:
            out._input_names.append(node.name)
        elif op in ("call_function", "call_method"):
            try:
                fp.bind_node(out, node)
            except (KeyError, AttributeError, IndexError, TypeError, ValueError) as err:
                raise _fail(f"node {name!r} ({raw}) has arguments that do not fit it ({err})") from err
        elif op == "placeholder" and "state_path" not in node.meta:
            raise _fail(f"placeholder {name!r} is neither an input nor a parameter")
    if len(out._input_names) != len(inputs):
        raise _fail(f"inputs {str(inputs)[:120]} are not all placeholders")
    outputs = [n for n in graph.nodes if n.op == "output"]
    if len(outputs) != 1 or next(reversed(graph.nodes)) is not outputs[0]:
        raise _fail("a graph ends with exactly one output node")
    spec = doc.get("out_spec")
    if spec is not None:
        from torch.utils._pytree import tree_flatten
        spec = _obj(spec, "out_spec")
        n_user = spec.get("n_user")
        leaves, treespec = tree_flatten(reader.value(spec.get("structure")))
        if not _is_int(n_user) or leaves != list(range(n_user)):
            raise _fail("out_spec does not number its outputs 0..n-1")
        object.__setattr__(out, "_out_spec", (treespec, n_user))


# ---------------------------------------------------------------------- int8 models
def _info_out(info) -> list:
    """A ValueInfo as [kind, scale, zero_point, lo, hi, shape]."""
    return [info.kind, info.scale, info.zero_point, info.lo, info.hi, list(info.shape)]


def _info_in(v: Any, what: str):
    """The ValueInfo of [kind, scale, zero_point, lo, hi, shape], validated."""
    from ..quantized.ir import FIXED, QUANT, ValueInfo

    v = _list(v, f"{what} value info", 6)
    if len(v) != 6 or v[0] not in (QUANT, FIXED) or not isinstance(v[1], (int, float)) or \
            isinstance(v[1], bool) or not (math.isfinite(v[1]) and v[1] > 0) or \
            not all(_is_int(x) for x in v[2:5]) or v[3] > v[4]:
        raise _fail(f"{what} has an invalid value info {str(v)[:120]}")
    return ValueInfo(v[0], float(v[1]), v[2], v[3], v[4], _shape(v[5], what))


def describe_program(program) -> bytes:
    """The description of an int8 program: its public part (weights by shape only)."""
    w = _Writer()
    nodes = [{"op": n.op, "name": n.name, "inputs": list(n.inputs), "out": _info_out(n.out),
              "attrs": {k: w.value(v) for k, v in n.attrs.items()},
              "weights": {k: w.tensor(t, secret=True) for k, t in n.weights.items()},
              "source": n.source} for n in program.nodes]
    sources = [[k, name, _info_out(info)] for k, (name, info) in program.sources.items()]
    return w.encode("quantized", {"nodes": nodes, "output": program.output, "sources": sources})


def rebuild_program(reader: _Reader):
    """The public program a description describes (weights: int64 meta placeholders)."""
    from ..quantized.ir import OPS, Node, QuantizedProgram

    doc = reader.doc
    nodes = []
    for i, e in enumerate(_list(doc.get("nodes"), "nodes", MAX_NODES)):
        e = _obj(e, f"node {i}")
        name = _str(e.get("name"), f"node {i} name", 200)
        op = e.get("op")
        if op not in OPS:
            raise _fail(f"node {name!r} has unknown op {str(op)[:80]!r}; known: "
                        "crypten_lite.quantized.ir.OPS; unknown ops are refused")
        inputs = tuple(_str(x, f"node {name!r} input", 200) for x in _list(e.get("inputs"), "inputs", MAX_NODES))
        attrs = {_str(k, f"node {name!r} attribute", 200): reader.value(v)
                 for k, v in _obj(e.get("attrs"), f"node {name!r} attrs").items()}
        weights = {}
        for k, ref in _obj(e.get("weights"), f"node {name!r} weights").items():
            if not _is_int(ref) or not 0 <= ref < len(reader.tensors):
                raise _fail(f"weight {k!r} of node {name!r} refers to tensor {str(ref)[:40]}, out of range")
            t = reader.tensors[ref]
            if t.device.type != "meta" or t.dtype != torch.int64:
                raise _fail(f"weight {k!r} of node {name!r} must be an int64 secret placeholder")
            weights[_str(k, "weight name", 200)] = t
        nodes.append(Node(op, name, inputs, _info_in(e.get("out"), f"node {name!r}"), attrs,
                          weights, _str(e.get("source", ""), f"node {name!r} source")))
    sources = {}
    for i, s in enumerate(_list(doc.get("sources"), "sources", MAX_NODES)):
        s = _list(s, f"source {i}", 3)
        if len(s) != 3:
            raise _fail(f"source {i} is [torch name, value name, value info]")
        sources[_str(s[0], "source name", 200)] = (_str(s[1], "value name", 200),
                                                   _info_in(s[2], f"source {i}"))
    try:
        return QuantizedProgram(nodes, _str(doc.get("output"), "output", 200), sources)
    except ValueError as e:
        raise _fail(str(e)) from e
