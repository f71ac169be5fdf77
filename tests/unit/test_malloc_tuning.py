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
import ctypes, os, sys, tempfile, threading
if sys.argv[1] == "tuned":
    from crypten_lite.mpc.offline import tune_malloc
    tune_malloc()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.fopen.restype = ctypes.c_void_p
libc.fopen.argtypes = [ctypes.c_char_p, ctypes.c_char_p]
libc.fclose.argtypes = [ctypes.c_void_p]
libc.malloc_info.argtypes = [ctypes.c_int, ctypes.c_void_p]
held = []
def receiver():  # as the transport's receiving thread: allocates a message's buffer
    held.append(libc.malloc(1 << 16))
thread = threading.Thread(target=receiver)  # started after tune_malloc, as the launcher does
thread.start()
thread.join()
path = os.path.join(tempfile.mkdtemp(), "malloc_info.xml")
f = libc.fopen(path.encode(), b"w")
libc.malloc_info(0, f)
libc.fclose(f)
print(open(path).read().count("<heap nr="))  # glibc's arenas ("heaps" in its XML)
"""


def _arenas_after_a_thread_allocates(mode: str) -> int:
    out = subprocess.run([sys.executable, "-c", THREAD_SCRIPT, mode], capture_output=True, text=True,
                         timeout=120, check=True)
    return int(out.stdout)


@pytest.mark.skipif(not _glibc(), reason="malloc tuning is glibc's mallopt")
def test_receiving_thread_allocates_from_the_main_heap():
    # A message assembled on the transport's thread and freed on the main one: in the thread's
    # own arena (glibc's default) its 16 MB buffer was faulted in again at most products
    # (docs/ARCHITECTURE.md, mul 1M's stage profile); with every thread on the main heap
    # (tune_malloc's M_ARENA_MAX 1) the main heap's trim threshold keeps it for the next one.
    # Counted as glibc's arenas after a thread has allocated (malloc_info): deterministic,
    # where the page faults of a threaded allocation pattern vary with the threads' timing.
    assert _arenas_after_a_thread_allocates("tuned") == 1
    assert _arenas_after_a_thread_allocates("untuned") >= 2, "glibc's defaults changed: the check above proves nothing"
