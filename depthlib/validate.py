"""Validators shared by the library and the CLI: bad input becomes one :class:`InputError` line naming what is
wrong (the CLI turns it into exit status 2). The CLI validates only through these and the library's own checks."""
from __future__ import annotations

import math
from typing import Iterable

from depthlib.errors import InputError


def resolve_device(device: str | None):
    """'cpu', 'cuda' or 'cuda:N' as a torch.device; None picks cpu. InputError if CUDA is asked for but absent."""
    import torch
    device = "cpu" if device is None else str(device)
    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            raise InputError(f"device {device!r} requested but torch sees no CUDA device")
        try:
            dev = torch.device(device)
        except RuntimeError:
            raise InputError(f"device must be cpu, cuda or cuda:N, got {device!r}") from None
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise InputError(f"device {device!r}: only {torch.cuda.device_count()} CUDA device(s) present")
        return dev
    if device != "cpu":
        raise InputError(f"device must be cpu, cuda or cuda:N, got {device!r}")
    return torch.device("cpu")


def finite(name: str, value: float) -> float:
    """``value`` as a float, or InputError if it is NaN or infinite."""
    value = float(value)
    if not math.isfinite(value):
        raise InputError(f"{name} must be a finite number, got {value:g}")
    return value


def int_in_range(name: str, value: int, lo: int, hi: int | None = None) -> int:
    """An integer in [lo, hi] (hi None: unbounded), or InputError naming the range."""
    if isinstance(value, bool) or int(value) != value:
        raise InputError(f"{name} must be an integer, got {value!r}")
    value = int(value)
    if value < lo or (hi is not None and value > hi):
        bound = f">= {lo}" if hi is None else f"in [{lo}, {hi}]"
        raise InputError(f"{name} must be {bound}, got {value}")
    return value


def distinct(name: str, values: Iterable, at_least: int = 1) -> list:
    """The values, or InputError if some repeat or there are fewer than ``at_least``."""
    values = list(values)
    if len(set(values)) != len(values):
        dupes = sorted({v for v in values if values.count(v) > 1})
        raise InputError(f"{name} has duplicates: {', '.join(map(str, dupes))}")
    if len(values) < at_least:
        raise InputError(f"{name} needs at least {at_least} distinct values, got {len(values)}")
    return values


def accessible(name: str, path) -> None:
    """InputError if ``path`` (a file or folder the user named) exists but may not be read: every folder on the way
    must be searchable and the path itself readable. A path that does not exist is left to its reader to report."""
    import os
    from pathlib import Path
    path = Path(path).expanduser()
    try:
        path.stat()
    except PermissionError:
        raise InputError(f"cannot read {name} {path}: permission denied (on a folder on its way)") from None
    except OSError:
        return
    mode = os.R_OK | (os.X_OK if path.is_dir() else 0)
    if not os.access(path, mode):
        raise InputError(f"cannot read {name} {path}: permission denied")


def available_memory(device: str = "cpu") -> int | None:
    """Bytes that can still be allocated on ``device``: the free memory of a CUDA device, else the machine's available
    memory (``MemAvailable`` of /proc/meminfo, or free pages where there is none), or less where this process's
    cgroup (a container, a SLURM job) allows less; None where nothing tells."""
    import os
    if str(device).startswith("cuda"):
        import torch
        return int(torch.cuda.mem_get_info(torch.device(device))[0])
    free = []
    try:
        with open("/proc/meminfo") as f:
            free += [int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:")]
    except OSError:
        pass
    if not free:
        try:
            free.append(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
        except (ValueError, OSError, AttributeError):
            pass
    try:
        with open("/proc/self/cgroup") as f:    # "0::/path" (cgroup v2), "N:...memory...:/path" (v1)
            groups = [line.rstrip("\n").split(":", 2) for line in f]
    except OSError:
        groups = []
    for _, controllers, path in (g for g in groups if len(g) == 3):
        v2 = not controllers
        if not v2 and "memory" not in controllers.split(","):
            continue
        folder = f"/sys/fs/cgroup{'' if v2 else '/memory'}{path}"
        limit, used = ("memory.max", "memory.current") if v2 else ("memory.limit_in_bytes", "memory.usage_in_bytes")
        try:
            with open(f"{folder}/{limit}") as a, open(f"{folder}/{used}") as b:
                free.append(int(a.read()) - int(b.read()))
        except (OSError, ValueError):       # no such file, or "max": no limit
            pass
    return min(free) if free else None


def _bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.1f} {unit}"
        n /= 1024


def fits_in_memory(what: str, need: float, device: str = "cpu", fix: str = "") -> None:
    """InputError, before allocating, if ``what`` would need ``need`` bytes, more than :func:`available_memory` on
    ``device`` (the message says both, and ``fix``)."""
    free = available_memory(device)
    if free is not None and need > free:
        raise InputError(f"{what} would need about {_bytes(need)} of memory, more than the {_bytes(free)} available "
                         f"{'on ' + str(device) if str(device).startswith('cuda') else 'here'}"
                         + (f"; {fix}" if fix else ""))
