"""CrypTen's ONNX-era modules (what its ONNX converter produced) and `crypten.nn.Graph`.

Each module follows CrypTen's calling convention: `forward(x)` takes one input, or one list of
inputs for the modules with several (`Add()([a, b])`), and each has CrypTen's static
`from_onnx(attributes)` constructor and `SUPPORTS_PLAINTEXT_INPUTS` flag. They compute with
the CrypTensor methods (MPCTensors, or torch tensors where the module supports plaintext).
crypten_lite's own converter (from_pytorch, torch.fx) does not produce them; they serve code
that builds CrypTen graphs by hand.
"""

from __future__ import annotations

import torch

from . import Module


def _is_private(x) -> bool:
    from ..tensor import CrypTensor
    return isinstance(x, CrypTensor)


def _ints(v) -> list[int]:
    if isinstance(v, torch.Tensor):
        return [int(i) for i in v.flatten().tolist()]
    if isinstance(v, (list, tuple, torch.Size)):
        return [int(i) for i in v]
    return [int(v)]


def _pair_inputs(x, name: str, n: int = 2):
    if not isinstance(x, (list, tuple)) or len(x) != n:
        raise ValueError(f"{name} takes a list of {n} inputs, got {type(x).__name__}"
                         + (f" of length {len(x)}" if isinstance(x, (list, tuple)) else ""))
    return x


class _OnnxModule(Module):
    """Base of the ONNX-era modules: no parameters; CrypTen's from_onnx constructor."""

    SUPPORTS_PLAINTEXT_INPUTS = False
    _onnx: tuple[tuple[str, str, object], ...] = ()  # (ONNX attribute, argument, default)

    @classmethod
    def from_onnx(cls, attributes=None):
        attributes = dict(attributes or {})
        return cls(*[attributes.get(attr, default) for attr, _, default in cls._onnx])


def _binary(name: str, op, plaintext: bool = True, doc: str = ""):
    def forward(self, x):
        a, b = _pair_inputs(x, name)
        return op(a, b)
    return type(name, (_OnnxModule,), {"forward": forward, "SUPPORTS_PLAINTEXT_INPUTS": plaintext,
                                       "__module__": __name__, "__doc__": doc or f"CrypTen's {name}: x[0] op x[1]."})


def _div(a, b):
    if _is_private(b) and not _is_private(a):  # public / private: the reciprocal of b, times a
        return b.reciprocal().mul(a)
    return a.div(b)


Add = _binary("Add", lambda a, b: a + b if _is_private(a) or not _is_private(b) else b + a,
              doc="CrypTen's Add: forward([x, y]) = x + y.")
Sub = _binary("Sub", lambda a, b: a - b if _is_private(a) or not _is_private(b) else -(b - a),
              doc="CrypTen's Sub: forward([x, y]) = x - y.")
Mul = _binary("Mul", lambda a, b: a * b if _is_private(a) or not _is_private(b) else b * a,
              doc="CrypTen's Mul: forward([x, y]) = x * y.")
Div = _binary("Div", _div, doc="CrypTen's Div: forward([x, y]) = x / y.")
MatMul = _binary("MatMul", lambda a, b: a.matmul(b), doc="CrypTen's MatMul: forward([x, y]) = x @ y.")
Equal = _binary("Equal", lambda a, b: a.eq(b) if _is_private(a) or not _is_private(b) else b.eq(a),
                doc="CrypTen's Equal: forward([x, y]) = (x == y), encrypted 0/1 for private inputs.")


def _unary(name: str, method: str):
    def forward(self, x):
        return getattr(x, method)()
    return type(name, (_OnnxModule,), {"forward": forward, "__module__": __name__,
                                       "__doc__": f"CrypTen's {name}: x.{method}()."})


Exp = _unary("Exp", "exp")
Sqrt = _unary("Sqrt", "sqrt")
Erf = _unary("Erf", "erf")


class Pow(_OnnxModule):
    """forward([x, p]) = x ** p (p public)."""

    def forward(self, x):
        base, exponent = _pair_inputs(x, "Pow")
        if _is_private(exponent):
            raise ValueError("Pow: the exponent must be public")
        return base.pow(exponent.item() if isinstance(exponent, torch.Tensor) else exponent)


