"""CrypTen's `crypten.nn.functional`: crypten_lite.nn.functional on MPCTensors."""

from ...nn import functional as _core
from ..tensor import _forward

_NAMES = [n for n in dir(_core) if not n.startswith("_") and callable(getattr(_core, n))
          and getattr(getattr(_core, n), "__module__", "") == _core.__name__]
for _n in _NAMES:
    globals()[_n] = _forward(getattr(_core, _n))
