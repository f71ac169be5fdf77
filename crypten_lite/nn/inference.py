"""Eval-mode simplification of a torch model before it is converted (from_pytorch's default).

A model in eval mode computes the same function with fewer private operations once, in
plaintext on the model owner's side and before anything is shared:

* every BatchNorm that follows a convolution or a linear layer (sole user) is folded into
  that layer's weight and bias (torch.fx.experimental.optimization.fuse);
* every other BatchNorm becomes `FoldedBatchNorm`, the per-channel affine map
  y = x * scale + shift with scale = weight / sqrt(running_var + eps) and
  shift = bias - running_mean * scale (one private product instead of a private inverse
  square root: about 12 rounds saved per layer);
* dropout (nn.Dropout*, F.dropout) and torchvision's stochastic depth are identities in
  eval mode: their nodes are removed.

The result computes what the eval-mode torch model computes (from_pytorch checks it on the
dummy input). Its state dict has the folded layers' keys (`conv.weight`, `conv.bias`,
`bn.scale`, `bn.shift`) instead of the BatchNorm ones, and it is for inference only: the
converted model refuses `train()` (convert with `fold_batch_norm=False` to train).
"""

from __future__ import annotations

import torch
import torch.fx

_DROPOUT_MODULES = (torch.nn.Dropout, torch.nn.Dropout1d, torch.nn.Dropout2d, torch.nn.Dropout3d,
                    torch.nn.AlphaDropout, torch.nn.FeatureAlphaDropout)
_BATCH_NORMS = (torch.nn.BatchNorm1d, torch.nn.BatchNorm2d)


class FoldedBatchNorm(torch.nn.Module):
    """An eval-mode BatchNorm as the per-channel affine map it computes (channel dim 1)."""

    def __init__(self, scale: torch.Tensor, shift: torch.Tensor) -> None:
        super().__init__()
        self.scale = torch.nn.Parameter(scale.detach().clone())
        self.shift = torch.nn.Parameter(shift.detach().clone())

    @classmethod
    def of(cls, bn: torch.nn.modules.batchnorm._BatchNorm) -> "FoldedBatchNorm":
        with torch.no_grad():
            inv = torch.rsqrt(bn.running_var.double() + bn.eps)
            weight = bn.weight.double() if bn.weight is not None else torch.ones_like(inv)
            bias = bn.bias.double() if bn.bias is not None else torch.zeros_like(inv)
            scale = weight * inv
            shift = bias - bn.running_mean.double() * scale
        return cls(scale.to(bn.running_var.dtype), shift.to(bn.running_var.dtype))

    def forward(self, x):
        shape = (1, -1) + (1,) * (x.dim() - 2)
        return x * self.scale.reshape(shape) + self.shift.reshape(shape)


def _is_identity_function(node: torch.fx.Node) -> bool:
    """A call_function / call_method node that is the identity in eval mode."""
    import torch.nn.functional as TF

    if node.op == "call_function":
        if node.target in (TF.dropout, TF.dropout1d, TF.dropout2d, TF.dropout3d, TF.alpha_dropout,
                           TF.feature_alpha_dropout):
            training = node.kwargs.get("training", node.args[2] if len(node.args) > 2 else True)
            return training is False
        if _is_stochastic_depth(node.target):
            training = node.kwargs.get("training", node.args[3] if len(node.args) > 3 else True)
            return training is False
    return False


def _is_stochastic_depth(target) -> bool:
    return getattr(target, "__name__", None) == "stochastic_depth" and \
        getattr(target, "__module__", "").startswith("torchvision.")


def simplify(model: torch.nn.Module) -> torch.fx.GraphModule:
    """The eval-mode model traced, BatchNorms folded, eval identities removed (a copy)."""
    from torch.fx.experimental.optimization import fuse

    from .from_pytorch import _trace  # traces through torch.nn containers without a converter

    traced = _trace(model)
    fused = fuse(traced, inplace=False, no_trace=True)
    modules = dict(fused.named_modules())
    graph = fused.graph
    for node in list(graph.nodes):
        if node.op == "call_module":
            sub = modules.get(node.target)
            if isinstance(sub, _DROPOUT_MODULES):
                node.replace_all_uses_with(node.args[0])
                graph.erase_node(node)
            elif isinstance(sub, _BATCH_NORMS) and sub.track_running_stats and \
                    sub.running_mean is not None:
                *parent, leaf = node.target.split(".")
                owner = fused.get_submodule(".".join(parent)) if parent else fused
                setattr(owner, leaf, FoldedBatchNorm.of(sub))
        elif _is_identity_function(node):
            node.replace_all_uses_with(node.args[0] if node.args else node.kwargs["input"])
            graph.erase_node(node)
    graph.lint()
    return torch.fx.GraphModule(fused, graph)