class Concat(_OnnxModule):
    """forward([tensors...]) = cat along `dimension` (ONNX attribute axis)."""

    SUPPORTS_PLAINTEXT_INPUTS = True
    _onnx = (("axis", "dimension", 0),)

    def __init__(self, dimension: int = 0):
        super().__init__()
        self.dimension = int(dimension)

    def forward(self, x):
        from .. import cat
        tensors = list(x)
        if not any(_is_private(t) for t in tensors):
            return torch.cat(tensors, dim=self.dimension)
        return cat(tensors, dim=self.dimension)


class Constant(_OnnxModule):
    """forward(_) = the public `value`."""

    SUPPORTS_PLAINTEXT_INPUTS = True
    _onnx = (("value", "value", None),)

    def __init__(self, value):
        super().__init__()
        object.__setattr__(self, "value", value if isinstance(value, torch.Tensor) else torch.tensor(value))

    def forward(self, x=None):
        return self.value


class ConstantOfShape(_OnnxModule):
    """forward(shape) = `value` expanded to shape."""

    SUPPORTS_PLAINTEXT_INPUTS = True
    _onnx = (("value", "value", 0.0),)

    def __init__(self, value=0.0):
        super().__init__()
        object.__setattr__(self, "value", value if isinstance(value, torch.Tensor) else torch.tensor(value))

    def forward(self, size):
        if isinstance(size, (list, tuple)) and len(size) == 1 and isinstance(size[0], (list, tuple, torch.Tensor)):
            size = size[0]
        return self.value.reshape(()).expand(*_ints(size)) if self.value.numel() == 1 else \
            self.value.expand(*_ints(size))


class Range(_OnnxModule):
    """forward([start, limit, delta]) = arange (public)."""

    SUPPORTS_PLAINTEXT_INPUTS = True

    def forward(self, x):
        start, limit, delta = _pair_inputs(x, "Range", 3)
        if any(_is_private(v) for v in (start, limit, delta)):
            raise ValueError("Range: start, limit and delta must be public")
        item = lambda v: v.item() if isinstance(v, torch.Tensor) else v  # noqa: E731
        return torch.arange(item(start), item(limit), item(delta))


class Expand(_OnnxModule):
    """forward([x, shape]) = x.expand(shape)."""

    SUPPORTS_PLAINTEXT_INPUTS = True

    def forward(self, x):
        tensor, shape = _pair_inputs(x, "Expand")
        return tensor.expand(*_ints(shape))


class Gather(_OnnxModule):
    """forward([x, indices]) = x.take(indices, axis=dimension) (ONNX Gather; public indices)."""

    SUPPORTS_PLAINTEXT_INPUTS = True
    _onnx = (("axis", "dimension", 0),)

    def __init__(self, dimension: int = 0):
        super().__init__()
        self.dimension = int(dimension)

    def forward(self, x):
        tensor, indices = _pair_inputs(x, "Gather")
        if _is_private(indices):
            raise ValueError("Gather: the indices must be public (a torch tensor), not encrypted")
        indices = torch.as_tensor(indices, dtype=torch.long)
        dim = self.dimension % tensor.dim()
        flat = tensor.index_select(dim, indices.flatten())
        shape = tuple(tensor.shape[:dim]) + tuple(indices.shape) + tuple(tensor.shape[dim + 1:])
        return flat.reshape(shape)


class Gemm(_OnnxModule):
    """forward([A, B, C]) = alpha * A' @ B' + beta * C (A' = A.t() when transposeA, ...)."""

    _onnx = (("alpha", "alpha", 1.0), ("beta", "beta", 1.0), ("transA", "transposeA", False),
             ("transB", "transposeB", False))

    def __init__(self, alpha: float = 1.0, beta: float = 1.0, transposeA: bool = False,
                 transposeB: bool = False):
        super().__init__()
        self.alpha, self.beta = float(alpha), float(beta)
        self.transposeA, self.transposeB = bool(transposeA), bool(transposeB)

    def forward(self, x):
        a, b, c = x[0], x[1], x[2]
        a = a.t() if self.transposeA else a
        b = b.t() if self.transposeB else b
        product = a.matmul(b) if _is_private(a) or not _is_private(b) else b.t().matmul(a.t()).t()
        if self.alpha != 1.0:
            product = product * self.alpha
        return product + (c * self.beta if self.beta != 1.0 else c)


