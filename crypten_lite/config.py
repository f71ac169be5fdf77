"""Configuration: one frozen dataclass read from the environment, a TOML file and overrides.

Environment variables (docs/design.md section 6), all optional except where a session needs them:

================================  ==============================================================
``CRYPTEN_LITE_RANK``             this party's rank, 0..world_size-1
``CRYPTEN_LITE_WORLD_SIZE``       number of computing parties
``CRYPTEN_LITE_PARTIES``          comma-separated ``host:port`` of every party, in rank order
``CRYPTEN_LITE_DEALER``           ``host:port`` of the dealer service
``CRYPTEN_LITE_PROVIDER``         ``dealer`` (default), ``pairwise`` (2 parties, no dealer: HE)
                                  or ``tfp`` (insecure, tests only)
``CRYPTEN_LITE_PROTOCOL``         ``additive`` (default: N >= 2 parties, dealer or TFP) or ``rss``
                                  (3-party replicated sharing, honest majority, no dealer)
``CRYPTEN_LITE_TLS_DIR``          folder made by ``crypten-lite certs``; absent = plaintext
``CRYPTEN_LITE_TIMEOUT``          seconds any single wait may take (default 60)
``CRYPTEN_LITE_PRECISION``        fractional bits of the fixed-point encoding (default 16)
``CRYPTEN_LITE_SESSION``          session identifier shared by all parties (default "default")
``CRYPTEN_LITE_BIND``             address this party's server binds to (default: its host)
``CRYPTEN_LITE_CONFIG``           a TOML file with the same keys in lower case (``rank = 0``...)
================================  ==============================================================

Limits (bounded memory under attack, checked before allocating): ``CRYPTEN_LITE_MAX_MESSAGE_BYTES``
is the largest message, and the largest share one input announcement may make a party allocate
(default 2 GiB); ``CRYPTEN_LITE_MAX_MODEL_BYTES`` the largest total of shares the secret tensors
of one received model description may make a party allocate, 8 bytes per element (default 8 GiB).

Precedence: explicit overrides > environment > TOML file > defaults.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import tomllib
from typing import Any, Iterator, Mapping

from .errors import ConfigError

PROVIDERS = ("dealer", "tfp", "pairwise")
# Sharing schemes: "additive" (N >= 2 parties, correlated randomness from a dealer or TFP) and
# "rss" (2-out-of-3 replicated secret sharing, exactly 3 parties, honest majority, no dealer).
PROTOCOLS = ("additive", "rss")
PREFIX = "CRYPTEN_LITE_"


@dataclasses.dataclass(frozen=True)
class Config:
    """Settings of one party in one session (immutable; use :func:`override` to change)."""

    rank: int = 0
    world_size: int = 1
    parties: tuple[str, ...] = ()
    dealer: str = ""
    provider: str = "dealer"
    tls_dir: str = ""
    timeout: float = 60.0
    precision: int = 16
    session: str = "default"
    bind: str = ""
    # Truncation after fixed-point products between 2 parties: "local" (SecureML, no
    # communication, tiny documented failure probability) or "exact" (dealer-assisted, 1 round).
    truncation: str = "local"
    # Sharing scheme (see PROTOCOLS); every party must use the same (part of the digest).
    protocol: str = "additive"
    # Largest message a party accepts from a peer, in bytes (bounded memory under attack);
    # also the largest share (8 bytes per element and component) that a peer's announcement
    # of an input's shape may make a party allocate (mpc.primitives.check_share_size).
    max_message_bytes: int = 1 << 31
    # Largest total, in share bytes (8 per element), of the secret tensors of one model
    # description received from a model owner (nn.graph_desc), checked before allocating.
    max_model_bytes: int = 1 << 33

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise ConfigError(f"world_size must be >= 1, got {self.world_size}")
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(
                f"rank {self.rank} is out of range for world_size {self.world_size}; "
                "set CRYPTEN_LITE_RANK to 0..world_size-1")
        if self.parties and len(self.parties) != self.world_size:
            raise ConfigError(
                f"CRYPTEN_LITE_PARTIES lists {len(self.parties)} addresses but world_size is "
                f"{self.world_size}; give one host:port per party, in rank order")
        for address in self.parties + ((self.dealer,) if self.dealer else ()):
            _check_address(address)
        if self.provider not in PROVIDERS:
            raise ConfigError(f"provider must be one of {PROVIDERS}, got {self.provider!r}")
        if self.provider == "pairwise" and self.world_size > 2 and self.protocol == "additive":
            raise ConfigError(f"provider 'pairwise' runs exactly 2 parties, got world_size "
                              f"{self.world_size}; use the dealer provider for more parties")
        if not 0 <= self.precision <= 30:
            raise ConfigError(f"precision must be 0..30 fractional bits, got {self.precision}")
        if self.timeout <= 0:
            raise ConfigError(f"timeout must be positive seconds, got {self.timeout}")
        if self.max_message_bytes < 1 or self.max_model_bytes < 1:
            raise ConfigError(f"max_message_bytes and max_model_bytes must be positive, got "
                              f"{self.max_message_bytes} and {self.max_model_bytes}")
        if self.truncation not in ("local", "exact"):
            raise ConfigError(f"truncation must be 'local' or 'exact', got {self.truncation!r}")
        if self.protocol not in PROTOCOLS:
            raise ConfigError(f"protocol must be one of {PROTOCOLS}, got {self.protocol!r} "
                              "(CRYPTEN_LITE_PROTOCOL)")
        if self.protocol == "rss" and self.world_size not in (1, 3):
            raise ConfigError(
                f"protocol 'rss' (replicated secret sharing) needs exactly 3 parties, got "
                f"world_size {self.world_size}; use protocol 'additive' for {self.world_size} "
                "parties, or start 3 (`crypten-lite launch -n 3 --protocol rss script.py`)")

    def digest(self) -> str:
        """Hash of the settings every party must share (checked in the handshake)."""
        shared = f"ring=64;precision={self.precision};provider={self.provider};" \
                 f"world_size={self.world_size};truncation={self.truncation};tls={bool(self.tls_dir)}" \
                 + (f";protocol={self.protocol}" if self.protocol != "additive" else "")
        return hashlib.sha256(shared.encode()).hexdigest()[:16]

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> "Config":
        """Read the configuration (overrides > environment > CRYPTEN_LITE_CONFIG file)."""
        env = os.environ if env is None else env
        values: dict[str, Any] = {}
        path = env.get(PREFIX + "CONFIG")
        if path:
            try:
                with open(path, "rb") as f:
                    values.update(tomllib.load(f))
            except (OSError, tomllib.TOMLDecodeError) as e:
                raise ConfigError(f"cannot read CRYPTEN_LITE_CONFIG file {path!r}: {e}") from e
        for field in dataclasses.fields(cls):
            key = PREFIX + field.name.upper()
            if key in env and env[key] != "":
                values[field.name] = env[key]
        values.update({k: v for k, v in overrides.items() if v is not None})
        unknown = set(values) - {f.name for f in dataclasses.fields(cls)}
        if unknown:
            raise ConfigError(f"unknown configuration keys {sorted(unknown)}")
        return cls(**{k: _coerce(k, v) for k, v in values.items()})


def _check_address(address: str) -> None:
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ConfigError(f"address {address!r} is not host:port (e.g. 10.0.0.2:50051)")


def _coerce(name: str, value: Any) -> Any:
    try:
        if name in ("rank", "world_size", "precision", "max_message_bytes", "max_model_bytes"):
            return int(value)
        if name == "timeout":
            return float(value)
        if name == "parties":
            if isinstance(value, str):
                return tuple(a.strip() for a in value.split(",") if a.strip())
            return tuple(value)
        return str(value)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"configuration value {name}={value!r} is not valid: {e}") from e


_current: Config | None = None


def get() -> Config:
    """The active configuration (the session's, else one read from the environment)."""
    return _current if _current is not None else Config.from_env()


def set_current(config: Config | None) -> None:
    """Install `config` as the active configuration (used by init/uninit)."""
    global _current
    _current = config


@contextlib.contextmanager
def override(**changes: Any) -> Iterator[Config]:
    """Temporarily replace fields of the active configuration (tests)."""
    global _current
    saved = _current
    _current = dataclasses.replace(get(), **changes)
    try:
        yield _current
    finally:
        _current = saved
