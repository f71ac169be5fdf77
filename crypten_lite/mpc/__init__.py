"""Multi-party protocols on secret shares, and the local launcher."""

from .launcher import PartyFailure, PartyPool, run_multiprocess

__all__ = ["PartyPool", "PartyFailure", "run_multiprocess"]
