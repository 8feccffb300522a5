"""Keep freed chunk buffers in the process, so the next chunk reuses pages instead of faulting in new ones.

The pipeline allocates read buffers and packed outputs of tens to hundreds of MB per chunk. glibc serves
every block above its mmap threshold (at most 32 MB) with a fresh ``mmap`` and returns it with
``munmap`` when freed, so each chunk pays a page fault and a kernel zero-fill per 4 KB page before a
single byte is copied. On the 2-core development VM that fault-in cost was the larger part of every
layout's pack time (strided: 1.0 -> 2.0 GB/s with reuse; docs/PERF_LOG.md). Turning mmap allocation off
and never trimming the heap makes freed chunks go back to malloc's free lists, and the peak resident
size stays what the largest chunk set needs (chunks are bounded, so this stays bounded too).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4


@functools.cache
def keep_freed_memory() -> bool:
    """Switch glibc malloc to reuse freed large blocks (process-wide, idempotent).

    Returns False where the C library has no ``mallopt`` (not glibc): nothing changes there.
    """
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    # trim threshold first: a huge value keeps the top of the heap from being released after each chunk
    return bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1)) and bool(mallopt(_M_MMAP_MAX, 0))
