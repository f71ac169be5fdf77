"""CrypTen's `crypten.mpc.ptype` module."""

from ..tensor import ptype

__all__ = ["ptype"]
