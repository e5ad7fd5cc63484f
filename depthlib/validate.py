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


def model_files(name: str, model: str) -> None:
    """InputError, before any model is loaded or any run is touched, if ``model`` cannot be a model: a file rather
    than a folder, a folder without ``config.json``, a weights file that is truncated or corrupt (its safetensors
    header does not cover the file), a path (:func:`looks_like_path`) with no folder there, or a name that is neither
    an offline model, a folder nor a hub id."""
    import os
    from pathlib import Path

    from depthlib.models.loading import OFFLINE_MODELS
    if model in OFFLINE_MODELS:
        return
    path = Path(model).expanduser()
    if path.is_file():
        raise InputError(f"{name} {model!r} is a file: give a Hugging Face model folder (with config.json), one of "
                         f"{', '.join(OFFLINE_MODELS)}, or a hub id like EleutherAI/pythia-410m")
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise InputError(f"{name} folder {str(path)!r} has no config.json: it is not a Hugging Face model folder")
        for weights in sorted(path.glob("*.safetensors")):
            try:
                from safetensors import safe_open
                with safe_open(str(weights), "pt"):
                    pass
            except ImportError:
                return
            except Exception as err:  # noqa: BLE001 - SafetensorError and OSError alike: the file cannot be read
                first = (str(err).splitlines() or [type(err).__name__])[0]
                raise InputError(f"cannot read the weights {weights}: {first} (truncated or corrupt: copy or "
                                 "save the model again)") from None
        return
    if looks_like_path(model):
        raise InputError(f"{name} {model!r}: no model folder at {os.path.abspath(path)} (a local model is a Hugging "
                         "Face folder with config.json; a hub id is namespace/name, like EleutherAI/pythia-410m)")
    if "/" not in model:
        raise InputError(f"unknown model {model!r}: use one of {', '.join(OFFLINE_MODELS)}, a local Hugging Face "
                         "folder, or a hub id like EleutherAI/pythia-410m")


def looks_like_path(name: str) -> bool:
    """Whether ``name`` can only mean a local path, never a hub id (``namespace/name``): it starts with ``.``, ``/``
    or ``~``, has a backslash or more than one separator, or its first part is a folder here (``models/x``)."""
    import os
    if name.startswith((".", "/", "~", os.sep)) or "\\" in name or (os.altsep and os.altsep in name):
        return True
    parts = name.split(os.sep)
    return len(parts) > 2 or (len(parts) == 2 and os.path.isdir(parts[0]))


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


def enough_documents(corpus: str, n_docs: int, first: int = 0, first_flag: str = "--rank-docs") -> None:
    """InputError, before a run is opened, if ``corpus`` has fewer than ``first`` + ``n_docs`` documents (``--docs``
    after ``first`` others, e.g. the ranking documents of ``first_flag``): the run would use fewer than asked for,
    with a warning, and cache them under the settings asked for. The streamed fineweb corpus is not counted."""
    import warnings

    from depthlib import data
    need = first + n_docs
    if corpus == "fineweb":
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")             # the shortfall is this check's one line
        have = len(data.corpus(corpus, need))
    if have >= need:
        return
    asked = f"{first_flag} {first} + --docs {n_docs} ask" if first else f"--docs {n_docs} asks"
    fix = (f"ask for --docs {have - first} at most" if have > first else
           f"lower {first_flag} below {have}") if first else f"ask for at most {have}"
    raise InputError(f"{asked} for {need:,} documents, but corpus {corpus!r} has only {have}; {fix}")


def _model_config(model: str) -> dict | None:
    """The ``config.json`` of ``model`` (an offline model's converted folder, a local folder, or a hub id's copy in
    the local Hugging Face cache), or None where none is at hand without the network."""
    import json
    from pathlib import Path

    from depthlib.models.loading import OFFLINE_MODELS, ensure_converted
    if model in OFFLINE_MODELS:
        path = ensure_converted(model) / "config.json"
    elif Path(model).expanduser().is_dir():
        path = Path(model).expanduser() / "config.json"
    else:
        try:
            from huggingface_hub import try_to_load_from_cache
            found = try_to_load_from_cache(model, "config.json")
        except Exception:  # noqa: BLE001 - no hub package, a malformed id: the run says it on loading
            return None
        if not isinstance(found, str):
            return None
        path = Path(found)
    try:
        config = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return config if isinstance(config, dict) else None


def within_position_limit(model: str, max_length: int) -> None:
    """InputError, before any run is opened or any model loaded, if ``max_length`` tokens exceed the position limit
    ``model``'s config gives (``max_position_embeddings`` or ``n_positions``, as the loaded model is checked);
    where no config is at hand the run checks it once the model is loaded."""
    config = _model_config(model) or {}
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}
    limit = next((c.get(k) for c in (config, text) for k in ("max_position_embeddings", "n_positions")
                  if isinstance(c.get(k), int) and c.get(k) > 0), None)
    if limit is not None and max_length > limit:
        raise InputError(f"max_length {max_length} exceeds the model's position limit of {limit} tokens")
