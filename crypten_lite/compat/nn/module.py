"""CrypTen's `crypten.nn.module`: the same classes as `crypten.nn` (CrypTen's module path)."""

from . import *  # noqa: F401,F403
from . import Graph, Module  # noqa: F401
