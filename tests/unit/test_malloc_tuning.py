"""offline.tune_malloc: a party process keeps the heap its products free for the next one.

glibc's own trim threshold handed a product's freed temporaries (tens of MB) back to the OS
at every product, and the next product faulted each page in again. Counted in minor page
faults (deterministic for a given allocation pattern, independent of the machine's load), in
a fresh process so that the pytest process keeps glibc's defaults.
"""

from __future__ import annotations

import ctypes
import json
import platform
import subprocess
import sys

import pytest

SCRIPT = r"""
import json, resource, sys, torch
if sys.argv[1] == "tuned":
    from crypten_lite.mpc.offline import tune_malloc
    tune_malloc()
    tune_malloc()  # idempotent
faults = []
for _ in range(6):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    temporaries = [torch.ones(1_000_000, dtype=torch.int64) for _ in range(5)]  # 40 MB
    del temporaries  # freed together, as a product's temporaries are at its end
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps(faults))
"""


def _glibc() -> bool:
    try:
        return platform.system() == "Linux" and bool(ctypes.CDLL(None).mallopt) and \
            platform.libc_ver()[0] == "glibc"
    except (OSError, AttributeError):
        return False


def _faults(mode: str) -> list[int]:
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout)


@pytest.mark.skipif(not _glibc(), reason="malloc tuning is glibc's mallopt")
def test_tuned_process_reuses_freed_heap():
    first, *later = _faults("tuned")
    # 40 MB is about 10,000 pages: faulted in once, then reused (glibc's defaults fault them
    # in again at two to four of the next rounds until its threshold has grown: the untuned
    # check, so that this test can fail).
    assert first > 5_000
    assert sum(later) < first, (first, later)
    untuned_first, *untuned_later = _faults("untuned")
    assert sum(untuned_later) > untuned_first, "glibc's defaults changed: the check above proves nothing"
