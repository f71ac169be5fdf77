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


THREAD_SCRIPT = r"""
import json, queue, resource, sys, threading, torch
if sys.argv[1] == "tuned":
    from crypten_lite.mpc.offline import tune_malloc
    tune_malloc()
handed, freed, faults = queue.SimpleQueue(), queue.SimpleQueue(), []
def receiver():  # as the transport's receiving thread: assembles a message, hands it over
    for _ in range(8):
        before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        buffer = torch.empty(16 << 20, dtype=torch.uint8)
        buffer.fill_(1)
        faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
        handed.put(buffer)
        del buffer
        freed.get()
thread = threading.Thread(target=receiver)  # started after tune_malloc, as the launcher does
thread.start()
for _ in range(8):  # the main thread computes with the message, then frees it
    buffer = handed.get()
    result = torch.empty(1_000_000, dtype=torch.int64).fill_(2)
    del buffer, result
    freed.put(None)
thread.join()
print(json.dumps(faults))
"""


def _thread_faults(mode: str) -> list[int]:
    out = subprocess.run([sys.executable, "-c", THREAD_SCRIPT, mode], capture_output=True, text=True,
                         timeout=120, check=True)
    return json.loads(out.stdout)


@pytest.mark.skipif(not _glibc(), reason="malloc tuning is glibc's mallopt")
def test_receiving_thread_reuses_freed_heap():
    # A 16 MB message assembled on another thread and freed on the main one: in the thread's
    # own arena (glibc's default) its 4,096 pages fault in again at most rounds; with the
    # threads sharing the main heap (tune_malloc's M_ARENA_MAX 1) they are reused.
    refaulted = lambda faults: sum(f > 1000 for f in faults[2:])  # noqa: E731
    tuned, untuned = _thread_faults("tuned"), _thread_faults("untuned")
    assert refaulted(tuned) <= 1, tuned
    assert refaulted(untuned) >= 3, ("glibc's defaults changed: the check above proves nothing", untuned)
