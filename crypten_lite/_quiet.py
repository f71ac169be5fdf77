"""Quiet normal runs: notes that other libraries print about themselves, silenced narrowly.

Each entry names the logger or warning, the exact message it matches, and why nothing is lost:

- torchao (imported by transformers when building any model, and by the PT2E flow) tries to
  load its CUDA kernels (``_C_mxfp8``, ``_C_cutlass_90a``) at import; with a CPU build of torch
  they cannot load and it logs "Failed to load ...". None of them runs on a CPU.
- torchao registers Enum classes as pytree constants, which torch 2.13 deprecates for Enums
  (logged by torch.utils._pytree as "... is an Enum subclass and is now natively supported").
  That is torchao's call into torch, not the user's.
- torch's eager / FX quantization flows (crypten_lite.quantized.testing runs them for the user)
  create quantized tensors (torch.quint8 / qint8) and use observers with ``reduce_range``,
  both deprecated by torch 2.13: :func:`torch_ao_notes` silences those two warnings around
  those calls only. crypten_lite's own int8 code reads such models; it creates none.

Set CRYPTEN_LITE_LOG=DEBUG to see the filtered log records again.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import warnings
from typing import Iterator

_LOG_NOTES = {
    "torchao": re.compile(r"Failed to load .*torchao/_C\w*\.(cpython-\S+|abi3)\.so"),
    "torch.utils._pytree": re.compile(r"is an Enum subclass and is now natively supported"),
}
_TORCH_AO_WARNINGS = (
    r"torch\.quantize_per_tensor, torch\.quantize_per_channel and other quantized tensor creation",
    r"Please use quant_min and quant_max to specify the range for observers",
)


class _DropNotes(logging.Filter):
    def __init__(self, pattern: re.Pattern) -> None:
        super().__init__()
        self.pattern = pattern

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 (a record that cannot format is not ours to drop)
            return True
        return not self.pattern.search(text)


def install() -> None:
    """Add the log filters (once; not with CRYPTEN_LITE_LOG=DEBUG)."""
    if os.environ.get("CRYPTEN_LITE_LOG", "").upper() == "DEBUG":
        return
    for name, pattern in _LOG_NOTES.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropNotes) for f in logger.filters):
            logger.addFilter(_DropNotes(pattern))


@contextlib.contextmanager
def torch_ao_notes() -> Iterator[None]:
    """Silence torch's two deprecation warnings of its own eager / FX quantization flows."""
    with warnings.catch_warnings():
        for message in _TORCH_AO_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=UserWarning)
        yield
