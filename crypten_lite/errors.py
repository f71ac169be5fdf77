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


# -- uncaught errors: the message, not the traceback -----------------------------------------
TRACEBACK_ENV = "CRYPTEN_LITE_TRACEBACK"


def report_uncaught(exc_type, exc, tb, fallback) -> None:
    """Print an uncaught crypten_lite error as where it stopped the script and its message
    (two lines, the message last); with CRYPTEN_LITE_TRACEBACK=1, or for any other exception,
    `fallback` (the previous sys.excepthook) prints the whole traceback."""
    import os
    import sys
    import traceback

    if not (isinstance(exc_type, type) and issubclass(exc_type, CryptenLiteError)) \
            or os.environ.get(TRACEBACK_ENV) == "1":
        fallback(exc_type, exc, tb)
        return
    import sysconfig

    # the user's own code: not crypten_lite, not the standard library or installed packages
    skip = tuple({os.path.dirname(os.path.abspath(__file__)) + os.sep}
                 | {os.path.abspath(p) + os.sep for k, p in sysconfig.get_paths().items()
                    if k in ("stdlib", "platstdlib", "purelib", "platlib")})
    frames = [f for f in traceback.extract_tb(tb) if not os.path.abspath(f.filename).startswith(skip)]
    where = f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""
    print(f"crypten_lite: stopped{where} ({TRACEBACK_ENV}=1 prints the traceback):",
          "".join(traceback.format_exception_only(exc_type, exc)).rstrip("\n"),
          sep="\n", file=sys.stderr, flush=True)
