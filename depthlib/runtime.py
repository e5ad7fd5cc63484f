"""Process settings for long CPU runs, applied by the entry points (the CLI, executor units, chapter computes).

Importing a depthlib module never changes the process: :func:`configure_process` does, and only the entry points
call it. What it sets, and why (measured on this project's 2-core machines):

* ``OMP_WAIT_POLICY=PASSIVE`` (unless already set): with two OpenMP threads spin-waiting on a busy 2-core machine,
  every small op stalls (a smoke toy sweep took 62 s instead of 9.7 s; a tiny LM's training step 1.27 s instead of
  19 ms while another job ran). OpenMP reads it when torch loads its runtime, so it acts only when set before the
  first ``import torch`` (the CLI calls it first; executor workers inherit it). Passive waiting costs nothing idle.
* :func:`steady_malloc`: glibc returns freed blocks above its (dynamic) mmap threshold to the OS and faults them
  back in on the next allocation. In a 24,000-step toy calibration run this grew, after an hour, to 263 million
  minor page faults and 31 % of the process's CPU time in the kernel (0.36 s per step against 0.20 s for the same
  run resumed with a fixed threshold). A fixed threshold and no trimming keep the memory in the process.
* ``threads``: torch's CPU threads (torch's own default when None).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os
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


def configure_process(threads: int | None = None, *, name: str = "threads") -> None:
    """Set up this process for a long CPU run: passive OpenMP waiting (if not chosen already), steady glibc malloc,
    and ``threads`` torch CPU threads when given (InputError naming ``name`` unless an integer >= 1).

    Called by the entry points, never at import: the CLI's ``main``, each executor unit, the chapters' computes."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    steady_malloc()
    if threads is not None:
        from depthlib import validate
        threads = validate.int_in_range(name, threads, 1, 1024)
        import torch
        torch.set_num_threads(threads)
