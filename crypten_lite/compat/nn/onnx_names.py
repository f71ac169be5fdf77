"""CrypTen's ONNX node names on a model converted by from_pytorch.

CrypTen's converter exported the torch model to ONNX, so its Graph's modules are named by the
ONNX graph: `fc1.weight` (a Parameter module), `out` (a Gemm), `onnx::Gemm_6` (the ReLU whose
output feeds the next Gemm), `output`. crypten_lite converts with torch.fx and keeps torch's
names (`fc1`, `fc2`), which every crypten_lite code path uses. For code that steps through a
model by CrypTen's names (Tutorial 5), `model._modules[name]` also resolves those names: the
names come from torch's own TorchScript ONNX pass (the graph torch.onnx.export would write, the
one CrypTen's converter read), computed on the first such lookup; each resolves to a module of
the ONNX era (Parameter, Gemm, ReLU, ...) that computes on the converted model's current
(public or encrypted) parameters. Iterating `_modules` still gives torch's names.

When the model came from load_from_party, only its owner holds the torch model: the owner
computes the node list and broadcasts it as JSON (names, op types, attributes), never a pickle.
"""

from __future__ import annotations

import collections
import warnings

import torch


def onnx_nodes(pytorch_model: torch.nn.Module, dummy_input) -> list[dict]:
    """The ONNX graph torch's exporter would write for the model (eval mode, no constant
    folding, input "input", output "output"), as plain data: one dict per node with its
    output name, ONNX op type, attributes and input names; parameters as op "Parameter"."""
    try:
        from torch.onnx import utils as onnx_utils
        to_graph = onnx_utils._model_to_graph
        mode = torch.onnx.select_model_mode_for_export
        training = torch.onnx.TrainingMode.EVAL
    except (ImportError, AttributeError) as e:  # a torch without the TorchScript exporter
        raise NotImplementedError(f"CrypTen's ONNX node names need torch's TorchScript ONNX exporter ({e})") from e
    dummy = dummy_input if isinstance(dummy_input, tuple) else (dummy_input,)
    dummy = tuple(torch.zeros(d.shape, dtype=d.dtype) if isinstance(d, torch.Tensor) else d for d in dummy)
    with warnings.catch_warnings(), mode(pytorch_model, training):
        warnings.simplefilter("ignore")
        graph, params, _ = to_graph(pytorch_model, dummy, input_names=["input"], output_names=["output"],
                                    operator_export_type=torch.onnx.OperatorExportTypes.ONNX,
                                    do_constant_folding=False, training=training)
    nodes = [{"name": name, "op": "Parameter", "attributes": {}, "inputs": []} for name in params]
    for node in graph.nodes():
        outputs = list(node.outputs())
        if len(outputs) != 1:
            continue
        attributes = {}
        for a in node.attributeNames():
            kind = node.kindOf(a)
            value = getattr(node, kind)(a)
            if isinstance(value, torch.Tensor):
                value = value.tolist()
            attributes[a] = value if isinstance(value, (int, float, str, list)) else str(value)
        nodes.append({"name": outputs[0].debugName(), "op": node.kind().split("::")[-1],
                      "attributes": attributes, "inputs": [i.debugName() for i in node.inputs()]})
    return nodes


def _module_for(node: dict, model):
    from .. import nn as compat_nn
    op = node["op"]
    if op == "Parameter":
        state = dict(model.named_parameters())
        state.update(dict(model.named_buffers()))
        if node["name"] not in state:
            raise KeyError(f"{node['name']!r}: an ONNX initializer torch's exporter made (e.g. a BatchNorm "
                           "folded into a Conv), which the converted model does not hold; use torch's names "
                           f"({sorted(dict(model.named_parameters()))})")
        return compat_nn.Parameter(state[node["name"]])
    if op == "Relu":
        return compat_nn.ReLU()
    if op == "Gemm":
        return compat_nn.Gemm.from_onnx(node["attributes"])
    cls = getattr(compat_nn, op, None)
    if op in getattr(compat_nn.onnx, "ONNX_MODULES", ()) and cls is not None:
        return cls.from_onnx(node["attributes"])
    raise KeyError(f"{node['name']!r}: CrypTen's name for an ONNX {op} node; crypten_lite offers the "
                   "ONNX-era module of Parameter, Gemm, Relu and the ONNX modules of crypten.nn by name: "
                   "run the model, or its torch-named submodules, instead")


class OnnxNamedModules(collections.OrderedDict):
    """A module's `_modules` that also resolves CrypTen's ONNX node names (module docstring)."""

    def __init__(self, modules, owner, pytorch_model, dummy_input, src):
        super().__init__(modules)
        # plain attributes, not items: the core module iterates the items
        self._onnx_owner, self._onnx_model, self._onnx_dummy = owner, pytorch_model, dummy_input
        self._onnx_src, self._onnx_nodes = src, None

    def __missing__(self, name):
        if self._onnx_nodes is None:
            self._onnx_nodes = self._describe()
        if isinstance(self._onnx_nodes, str):  # torch's exporter failed on this model
            raise KeyError(f"{name!r}: not a submodule of this model, and CrypTen's ONNX node names "
                           f"could not be computed ({self._onnx_nodes})")
        node = next((n for n in self._onnx_nodes if n["name"] == name), None)
        if node is None:
            raise KeyError(name)
        return _module_for(node, self._onnx_owner)

    def _describe(self) -> list[dict] | str:
        """The node list, or the exporter's error as text (at every party: the owner
        broadcasts either, so no party waits for a list that never comes)."""
        def describe():
            try:
                return onnx_nodes(self._onnx_model, self._onnx_dummy)
            except Exception as e:  # noqa: BLE001 (any exporter failure becomes the lookup's KeyError)
                return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"[:300]
        if self._onnx_src is None:
            return describe()
        from .. import communicator
        c = communicator.get()
        return c.broadcast_obj(describe() if c.get_rank() == self._onnx_src else None, self._onnx_src)

    def __reduce__(self):  # a copy is a plain OrderedDict (the torch model stays with its owner)
        return (collections.OrderedDict, (list(self.items()),))


def attach(model, pytorch_model, dummy_input, src) -> None:
    """Let model._modules resolve CrypTen's ONNX names (the torch model is kept for the lookup)."""
    object.__setattr__(model, "_modules", OnnxNamedModules(model._modules, model, pytorch_model, dummy_input, src))
