"""tests/torchvision: run only where torchvision imports (scripts/test_torchvision.sh).

The main environment's torch is a CPU build that torchvision's C++ ops cannot load, so
torchvision lives in a separate virtual environment; everywhere else these tests are
skipped, with that reason. Party processes never import torchvision unless they build a
model (only the model owner does).
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))


def _torchvision_error() -> str | None:
    try:
        import torchvision  # noqa: F401
        from torchvision.models import resnet18
        resnet18()
    except Exception as e:  # not installed, or installed against another torch
        return f"{type(e).__name__}: {str(e)[:200]}"
    return None


def pytest_collection_modifyitems(config, items):
    here = os.path.dirname(__file__)
    mine = [item for item in items if str(item.fspath).startswith(here)]
    if not mine:
        return
    error = _torchvision_error()
    for item in mine:
        item.add_marker(pytest.mark.torchvision)
        if error is not None:
            item.add_marker(pytest.mark.skip(reason=(
                "torchvision is not usable in this environment (" + error + "); the main "
                "environment's CPU torch cannot load torchvision's C++ ops: run "
                "scripts/test_torchvision.sh (a separate venv with torch and torchvision)")))
