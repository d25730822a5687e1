"""The router process's heap: large blocks go back to the system when freed.

glibc serves a large allocation from its own mapping and returns it on free, but each such free
raises the size below which it uses the shared heap instead (up to 32 MiB), and the shared heap
keeps what it frees. A ring change allocates a new list of buckets (1 MB) and frees the old
one, and a first build stages its points in flat arrays (8 bytes a point: 33 MB at 1,000
members). Fixing the threshold keeps each such block in a mapping of its own. Measured by
``reins bench ring`` (``rss_mb_at_1000``); design: ``docs/adr/0190-incremental-ring.md``.
"""

from __future__ import annotations

import ctypes
import ctypes.util

M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter number
LARGE_BLOCK_BYTES = 128 * 1024  # glibc's default threshold, now fixed


def return_large_blocks() -> bool:
    """Fix glibc's mapping threshold at its default, for this process; False where the C
    library is not glibc (nothing changes). Call once at process start."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, LARGE_BLOCK_BYTES))
