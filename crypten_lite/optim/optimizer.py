"""Optimizers on CrypTensor parameters: the update rules of torch.optim.SGD and torch.optim.Adam.

Costs per step and parameter tensor (2 parties): SGD is local except the truncations of
the products by public scalars (lr, momentum, weight decay) — no communication with local
truncation. Adam squares the gradient (one Beaver round), takes one inv_sqrt of the
second moment (an approximation: several rounds) and one product; see Adam for how its
second moment keeps 16 extra bits so that small gradients do not vanish.
"""

from __future__ import annotations

from typing import Any, Iterable

from ..cryptensor import CrypTensor, no_grad
from ..errors import UnsupportedError


class Optimizer:
    """Base class: parameter groups with per-group options, per-parameter state, zero_grad."""

    def __init__(self, params: Iterable, defaults: dict[str, Any]) -> None:
        params = list(params)
        if not params:
            raise UnsupportedError("optimizer got an empty parameter list")
        groups = params if isinstance(params[0], dict) else [{"params": params}]
        self.defaults = dict(defaults)
        self.param_groups: list[dict[str, Any]] = []
        for group in groups:
            g = dict(self.defaults)
            g.update(group)
            g["params"] = list(g["params"])
            self.param_groups.append(g)
        self.state: dict[int, dict[str, Any]] = {}

    def _params(self):
        for group in self.param_groups:
            for p in group["params"]:
                if isinstance(p, CrypTensor) and p.grad is not None:
                    yield group, p

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget every parameter's gradient (the next backward starts from zero)."""
        for group in self.param_groups:
            for p in group["params"]:
                if isinstance(p, CrypTensor):
                    p.grad = None

    def step(self) -> None:
        raise NotImplementedError


class SGD(Optimizer):
    """Stochastic gradient descent with momentum, dampening, weight decay and Nesterov."""

    def __init__(self, params, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False) -> None:
        if lr < 0 or momentum < 0 or weight_decay < 0:
            raise UnsupportedError(f"SGD: lr, momentum and weight_decay must be >= 0 "
                                   f"(got {lr}, {momentum}, {weight_decay})")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise UnsupportedError("SGD: Nesterov momentum requires a momentum and zero dampening")
        super().__init__(params, dict(lr=lr, momentum=momentum, dampening=dampening,
                                      weight_decay=weight_decay, nesterov=nesterov))

    @no_grad()
    def step(self) -> None:
        """One update of every parameter that has a gradient (torch.optim.SGD's rule)."""
        for group, p in self._params():
            g = p.grad
            if group["weight_decay"]:
                g = g.add(p.detach().mul(group["weight_decay"]))
            momentum = group["momentum"]
            if momentum:
                state = self.state.setdefault(id(p), {})
                buf = state.get("momentum_buffer")
                if buf is None:
                    buf = g.clone()
                else:
                    damp = 1.0 - group["dampening"]
                    buf = buf.mul(momentum).add(g if damp == 1.0 else g.mul(damp))
                state["momentum_buffer"] = buf
                g = g.add(buf.mul(momentum)) if group["nesterov"] else buf
            p.sub_(g.mul(group["lr"]))


class Adam(Optimizer):
    """Adam (Kingma & Ba), torch.optim.Adam's rule with bias correction (no amsgrad).

    Fixed point has 2^-16 resolution, so (1 - beta2) g^2 = 0.001 g^2 would vanish for
    |g| < 0.1. The second moment is therefore kept for g scaled by 2^8 (`moment_scale`):
    v' = v * 2^16, exact scaling, 16 more bits of resolution for g^2. The update is
    p -= lr / (1 - beta1^t) * m * 2^8 / sqrt(v'_hat + (2^8 eps)^2), one inv_sqrt (torch
    adds eps after the square root: the same for eps << sqrt(v)). Valid for gradients with
    3e-5 <= |g| <= 8 (inv_sqrt's domain [6.1e-5, 4.2e6) at 16 fractional bits); smaller
    gradients saturate into a smaller step.
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.0, amsgrad: bool = False,
                 moment_scale: int = 2 ** 8) -> None:
        if amsgrad:
            raise UnsupportedError("Adam(amsgrad=True) is not supported on CrypTensors")
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay,
                                      moment_scale=moment_scale))

    @no_grad()
    def step(self) -> None:
        """One Adam update of every parameter that has a gradient."""
        for group, p in self._params():
            beta1, beta2 = group["betas"]
            scale = group["moment_scale"]
            g = p.grad
            if group["weight_decay"]:
                g = g.add(p.detach().mul(group["weight_decay"]))
            state = self.state.setdefault(id(p), {"step": 0})
            state["step"] += 1
            t = state["step"]
            m, v = state.get("exp_avg"), state.get("exp_avg_sq")
            g2 = g.mul(scale).square()  # g * 2^8 is exact; its square keeps 16 more bits of g^2
            m = g.mul(1 - beta1) if m is None else m.mul(beta1).add(g.mul(1 - beta1))
            v = g2.mul(1 - beta2) if v is None else v.mul(beta2).add(g2.mul(1 - beta2))
            state["exp_avg"], state["exp_avg_sq"] = m, v
            v_hat = v.div(1 - beta2 ** t).add((scale * group["eps"]) ** 2)
            inv = v_hat.inv_sqrt() if hasattr(v_hat, "inv_sqrt") else v_hat.sqrt().reciprocal()
            p.sub_(m.mul(inv).mul(group["lr"] / (1 - beta1 ** t) * scale))
