"""CrypTen's `crypten.common` helpers that user code imports."""

from . import serial, tensor_types  # noqa: F401