class _Reduce(_OnnxModule):
    _onnx = (("axes", "dimension", None), ("keepdims", "keepdim", 1))

    def __init__(self, dimension=None, keepdim: bool = False):
        super().__init__()
        self.dimension = None if dimension is None else _ints(dimension)
        self.keepdim = bool(keepdim)

    def _dims(self, x):
        return tuple(range(x.dim())) if self.dimension is None else tuple(self.dimension)


class Mean(_Reduce):
    """forward(x) = x.mean(dimension, keepdim) (ONNX ReduceMean: axes, keepdims)."""

    def forward(self, x):
        return x.mean(self._dims(x), keepdim=self.keepdim)


class Sum(_Reduce):
    """forward(x) = x.sum(dimension, keepdim) (ONNX ReduceSum: axes, keepdims)."""

    def forward(self, x):
        return x.sum(self._dims(x), keepdim=self.keepdim)


class Reshape(_OnnxModule):
    """forward(x) = x.reshape(shape), or forward([x, shape]) without a fixed shape."""

    SUPPORTS_PLAINTEXT_INPUTS = True
    _onnx = (("shape", "shape", None),)

    def __init__(self, shape=None):
        super().__init__()
        self.shape = None if shape is None else tuple(_ints(shape))

    def forward(self, x):
        if self.shape is None:
            tensor, shape = _pair_inputs(x, "Reshape")
            return tensor.reshape(tuple(_ints(shape)))
        return x.reshape(self.shape)


class Shape(_OnnxModule):
    """forward(x) = x's shape, a public tensor."""

    SUPPORTS_PLAINTEXT_INPUTS = True

    def forward(self, x):
        return torch.tensor(tuple(x.size()))


class Slice(_OnnxModule):
    """forward(x) = x[starts[i]:ends[i]] along axes[i] (default the first dims)."""

    SUPPORTS_PLAINTEXT_INPUTS = True
    _onnx = (("starts", "starts", None), ("ends", "ends", None), ("axes", "axes", None))

    def __init__(self, starts, ends, axes=None):
        super().__init__()
        self.starts, self.ends = _ints(starts), _ints(ends)
        self.axes = list(range(len(self.starts))) if axes is None else _ints(axes)

    def forward(self, x):
        index = [slice(None)] * x.dim()
        for start, end, axis in zip(self.starts, self.ends, self.axes):
            index[axis] = slice(start, end)
        return x[tuple(index)]


class Squeeze(_OnnxModule):
    """forward(x) = x.squeeze(dimension) (ONNX attribute axes: one axis)."""

    SUPPORTS_PLAINTEXT_INPUTS = True
    _onnx = (("axes", "dimension", None),)

    def __init__(self, dimension=None):
        super().__init__()
        if isinstance(dimension, (list, tuple)):
            if len(dimension) != 1:
                raise ValueError(f"Squeeze takes one axis, got {list(dimension)}")
            dimension = dimension[0]
        self.dimension = None if dimension is None else int(dimension)

    def forward(self, x):
        return x.squeeze() if self.dimension is None else x.squeeze(self.dimension)


class Unsqueeze(Squeeze):
    """forward(x) = x.unsqueeze(dimension) (ONNX attribute axes: one axis)."""

    def forward(self, x):
        return x.unsqueeze(self.dimension)


class Transpose(_OnnxModule):
    """forward(x) = x.permute(perm)."""

    SUPPORTS_PLAINTEXT_INPUTS = True
    _onnx = (("perm", "perm", None),)

    def __init__(self, perm):
        super().__init__()
        self.perm = _ints(perm)

    def forward(self, x):
        return x.permute(*self.perm)


class Where(_OnnxModule):
    """forward([condition, x, y]) = condition ? x : y (condition public, or encrypted 0/1)."""

    SUPPORTS_PLAINTEXT_INPUTS = True

    def forward(self, x):
        condition, a, b = x[0], x[1], x[2]
        if _is_private(condition):
            return condition * (a - b) + b if _is_private(a) or not _is_private(b) else \
                (b - a) * (1 - condition) + a
        from .. import where
        return where(condition.bool(), a, b)


