"""Running CrypTen-style multi-process unit tests on crypten_lite (the migration acceptance run).

    from crypten_lite.compat.testing import install_alias
    install_alias()              # `import crypten...` now loads crypten_lite.compat...

`MultiProcessTestCase` has CrypTen's test-harness interface (`rank`, `world_size`,
`setUp(world_size=...)`, every `test*` method run by each party) on crypten_lite's runner: each
test method runs in the parties of a persistent `crypten_lite.mpc.PartyPool` (separate
processes, real gRPC, plus the dealer for cfg.mpc.provider "TTP"), one pool per
(world_size, provider). A test module keeps CrypTen's imports when a file named
`test/multiprocess_test_case.py` re-exports these names. docs/crypten_migration.md describes
the run and its figures.
"""

from __future__ import annotations

import atexit
import importlib
import importlib.abc
import importlib.util
import os
import sys
import unittest
from functools import wraps

import torch

_ALIASES: dict[str, str] = {}


class _Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Loads `crypten` and `crypten.x.y` as `crypten_lite.compat` and `crypten_lite.compat.x.y`."""

    def find_spec(self, fullname, path, target=None):
        if fullname == "crypten" or fullname.startswith("crypten."):
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        name = spec.name
        target = _ALIASES.get(name) or "crypten_lite.compat" + name[len("crypten"):]
        try:
            return importlib.import_module(target)
        except ModuleNotFoundError:
            if any(k.startswith(name + ".") for k in _ALIASES):  # the parent of a stand-in
                import types
                package = types.ModuleType(name)
                package.__path__ = []
                return package
            raise

    def exec_module(self, module):
        pass


def install_alias(extra: dict[str, str] | None = None) -> None:
    """Make `import crypten` load crypten_lite.compat (by name only; `extra` maps further
    module names, e.g. stand-ins for CrypTen's private modules a test file imports)."""
    _ALIASES.update(extra or {})
    if not any(isinstance(f, _Alias) for f in sys.meta_path):
        sys.meta_path.insert(0, _Alias())


_POOLS: dict = {}


def _pool(world_size: int, provider: str, protocol: str = "additive"):
    from ..mpc.launcher import PartyPool
    key = (world_size, provider, protocol)
    if key not in _POOLS:
        timeout = float(os.environ.get("COMPAT_TEST_TIMEOUT", "60"))
        _POOLS[key] = PartyPool(world_size, provider=provider, timeout=timeout, protocol=protocol)
    return _POOLS[key]


@atexit.register
def _close_pools() -> None:
    for p in _POOLS.values():
        p.close()
    _POOLS.clear()


def get_random_test_tensor(max_value=6, min_value=None, size=(1, 5), is_float=False,
                           ex_zero=False, device=None):
    """Random test data, party 0's copy broadcast so that every party holds the same."""
    from . import communicator
    if min_value is None:
        min_value = -max_value
    if is_float:
        tensor = torch.rand(torch.Size(size)) * (max_value - min_value) + min_value  # insecure-ok: public test data
    else:
        tensor = torch.randint(min_value, max_value, torch.Size(size), dtype=torch.int64)  # insecure-ok: public test data
    if ex_zero:
        tensor[tensor == 0] = 1
    return communicator.get().broadcast(tensor, 0)


def onehot(indices, num_targets=None):
    if num_targets is None:
        num_targets = indices.max() + 1
    out = torch.zeros(indices.nelement(), num_targets, dtype=torch.long)
    out.scatter_(1, indices.view(indices.nelement(), 1), 1)
    return out


def get_random_linear(in_channels, out_channels):
    from . import communicator, is_initialized
    linear = torch.nn.Linear(in_channels, out_channels)
    if is_initialized():
        communicator.get().broadcast(linear.weight, 0)
        communicator.get().broadcast(linear.bias, 0)
    return linear


def _run_in_party(aliases: dict, module_name: str, class_name: str, test_name: str) -> str:
    """Each party: the alias, then build the test case, setUp, run the test body, tearDown."""
    from . import communicator
    install_alias(aliases)
    cls = getattr(importlib.import_module(module_name), class_name)
    case = cls(test_name)
    case.rank = communicator.get().get_rank()
    case.setUp()
    try:
        getattr(case, test_name)()
    finally:
        case.tearDown()
    return "ok"


class MultiProcessTestCase(unittest.TestCase):
    """CrypTen's MultiProcessTestCase interface on crypten_lite's PartyPool."""

    MAIN_PROCESS_RANK = -1
    DEFAULT_DEVICE = "cpu"

    @property
    def world_size(self) -> int:
        return self._world_size

    @staticmethod
    def join_or_run(fn):
        @wraps(fn)
        def wrapper(self):
            if self.rank == self.MAIN_PROCESS_RANK:
                from .config import protocol_name, provider_name
                pool = _pool(self._world_size, provider_name(), protocol_name())
                pool.run(_run_in_party, dict(_ALIASES), type(self).__module__,
                         type(self).__name__, self._testMethodName)
            else:
                fn(self)
        return wrapper

    @classmethod
    def setUpClass(cls):
        for attr in dir(cls):
            if attr.startswith("test"):
                fn = getattr(cls, attr)
                if not getattr(fn, "_runs_in_parties", False):
                    wrapped = cls.join_or_run(fn)
                    wrapped._runs_in_parties = True
                    setattr(cls, attr, wrapped)

    def __init__(self, methodName: str = "runTest"):
        super().__init__(methodName)
        self.device = torch.device(self.DEFAULT_DEVICE)
        self.rank = self.MAIN_PROCESS_RANK
        self._world_size = 2

    def setUp(self, world_size: int = 2):
        super().setUp()
        self._world_size = world_size
        self.default_tolerance = 0.5
