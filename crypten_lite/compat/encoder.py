"""CrypTen's FixedPointEncoder: x -> round(x * 2^precision_bits) as int64."""

import torch

from .. import encoding
from . import config as config_mod


class FixedPointEncoder:
    """Encodes floats at `precision_bits` fractional bits (cfg.encoder.precision_bits)."""

    def __init__(self, precision_bits: int | None = None):
        if precision_bits is None:
            precision_bits = int(config_mod.cfg.encoder.precision_bits)
        self._precision_bits = precision_bits
        self._scale = 2 ** precision_bits

    @property
    def scale(self) -> int:
        return self._scale

    def encode(self, x, device=None) -> torch.Tensor:
        return encoding.encode(torch.as_tensor(x), self._precision_bits)

    def decode(self, tensor: torch.Tensor) -> torch.Tensor:
        return encoding.decode(tensor, self._precision_bits, torch.float32)
