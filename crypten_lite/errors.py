"""Exception hierarchy of crypten_lite.

Every error a user can meet derives from :class:`CryptenLiteError`; messages name the party,
the operation, the shapes and what to do. Secrets (shares, seeds, plaintext values) never
appear in a message.
"""

from __future__ import annotations


class CryptenLiteError(Exception):
    """Base class of every crypten_lite error."""


class ConfigError(CryptenLiteError):
    """Invalid or inconsistent configuration (environment, TOML file, party list...)."""


class CommunicationError(CryptenLiteError):
    """A peer or the dealer is unreachable, dead, too slow, or sent something invalid."""

    def __init__(self, message: str, peer: int | str | None = None):
        super().__init__(message)
        self.peer = peer


class ProtocolError(CryptenLiteError):
    """The parties disagree (shapes, op sequence) or a value is outside the supported range."""


class UnsupportedError(CryptenLiteError):
    """An operation, layer or model node that crypten_lite does not support."""


class NotInitializedError(CryptenLiteError):
    """An operation that needs a session was called before :func:`crypten_lite.init`."""