class BatchNormalization(_OnnxModule):
    """CrypTen's stateless batch normalization: forward((x, weight, bias, running_mean,
    running_var)) over the channel dim 1. Evaluation: the normalized x with the given
    statistics. Training: (output, updated running_mean, updated running_var, batch mean,
    1 / sqrt(batch var + epsilon)), the running statistics moved by `momentum` towards the
    batch's (its variance unbiased, as torch's)."""

    _onnx = (("epsilon", "epsilon", 1e-5), ("momentum", "momentum", 0.1))

    def __init__(self, epsilon: float = 1e-5, momentum: float = 0.1):
        super().__init__()
        self.epsilon, self.momentum = float(epsilon), float(momentum)

    def forward(self, x):
        tensor, weight, bias, running_mean, running_var = x
        shape = [1, -1] + [1] * (tensor.dim() - 2)
        weight, bias = weight.reshape(shape), bias.reshape(shape)
        if not self.training:
            inv = (running_var.reshape(shape) + self.epsilon).inv_sqrt()
            return (tensor - running_mean.reshape(shape)) * inv * weight + bias
        dims = [d for d in range(tensor.dim()) if d != 1]
        count = tensor.nelement() // tensor.size(1)
        mean = tensor.mean(dims, keepdim=True)
        centered = tensor - mean
        var = centered.square().mean(dims, keepdim=True)
        inv = (var + self.epsilon).inv_sqrt()
        out = centered * inv * weight + bias
        m = self.momentum
        new_mean = running_mean * (1 - m) + mean.flatten() * m
        new_var = running_var * (1 - m) + var.flatten() * (m * count / max(count - 1, 1))
        return out, new_mean, new_var, mean.flatten(), inv.flatten()


class Graph(Module):
    """CrypTen's Graph container: named modules wired by the names of their inputs.

        graph = crypten.nn.Graph(["x1", "x2"], "out")
        graph.add_module("x", crypten.nn.Add(), ["x1", "x2"])
        graph.add_module("out", crypten.nn.Linear(10, 10), ["x"])
        y = graph(a, b)

    A module's output is named by the module; a module with one input gets it as it is, with
    several a list. forward runs the modules in dependency order and returns the outputs."""

    def __init__(self, input_names, output_names, modules=None, graph=None):
        super().__init__()
        object.__setattr__(self, "input_names", list(input_names) if isinstance(input_names, (list, tuple))
                           else [input_names])
        object.__setattr__(self, "output_names", list(output_names) if isinstance(output_names, (list, tuple))
                           else [output_names])
        object.__setattr__(self, "_graph", {})
        for name, module in (modules or {}).items():
            self.add_module(name, module, (graph or {}).get(name))

    def add_module(self, name: str, module, input_names=None) -> None:
        """Add `module` named `name`, computed from the values named `input_names`."""
        super().add_module(name, module)
        if input_names is not None:
            self._graph[name] = list(input_names) if isinstance(input_names, (list, tuple)) else [input_names]

    def forward(self, *args):
        if len(args) != len(self.input_names):
            raise ValueError(f"Graph takes {len(self.input_names)} inputs ({self.input_names}), got {len(args)}")
        values = dict(zip(self.input_names, args))
        pending = [name for name in self._modules if name in self._graph]
        while pending:
            ready = [n for n in pending if all(i in values for i in self._graph[n])]
            if not ready:
                missing = {n: [i for i in self._graph[n] if i not in values] for n in pending}
                raise ValueError(f"Graph: these modules wait for values nothing computes: {missing}")
            for name in ready:
                inputs = [values[i] for i in self._graph[name]]
                values[name] = self._modules[name](inputs[0] if len(inputs) == 1 else inputs)
                pending.remove(name)
        missing = [o for o in self.output_names if o not in values]
        if missing:
            raise ValueError(f"Graph: no module computes the outputs {missing}")
        outputs = [values[o] for o in self.output_names]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)


ONNX_MODULES = ["Add", "Sub", "Mul", "Div", "MatMul", "Equal", "Exp", "Sqrt", "Erf", "Pow", "Concat",
                "Constant", "ConstantOfShape", "Range", "Expand", "Gather", "Gemm", "Mean", "Sum",
                "Reshape", "Shape", "Slice", "Squeeze", "Unsqueeze", "Transpose", "Where",
                "BatchNormalization"]
