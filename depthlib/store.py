"""The run store (design: Data flow): a run is a folder of tidy tables and a manifest, written atomically.

Layout::

    <root>/<experiment>/<key>/manifest.json      what produced it: profile, config, commit, code fingerprint,
                                                 versions, device, seed, wall time, and a checksum per table
    <root>/<experiment>/<key>/<table>.parquet    tidy tables, one row per measurement

``<key>`` is a hash of the run's config (:func:`config_key`). Every file is written through one atomic writer
(:func:`atomic_write`, :func:`atomic_folder`, :func:`atomic_torch_save`): a crash never leaves half a file.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import pandas as pd

from depthlib import paths
from depthlib.errors import InputError
from depthlib.fingerprints import (
    code_fingerprint,
    compute_modules,
    device_description,
    environment_versions,
    git_edits,
)

#: a run's wall time so far while it is computed (private to this module: :func:`computing` removes it)
PROGRESS = "progress.json"




class CorruptRunError(InputError):
    """A run folder whose manifest or tables cannot be read or fail their checksum."""


#: the damaged run folders this process has reported and not yet repaired (:func:`say_damaged`)
_DAMAGE_SAID: set[str] = set()


def note(line: str) -> None:
    """One line on stderr, on a line of its own (after a progress bar that left its line open, where stderr tells:
    the command line's stderr does)."""
    import sys
    err = sys.stderr
    print(("" if getattr(err, "at_line_start", True) else "\n") + line, file=err, flush=True)


def say_damaged(folder: str | os.PathLike, line: str) -> None:
    """Say ``line`` about the damaged run ``folder``, unless this process said one already: a damaged run is reported
    in one line, though the choice of a chapter's run may meet it several times and the lifecycle then repairs it
    (:func:`damage_repaired`)."""
    key = os.path.abspath(folder)
    if key not in _DAMAGE_SAID:
        _DAMAGE_SAID.add(key)
        note(line)


def damage_repaired(folder: str | os.PathLike) -> bool:
    """Whether the damaged run ``folder``, now repaired, was reported already (:func:`say_damaged`); a later damage of
    it is reported again."""
    key = os.path.abspath(folder)
    said = key in _DAMAGE_SAID
    _DAMAGE_SAID.discard(key)
    return said


def normalise(config: dict[str, Any]) -> dict[str, Any]:
    """A config as it reads back from JSON (tuples become lists), so stored and fresh configs compare equal."""
    return json.loads(json.dumps(config, sort_keys=True, default=str))


def config_key(config: dict[str, Any]) -> str:
    """Stable 12-hex-digit hash of a JSON-able config (key order does not matter)."""
    blob = json.dumps(config, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


_DIGESTS: dict[tuple[str, int, int], str] = {}


def file_sha256(path: str | os.PathLike) -> str:
    """sha256 of a file's bytes, cached by (resolved path, size, mtime) in memory and in
    ``<cache>/fingerprints.json``, so a model's gigabyte of weights is hashed once, not on every call."""
    path = Path(path).resolve()
    st = path.stat()
    mem_key = (str(path), st.st_size, st.st_mtime_ns)
    if mem_key in _DIGESTS:
        return _DIGESTS[mem_key]
    store = paths.cache_dir() / "fingerprints.json"
    disk_key = f"{path}|{st.st_size}|{st.st_mtime_ns}"
    try:
        known = json.loads(store.read_text())
        known = known if isinstance(known, dict) else {}
    except (OSError, ValueError):
        known = {}
    digest = known.get(disk_key)
    if not (isinstance(digest, str) and len(digest) == 64):
        digest = _sha256(path)
        known = {k: v for k, v in known.items() if not k.startswith(f"{path}|")}
        known[disk_key] = digest
        try:
            atomic_write(store, lambda tmp: tmp.write_text(json.dumps(known, sort_keys=True)))
        except OSError:
            pass   # a read-only cache only costs hashing again next time
    _DIGESTS[mem_key] = digest
    return digest


def atomic_write(final: Path, write: Callable[[Path], None]) -> None:
    """Write via a temporary file in the same folder and rename; the temporary file never outlives a failure."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f"{final.name}.tmp{os.getpid()}")
    try:
        write(tmp)
        os.replace(tmp, final)
    except OSError as err:
        if err.filename is None and err.errno:   # pyarrow names no file: name the one that could not be written
            raise OSError(err.errno, err.strerror or str(err), str(final)) from err
        raise
    finally:
        tmp.unlink(missing_ok=True)


def atomic_folder(final: Path, write: Callable[[Path], None]) -> Path:
    """Write a folder via a temporary sibling folder and swap it in with a rename: readers see the old folder or the
    whole new one, never half of it; the temporary folder never outlives a failure. Returns ``final``."""
    final = Path(final)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.with_name(f".{final.name}.tmp{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        write(tmp)
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return final


def atomic_torch_save(path: Path, state: dict) -> None:
    """``torch.save`` a checkpoint atomically: a crash leaves the previous checkpoint, never a truncated one."""
    import torch
    atomic_write(Path(path), lambda tmp: torch.save(state, tmp))


def _finite_or_null(obj: Any, where: str, undefined: list[str]) -> Any:
    """``obj`` with every NaN or ±inf float replaced by None (JSON null), its dotted key appended to ``undefined``:
    a manifest says a number is undefined, never fails to be written (strict JSON has no NaN)."""
    if isinstance(obj, dict):
        return {k: _finite_or_null(v, f"{where}.{k}" if where else str(k), undefined) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite_or_null(v, f"{where}[{i}]", undefined) for i, v in enumerate(obj)]
    if isinstance(obj, float) and not math.isfinite(obj):
        undefined.append(where)
        return None
    return obj


@dataclass
class Run:
    """One run of one experiment under one config: a folder of tables and a manifest."""

    experiment: str
    config: dict[str, Any]
    path: Path

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Run":
        """The run in the folder ``path`` (``<root>/<experiment>/<key>``) with the config its manifest records."""
        path = Path(path)
        run = cls(path.parent.name, {}, path)
        run.config = run.manifest.get("config", {})
        return run

    @property
    def key(self) -> str:
        return self.path.name

    # -- tables ---------------------------------------------------------------------------------
    def table_path(self, name: str) -> Path:
        return self.path / f"{name}.parquet"

    def has(self, name: str) -> bool:
        """A readable table ``name`` exists (a truncated file left by a crash counts as absent and is removed)."""
        path = self.table_path(name)
        if not path.exists():
            return False
        try:
            import pyarrow.parquet as pq
            pq.read_metadata(path)
            return True
        except Exception:  # noqa: BLE001 - any unreadable file is recomputed
            path.unlink(missing_ok=True)
            return False

    def write_table(self, name: str, df: pd.DataFrame) -> Path:
        """Write a tidy table atomically (a crash never leaves half a file behind)."""
        final = self.table_path(name)
        atomic_write(final, lambda tmp: df.to_parquet(tmp, index=False))
        return final

    def table(self, name: str) -> pd.DataFrame:
        path = self.table_path(name)
        if not path.exists():
            raise FileNotFoundError(f"run {self.experiment}/{self.key} has no table '{name}'")
        try:
            return pd.read_parquet(path)
        except Exception as err:  # noqa: BLE001 - report in the user's terms
            raise CorruptRunError(f"table {path} is unreadable ({type(err).__name__}); recompute the run") from None

    def tables(self, prefix: str = "") -> list[str]:
        return sorted(p.stem for p in self.path.glob(f"{prefix}*.parquet"))

    # -- manifest -------------------------------------------------------------------------------
    @property
    def manifest(self) -> dict[str, Any]:
        path = self.path / "manifest.json"
        if not path.exists():
            return {}
        try:
            info = json.loads(path.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise CorruptRunError(f"run folder {self.path} has an unreadable manifest.json") from None
        if not isinstance(info, dict):
            raise CorruptRunError(f"run folder {self.path} has a manifest.json that is not a JSON object")
        return info

    @property
    def complete(self) -> bool:
        return self.manifest.get("status") == "complete"

    @property
    def profile(self) -> str | None:
        return self.manifest.get("profile")

    @property
    def committed(self) -> bool:
        root = paths.committed_results_dir()
        return root is not None and self.path.resolve().is_relative_to(root.resolve())

    @property
    def stale(self) -> bool:
        """The code that computed this run differs from the current code (or was not recorded)."""
        m = self.manifest
        modules = m.get("code_modules")
        if not modules or "code_fingerprint" not in m:
            return True
        try:
            return code_fingerprint(modules) != m["code_fingerprint"]
        except InputError:
            return True

    def validate(self) -> "Run":
        """Check that the manifest reads and every table it lists exists with its checksum; else CorruptRunError."""
        m = self.manifest
        for name, info in m.get("tables", {}).items():
            path = self.table_path(name)
            if not path.exists() or _sha256(path) != info.get("sha256"):
                raise CorruptRunError(f"run folder {self.path}: table {name} is missing or fails its checksum")
        return self

    def finish(self, *, profile: str, seed: int | None, wall_time_s: float, code: Sequence[str],
               device: str | None = None, **extra: Any) -> dict[str, Any]:
        """Mark the run complete and record what produced it: ``code`` names the compute entries (``module:function``,
        or modules) that computed it, and the manifest records the modules derived from them (:func:`compute_modules`)
        with their fingerprint."""
        modules = compute_modules(*code)
        sha, edited = git_edits()
        dirty = bool(edited) if sha else None
        manifest = {
            "experiment": self.experiment,
            "key": self.key,
            "status": "complete",
            "profile": profile,
            "config": self.config,
            "seed": seed,
            "wall_time_s": round(float(wall_time_s), 3),
            "device": device_description(device),
            "git_sha": sha,
            "git_dirty": dirty,
            **({"git_edited_files": edited} if edited else {}),
            "code_entries": sorted(set(code)),
            "code_modules": list(modules),
            "code_fingerprint": code_fingerprint(modules),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "versions": environment_versions(),
            "tables": {p.stem: {"sha256": _sha256(p), "bytes": p.stat().st_size}
                       for p in sorted(self.path.glob("*.parquet"))},
            **extra,
        }
        undefined: list[str] = []
        manifest = _finite_or_null(manifest, "", undefined)
        if undefined:
            warnings.warn(f"run {self.path}: {', '.join(undefined)} not finite (NaN or inf): stored as null",
                          stacklevel=2)
        text = json.dumps(manifest, indent=2, sort_keys=True, default=str, allow_nan=False)
        atomic_write(self.path / "manifest.json", lambda tmp: tmp.write_text(text + "\n"))
        return manifest

    def elapsed_before(self) -> float:
        """Wall time spent in earlier, interrupted segments of this run (``progress.json``), in seconds."""
        path = self.path / PROGRESS
        try:
            return float(json.loads(path.read_text()).get("wall_time_s", 0.0))
        except (OSError, ValueError, json.JSONDecodeError):
            return 0.0

    def record_elapsed(self, seconds: float) -> None:
        """Save the total wall time so far, so a resumed run's manifest counts every segment."""
        atomic_write(self.path / PROGRESS,
                      lambda tmp: tmp.write_text(json.dumps({"wall_time_s": round(seconds, 3)})))


def open_run(experiment: str, config: dict[str, Any], root: Path | None = None) -> Run:
    """The run folder for (experiment, config) in the local cache; created on first write.

    Re-opening the same config returns the same folder, so a resumed run finds its finished tables.
    """
    root = paths.local_results_dir() if root is None else Path(root)
    return Run(experiment, normalise(config), root / experiment / config_key(config))
