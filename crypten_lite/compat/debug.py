"""CrypTen's `crypten.debug`."""

import logging


def configure_logging() -> None:
    """Log INFO messages to stderr (CrypTen's default)."""
    logging.basicConfig(level=logging.INFO, format="%(levelname)s:%(name)s:%(message)s")
