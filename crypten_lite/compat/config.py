"""CrypTen's `cfg`: nested settings read and written as attributes, with temp_override.

The options CrypTen users set are accepted; how each one acts in crypten_lite:

* ``mpc.provider``: "TTP" (default here) selects crypten_lite's dealer, "TFP" its insecure
  trusted-first-party provider. The provider is fixed when a session starts (every party must
  agree): set it before ``crypten.init()`` / ``run_multiprocess``.
* ``encoder.precision_bits``: fractional bits of tensors encrypted afterwards.
* ``functions.max_method``: "pairwise" uses crypten_lite's pairwise argmax, every other
  method its tree reduction (CrypTen's log_reduction).
* the other ``functions.*`` approximation settings (iterations, terms, methods) are kept for
  scripts that set them; crypten_lite picks its own approximations (docs/functions.md).
* ``communicator.verbose``: communication statistics are always kept; see
  ``crypten.communicator.get().get_communication_stats()``.
* ``mpc.protocol``: "beaver" (default) is crypten_lite's additive sharing, "replicated" its
  3-party replicated sharing ("rss", no dealer); fixed when a session starts, like the provider.
* ``mpc.active_security``: CrypTen's check of the dealer's triples is not implemented, so
  setting it to True raises UnsupportedError at once (a security setting is never silently
  ignored); crypten_lite's dealer is semi-honest (docs/design.md, threat model).

Every value is checked when it is set: an unknown provider or protocol is a ValueError there.
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any, Iterator

DEFAULTS: dict[str, Any] = {
    "communicator": {"verbose": False},
    "debug": {"debug_mode": False, "validation_mode": False},
    "encoder": {"precision_bits": 16},
    "functions": {
        "max_method": "log_reduction", "sigmoid_tanh_method": "reciprocal",
        "sigmoid_tanh_terms": 32, "exp_iterations": 8, "reciprocal_method": "NR",
        "reciprocal_nr_iters": 10, "reciprocal_log_iters": 1, "reciprocal_all_pos": False,
        "reciprocal_initial": None, "sqrt_nr_iters": 3, "sqrt_nr_initial": None,
        "log_iterations": 2, "log_exp_iterations": 8, "log_order": 8, "trig_iterations": 10,
        "erf_iterations": 8,
    },
    "mpc": {"active_security": False, "provider": "TTP", "protocol": "beaver"},
    "nn": {"dpsmpc": {"protocol": "layer_estimation", "skip_loss_forward": True,
                      "cache_pred_size": True}},
}

class Node:
    """One level of the settings tree."""

    def __init__(self, values: dict[str, Any]):
        object.__setattr__(self, "_values", {})
        for k, v in values.items():
            self._values[k] = Node(v) if isinstance(v, dict) else v

    def __getattr__(self, name: str) -> Any:
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"cfg has no setting {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        if name not in self._values:
            raise AttributeError(f"cfg has no setting {name!r}")
        check = CHECKS.get((id(self), name))
        if check is not None:
            check(value)
        self._values[name] = value

    def __getitem__(self, key: str) -> Any:
        node: Any = self
        for part in key.split("."):
            node = getattr(node, part)
        return node

    def __setitem__(self, key: str, value: Any) -> None:
        *path, last = key.split(".")
        node: Any = self
        for part in path:
            node = getattr(node, part)
        setattr(node, last, value)

    def __contains__(self, key: str) -> bool:
        try:
            self[key]
            return True
        except AttributeError:
            return False

    def to_dict(self) -> dict[str, Any]:
        return {k: v.to_dict() if isinstance(v, Node) else v for k, v in self._values.items()}


class Config(Node):
    """The root of the settings (crypten.cfg)."""

    def __init__(self):
        super().__init__(copy.deepcopy(DEFAULTS))

    @contextlib.contextmanager
    def temp_override(self, overrides: dict[str, Any]) -> Iterator["Config"]:
        """Set dotted keys ({"functions.max_method": "pairwise"}) inside a with block."""
        saved = {k: self[k] for k in overrides}
        try:
            for k, v in overrides.items():
                self[k] = v
            yield self
        finally:
            for k, v in saved.items():
                self[k] = v

    def load_config(self, config_file: str) -> None:
        """Read dotted settings from a YAML file (CrypTen's format)."""
        import yaml
        with open(config_file) as f:
            values = yaml.safe_load(f) or {}

        def walk(prefix: str, d: dict) -> None:
            for k, v in d.items():
                key = f"{prefix}.{k}" if prefix else k
                if isinstance(v, dict):
                    walk(key, v)
                else:
                    self[key] = v
        walk("", values)

    def reset(self) -> None:
        object.__setattr__(self, "_values", Config()._values)
        _register_checks(self)


PROVIDERS = {"TTP": "dealer", "TFP": "tfp"}
PROTOCOLS = {"beaver": "additive", "replicated": "rss"}
# (id of the Node holding the setting, name) -> a check run before every assignment.
CHECKS: dict = {}


def _check_active_security(value: Any) -> None:
    if value:
        from ..errors import UnsupportedError
        raise UnsupportedError(
            "cfg.mpc.active_security = True: crypten_lite does not verify the dealer's triples "
            "(CrypTen's active security check), so it refuses the setting rather than ignore it. "
            "Its dealer and parties are semi-honest (docs/design.md, threat model); for a "
            "session without a dealer use cfg.mpc.protocol = 'replicated' (3 parties)")


def _check_in(name: str, allowed) -> Any:
    def check(value: Any) -> None:
        key = str(value).upper() if allowed is PROVIDERS else str(value)
        if key not in allowed:
            raise ValueError(f"cfg.{name} must be one of {sorted(allowed)}, got {value!r}")
    return check


def _register_checks(root: "Config") -> None:
    mpc = root._values["mpc"]
    CHECKS.clear()
    CHECKS[(id(mpc), "active_security")] = _check_active_security
    CHECKS[(id(mpc), "provider")] = _check_in("mpc.provider", PROVIDERS)
    CHECKS[(id(mpc), "protocol")] = _check_in("mpc.protocol", PROTOCOLS)


cfg = Config()
_register_checks(cfg)


def protocol_name() -> str:
    """crypten_lite's protocol for cfg.mpc.protocol ("additive" or "rss")."""
    return PROTOCOLS[str(cfg.mpc.protocol)]


def provider_name() -> str:
    """crypten_lite's provider for cfg.mpc.provider."""
    name = str(cfg.mpc.provider).upper()
    if name not in PROVIDERS:
        raise ValueError(f"cfg.mpc.provider must be one of {sorted(PROVIDERS)}, got {cfg.mpc.provider!r}")
    return PROVIDERS[name]
