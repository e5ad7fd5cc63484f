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
    header does not cover the file), or a name that is neither an offline model, a folder nor a hub id."""
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
    if "/" not in model:
        raise InputError(f"unknown model {model!r}: use one of {', '.join(OFFLINE_MODELS)}, a local Hugging Face "
                         "folder, or a hub id like EleutherAI/pythia-410m")
