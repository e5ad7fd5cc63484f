"""Process settings for long CPU runs (measured on this project's 2-core machines; see docs/toy-performance.md §0).

* :func:`steady_malloc`: glibc returns freed blocks above its (dynamic) mmap threshold to the OS and faults them
  back in on the next allocation. In a 24,000-step toy calibration run this grew, after an hour, to 263 million
  minor page faults and 31 % of the process's CPU time in the kernel (0.36 s per step against 0.20 s for the same
  run resumed with a fixed threshold). A fixed threshold and no trimming keep the memory in the process.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import sys

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3      # glibc mallopt parameters (malloc.h)
_DONE = False


def steady_malloc(threshold: int = 1 << 30) -> bool:
    """Tell glibc malloc to keep freed memory below ``threshold`` bytes in the process (fixed mmap threshold,
    no trimming). Returns whether it applied (False off glibc, e.g. macOS or musl). Idempotent."""
    global _DONE
    if _DONE:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    threshold = min(int(threshold), 2**31 - 1)
    _DONE = bool(mallopt(_M_MMAP_THRESHOLD, threshold)) and bool(mallopt(_M_TRIM_THRESHOLD, threshold))
    return _DONE
