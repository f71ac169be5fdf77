"""CrypTen's `crypten.optim`: crypten_lite's optimizers on MPCTensor parameters."""

from __future__ import annotations

from ..errors import UnsupportedError
from ..optim import optimizer as _core
from .tensor import unwrap


def _params(params):
    params = list(params)
    if params and isinstance(params[0], dict):
        return [dict(g, params=[unwrap(p) for p in g["params"]]) for g in params]
    return [unwrap(p) for p in params]


class SGD(_core.SGD):
    """torch.optim.SGD's update rule (CrypTen raises ValueError on bad arguments)."""

    def __init__(self, params, lr: float, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, grad_threshold=None):
        try:
            super().__init__(_params(params), lr=lr, momentum=momentum, dampening=dampening,
                             weight_decay=weight_decay, nesterov=nesterov)
        except UnsupportedError as e:
            raise ValueError(str(e)) from e


class Adam(_core.Adam):
    """torch.optim.Adam's update rule."""

    def __init__(self, params, *args, **kwargs):
        try:
            super().__init__(_params(params), *args, **kwargs)
        except UnsupportedError as e:
            raise ValueError(str(e)) from e


Optimizer = _core.Optimizer

__all__ = ["SGD", "Adam", "Optimizer"]
