"""Errors of the prediction service: each names its kind (the status its caller gets)."""

from __future__ import annotations

from ..errors import CryptenLiteError

KINDS = ("invalid", "unauthenticated", "too_large", "busy", "duplicate", "deadline",
         "unavailable", "cancelled", "internal")


class ServeError(CryptenLiteError):
    """A request that fails for its own client only; `kind` is one of KINDS."""

    def __init__(self, kind: str, message: str):
        if kind not in KINDS:
            raise ValueError(f"unknown serve error kind {kind!r}")
        super().__init__(message)
        self.kind = kind
