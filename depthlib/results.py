"""Results cache and THE rule for which run a chapter shows (design: Data flow, Profiles).

Layout::

    <root>/<experiment>/<key>/manifest.json      what produced it: profile, config, commit, code fingerprint,
                                                 versions, device, seed, wall time, and a checksum per table
    <root>/<experiment>/<key>/<table>.parquet    tidy tables, one row per measurement

Two roots: committed runs (``data/results`` of a checkout, :func:`depthlib.paths.committed_results_dir`) and
local runs (``<cache>/results``). New runs are written to the local cache, table by table and atomically, so a
long run saves as it goes and resumes after an interruption; :func:`commit_run` copies a finished run into
``data/results``.

Provenance cannot lie: a run records the **code fingerprint** of the modules that computed its numbers (a hash
of their syntax trees without docstrings, so comments and docs do not count). A run whose fingerprint differs
from the current code's is *stale*; the chapter shows it with a visible warning, ``--rerun`` recomputes it, and
``tests/test_committed_runs.py`` fails on a stale committed run and replays a cheap prefix of every fresh one.
"""
from __future__ import annotations

import ast
import hashlib
import importlib.util
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

import pandas as pd

from depthlib import paths
from depthlib.errors import InputError

#: The profiles, best first (design: Profiles). ``custom`` marks a run with overridden settings (CLI flags).
PROFILE_RANK = ("paper", "cpu", "smoke")
CUSTOM = "custom"
#: a run's wall time so far while it is computed (private to this module: :func:`computing` removes it)
PROGRESS = "progress.json"


class CorruptRunError(InputError):
    """A run folder whose manifest or tables cannot be read or fail their checksum."""


def check_profile(profile: str) -> str:
    if profile not in PROFILE_RANK:
        raise InputError(f"unknown profile {profile!r}; use one of {', '.join(PROFILE_RANK[::-1])}")
    return profile


def shown_profiles(profile: str) -> tuple[str, ...]:
    """Which profiles a chapter built for ``profile`` may show: ``smoke`` only smoke (so the committed notebook
    outputs are reproducible), ``cpu`` a paper or a cpu run, ``paper`` only a paper run."""
    check_profile(profile)
    return ("smoke",) if profile == "smoke" else PROFILE_RANK[: PROFILE_RANK.index(profile) + 1]


# ---- keys and fingerprints ------------------------------------------------------------------------------
def normalise(config: dict[str, Any]) -> dict[str, Any]:
    """A config as it reads back from JSON (tuples become lists), so stored and fresh configs compare equal."""
    return json.loads(json.dumps(config, sort_keys=True, default=str))


def config_key(config: dict[str, Any]) -> str:
    """Stable 12-hex-digit hash of a JSON-able config (key order does not matter)."""
    blob = json.dumps(config, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _strip_docstrings(tree: ast.AST) -> ast.AST:
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant) \
                    and isinstance(body[0].value.value, str):
                node.body = body[1:] or [ast.Pass()]
    return tree


@lru_cache(maxsize=None)
def _module_digest(module: str) -> str:
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise InputError(f"cannot fingerprint {module!r}: no Python source found")
    tree = _strip_docstrings(ast.parse(Path(spec.origin).read_text(encoding="utf-8")))
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest()


#: Modules that orchestrate, store, validate or draw, never compute a run's numbers: the derived code of a run
#: (:func:`compute_modules`) leaves them out, so moving glue never makes a run stale. ``*.chapter`` (a chapter's
#: profiles, the calls its runs make, replay, describe), ``*.shards`` (units of work whose merge is tested to equal the
#: one-process run bit for bit) and ``depthlib.plots.*`` (figures drawn from the tables) are glue by their role.
#: ``depthlib.finite`` checks numbers a run produced (it stops a run, or nulls a value with a warning, where one is
#: not finite) and never changes a finite one: a validator, as ``depthlib.validate``. ``depthlib.inputs`` decides which
#: run a key finds (what a model and a corpus are), never a run's numbers.
GLUE_MODULES = frozenset({
    "depthlib", "depthlib.errors", "depthlib.results", "depthlib.executors", "depthlib.paths", "depthlib.validate",
    "depthlib.finite", "depthlib.runtime", "depthlib.cli", "depthlib.book", "depthlib.chapters", "depthlib.contract",
    "depthlib.plots", "depthlib.inputs",
})
GLUE_SUFFIXES = (".chapter", ".shards")


def is_glue(module: str) -> bool:
    """Whether ``module`` orchestrates rather than computes (:data:`GLUE_MODULES`, ``*.chapter``, ``*.shards``,
    ``depthlib.plots.*``)."""
    return (module in GLUE_MODULES or module.endswith(GLUE_SUFFIXES) or module.startswith("depthlib.plots."))


@lru_cache(maxsize=None)
def _module_tree(module: str) -> tuple[ast.Module, bool]:
    """(syntax tree, is a package) of a depthlib module's source."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        raise InputError(f"cannot read {module!r}: no Python source found")
    return ast.parse(Path(spec.origin).read_text(encoding="utf-8")), spec.submodule_search_locations is not None


def _is_module(name: str) -> bool:
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _defining_module(module: str, name: str, seen: frozenset = frozenset()) -> str:
    """The module whose code defines ``name`` as imported by ``from module import name``: a submodule of that name,
    else the module a re-export (``from X import name`` at the top of ``module``) comes from, else ``module``."""
    if _is_module(f"{module}.{name}"):
        return f"{module}.{name}"
    if (module, name) in seen:
        return module
    tree, _ = _module_tree(module)
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").startswith("depthlib"):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    return _defining_module(node.module, alias.name, seen | {(module, name)})
    return module


def _imported_modules(module: str) -> set[str]:
    """The depthlib modules whose code ``module`` uses: every ``import depthlib.x`` and ``from depthlib.x import y``
    anywhere in it (functions included), a name resolved to the module that defines it (:func:`_defining_module`)."""
    tree, is_package = _module_tree(module)
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name == "depthlib" or a.name.startswith("depthlib.")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:                                      # relative: resolve against this module's package
                parts = module.split(".")
                base = parts if is_package else parts[:-1]
                base = base[: len(base) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            if source == "depthlib" or source.startswith("depthlib."):
                out |= {_defining_module(source, a.name) for a in node.names if a.name != "*"} or {source}
    return out - {module}


def compute_modules(*entries: str | Sequence[str]) -> tuple[str, ...]:
    """The modules whose code decides the numbers of a run computed by ``entries`` (dotted names, a module or
    ``module:function``, or a tuple of them where a run's numbers come from several functions): the entry modules
    and, transitively, the depthlib modules they import, restricted to modules that compute (:func:`is_glue` ones
    are neither counted nor followed, except an entry itself, whose imports are followed). This is what a run's
    manifest records under ``code_modules`` and fingerprints."""
    flat = [e for entry in entries for e in ((entry,) if isinstance(entry, str) else entry)]
    found: set[str] = set()
    todo: list[tuple[str, bool]] = [(e.split(":")[0], True) for e in flat]
    seen: set[str] = set()
    while todo:
        module, entry = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        if is_glue(module) and not entry:
            continue
        if not is_glue(module):
            found.add(module)
        todo += [(m, False) for m in _imported_modules(module)]
    return tuple(sorted(found))


def code_fingerprint(modules: Sequence[str]) -> str:
    """12 hex digits identifying the code of ``modules`` (dotted names): their syntax trees without docstrings.

    Formatting, comments and docstrings do not change it; any change to what the code does does."""
    h = hashlib.sha256()
    for module in sorted(set(modules)):
        h.update(f"{module}:{_module_digest(module)}\n".encode())
    return h.hexdigest()[:12]


def git_state() -> tuple[str | None, bool | None]:
    """(short commit, working tree dirty?) of the checkout, or (None, None) outside one."""
    sha, edited = git_edits()
    return sha, (bool(edited) if sha else None)


def git_edits() -> tuple[str | None, list[str]]:
    """(short commit, the package's files with uncommitted edits) of the checkout, or (None, []) outside one."""
    if not paths.in_checkout():
        return None, []
    try:
        sha = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=paths.REPO_ROOT,
                             capture_output=True, text=True, timeout=5).stdout.strip() or None
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "depthlib"],
                                cwd=paths.REPO_ROOT, capture_output=True, text=True, timeout=5).stdout
        return sha, sorted(line[3:].strip() for line in status.splitlines() if line.strip())
    except (OSError, subprocess.SubprocessError):
        return None, []


def environment_versions() -> dict[str, str]:
    """Versions of the packages that decide the numbers."""
    import importlib.metadata as md
    versions = {"python": platform.python_version()}
    for pkg in ("depthlib", "numpy", "scipy", "pandas", "torch", "transformers"):
        try:
            versions[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            pass
    return versions


def device_description(device: str | None = None) -> str:
    """A human-readable name of the machine a run used, e.g. 'cpu (2 cores, x86_64)' or 'cuda (NVIDIA H200)'."""
    if device and str(device).startswith("cuda"):
        try:
            import torch
            return f"cuda ({torch.cuda.get_device_name(torch.device(device))})"
        except Exception:  # noqa: BLE001 - description only
            return str(device)
    return f"cpu ({os.cpu_count()} cores, {platform.machine()})"


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


# ---- one run ----------------------------------------------------------------------------------------------
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


_TMP_NAME = re.compile(r"\.tmp(\d+)$")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True
    return True


def remove_stray_tmp(folder: Path) -> list[Path]:
    """Delete the temporary files (``<name>.tmp<pid>``) an interrupted atomic write left in ``folder``: this
    process's own and those of processes that are gone (a write cut short by a full disk would keep it full).
    Returns what was removed; a folder that cannot be listed is left alone."""
    removed = []
    try:
        candidates = [p for p in Path(folder).rglob("*.tmp*") if p.is_file()]
    except OSError:
        return removed
    for path in candidates:
        match = _TMP_NAME.search(path.name)
        if match is None:
            continue
        pid = int(match.group(1))
        if pid == os.getpid() or not _pid_alive(pid):
            try:
                path.unlink()
                removed.append(path)
            except OSError:
                pass
    return removed


def readable_checkpoint(path: Path) -> bool:
    """A ``torch.save`` file (a zip archive) is whole: every member's CRC checks (cheap; nothing is unpickled)."""
    import zipfile
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.testzip() is None
    except (OSError, zipfile.BadZipFile, EOFError, ValueError):
        return False


def _readable_table(path: Path) -> bool:
    """A parquet file reads whole (a partial run's tables are small: one curve per evaluation, one unit's rows)."""
    try:
        import pyarrow.parquet as pq
        pq.read_table(path)
        return True
    except Exception:  # noqa: BLE001 - any unreadable file counts
        return False


def corruption(run: Run, tables: Sequence[str] = (), checkpoints: Sequence[str] = ()) -> str | None:
    """What is wrong with an existing run folder, in a few words, or None if it reads: a finished run's manifest
    and every table (present and matching the manifest's checksum); a partial run's tables (its ``units/`` included)
    and checkpoints (every ``*.pt`` under it)."""
    try:
        m = run.manifest
    except CorruptRunError:
        return "its manifest.json is unreadable"
    if m.get("status") == "complete":
        listed = m.get("tables")
        if not isinstance(listed, dict):
            return "its manifest lists no table checksums"
        for name in sorted(set(listed) | set(tables)):
            path = run.table_path(name)
            info = listed.get(name)
            if not path.exists():
                return f"table {name} is missing"
            if not isinstance(info, dict) or _sha256(path) != info.get("sha256"):
                return f"table {name} fails its checksum"
        return None
    for path in sorted(run.path.rglob("*.parquet")):
        if not _readable_table(path):
            return f"table {path.relative_to(run.path).with_suffix('').as_posix()} is unreadable"
    for path in sorted({*run.path.rglob("*.pt"), *(run.path / c for c in checkpoints)}):
        if path.exists() and not readable_checkpoint(path):
            return f"{path.relative_to(run.path).as_posix()} is unreadable"
    return None


def repair(run: Run, *, tables: Sequence[str] = (), checkpoints: Sequence[str] = (),
           unit_marker: str | None = None) -> list[str]:
    """Delete only what is unreadable in a run folder, so that a rerun resumes from everything that is whole; returns
    what was removed, in words (empty: nothing was wrong). A finished unit is never lost to a damaged neighbour:

    - an unreadable manifest, or a finished run's table that is missing or fails its checksum: the manifest (and that
      table) go, and the run resumes as a partial run: its body skips what its units, tables and checkpoints hold and
      rebuilds the rest (the lm and compose runs merge their tables again from ``units/``);
    - an unreadable table or checkpoint (``*.parquet``, ``*.pt`` anywhere under the folder, ``checkpoints`` named by
      the caller): that file goes. Under ``units/``, where a unit's tables are ``<unit>_<table>`` and it counts as
      finished once its ``<unit>_<unit_marker>`` table exists (written last; its other files are ``<unit>_*`` or
      ``<unit>.pt``), the unit's marker goes too, so that unit
      alone is computed again."""
    removed: list[str] = []

    def drop(path: Path, why: str) -> None:
        path.unlink(missing_ok=True)
        removed.append(why)
    manifest = run.path / "manifest.json"
    problem = corruption(run, tables) if manifest.exists() else None
    if problem is not None:
        try:
            complete = run.manifest.get("status") == "complete"
        except CorruptRunError:
            complete = False
        if complete and problem.startswith("table ") and "fails its checksum" in problem:
            name = problem.split()[1]
            drop(run.table_path(name), f"table {name} (it failed its checksum)")
        drop(manifest, f"its manifest ({problem})")
    units = run.path / "units"
    tables_ = [(p, "table") for p in sorted(run.path.rglob("*.parquet")) if not _readable_table(p)]
    saved = [(p, "checkpoint") for p in sorted({*run.path.rglob("*.pt"), *(run.path / c for c in checkpoints)})
             if p.exists() and not readable_checkpoint(p)]
    for path, kind in tables_ + saved:
        drop(path, f"the unreadable {kind} {path.relative_to(run.path).as_posix()}")
        if unit_marker and path.parent == units:
            suffix = f"_{unit_marker}.parquet"
            for marker in units.glob(f"*{suffix}"):
                unit = marker.name[: -len(suffix)]
                if path.stem == unit or path.stem.startswith(f"{unit}_"):
                    drop(marker, f"the marker of its unit {unit} (that unit is computed again)")
    return removed


def prepare_run(run: Run, *, force: bool = False, tables: Sequence[str] = (),
                checkpoints: Sequence[str] = (), unit_marker: str | None = None) -> Run:
    """Validate a local run when it is opened to compute into: with ``force`` its folder is deleted (recomputed from
    scratch); a damaged one is repaired (:func:`repair`: only what is unreadable goes, reported in one stderr line
    naming its folder), so the caller resumes from every finished unit instead of failing on every rerun; a complete
    one computed by other code (stale) is deleted, so the caller recomputes it instead of handing back numbers the
    current code did not produce."""
    if not run.path.exists():
        return run
    remove_stray_tmp(run.path)
    if run.committed:
        raise InputError(f"{run.path} is a committed run: it is never deleted or recomputed in place")
    if force:
        print(f"[depthlib] --force: deleting the cached run {run.path} and recomputing it", file=sys.stderr)
        shutil.rmtree(run.path)
        return run
    removed = repair(run, tables=tables, checkpoints=checkpoints, unit_marker=unit_marker)
    if removed:
        print(f"[depthlib] damaged run {run.path}: removed {'; '.join(removed)}; the rest is kept and the run resumes",
              file=sys.stderr)
    elif run.complete and run.stale:
        print(f"[depthlib] {run.path} was computed by other code; deleting it and recomputing", file=sys.stderr)
        shutil.rmtree(run.path)
    return run


def fresh_run(experiment: str, config: dict[str, Any]) -> Run:
    """The local run folder of (experiment, config) to compute into: a complete run made by the current code is
    returned as it is, one made by other code (stale) is deleted first, a partial one is kept to resume."""
    run = open_run(experiment, config)
    if run.complete and run.stale:
        shutil.rmtree(run.path)
    return run


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C while a run was computed: ``folder`` is its run folder and ``saves`` says what is kept there (a rerun
    of the same command resumes from it)."""

    def __init__(self, folder: Path, saves: str):
        super().__init__(saves)
        self.folder, self.saves = Path(folder), saves


class CheckpointWriteError(OSError):
    """A checkpoint could not be written into the run folder ``filename`` (torch reports a full disk as a
    RuntimeError of its stream writer)."""


def _is_write_failure(err: RuntimeError) -> bool:
    text = str(err)
    return any(s in text for s in ("PytorchStreamWriter", "file write failed", "unexpected pos"))


@contextmanager
def guarding(folder: Path, saves: str | None = None) -> Iterator[None]:
    """Around the computation of a run into ``folder``: any failure removes the temporary files this process left
    there (a write cut short by a full disk must not keep the disk full); Ctrl-C becomes :class:`RunInterrupted`
    saying what ``saves`` (default: the finished tables) is kept there; a checkpoint that torch could not write
    becomes :class:`CheckpointWriteError` naming the folder."""
    folder = Path(folder)
    try:
        yield
    except BaseException as err:
        if folder.is_dir():
            remove_stray_tmp(folder)
        if isinstance(err, KeyboardInterrupt) and not isinstance(err, RunInterrupted):
            raise RunInterrupted(folder, saves or f"the finished tables are kept in {folder}") from None
        if isinstance(err, RuntimeError) and _is_write_failure(err):
            raise CheckpointWriteError(28, "cannot write a checkpoint", str(folder)) from err
        raise


#: the wall clock of :class:`Computation` (a test may replace it)
_clock = time.perf_counter


class Computation:
    """A run being computed (:func:`computing`): the run, whether it was complete when opened, and what its
    manifest will say besides the lifecycle's own fields."""

    def __init__(self, run: Run, *, profile: str, code: Sequence[str], seed: int | None, device: str | None):
        self.run, self.profile, self.code, self.seed, self.device = run, profile, tuple(code), seed, device
        self.complete = run.complete           # complete (and fresh) when opened: nothing to compute
        self.extra: dict[str, Any] = {}
        self._stopped = False
        self._start = _clock()
        self._before = 0.0 if self.complete else run.elapsed_before()

    @property
    def elapsed(self) -> float:
        """Wall time of this run so far, in seconds, over every segment (an interrupted run resumes its count)."""
        return self._before + _clock() - self._start

    def save_progress(self) -> None:
        """Record the wall time so far, so that a resumed run's manifest counts this segment too."""
        self.run.record_elapsed(self.elapsed)

    def record(self, **fields: Any) -> None:
        """Fields the manifest will hold besides the lifecycle's (a summary, the models, the executor ...)."""
        self.extra.update(fields)

    def stop(self) -> None:
        """Leave the run unfinished (it resumes next time), e.g. a test that interrupts it on purpose."""
        self._stopped = True


@contextmanager
def computing(experiment: str, config: dict[str, Any], *, profile: str, code: Sequence[str],
              seed: int | None = None, device: str | None = None, force: bool = False, root: Path | None = None,
              tables: Sequence[str] = (), checkpoints: Sequence[str] = (), saves: str | None = None,
              unit_marker: str | None = None) -> Iterator[Computation]:
    """THE run lifecycle: open the run of (experiment, config) in the local cache, check it (:func:`prepare_run`:
    ``force`` deletes it; a damaged one is repaired, losing only what is unreadable; a complete one computed by other
    code is deleted and recomputed; a partial one is kept to resume), hand it to the body, and finish it.

    The body sees a :class:`Computation` ``job``: when ``job.complete`` the run was complete when opened and the body
    computes nothing (the manifest is left as it is). Otherwise the body writes the run's tables (``job.run``),
    calls ``job.save_progress()`` after each so that the wall time counts across resumes, and ``job.record(...)`` for
    manifest fields. On a normal exit the run is finished (:func:`_finish`, atomic with respect to Ctrl-C): its
    manifest records ``profile``, ``seed``, ``device``, the wall time over all segments and the code modules derived
    from ``code`` (compute entries, :func:`compute_modules`); only then are the progress file and the
    ``checkpoints`` (paths relative to the run folder) removed: the body never deletes its own checkpoint. On an
    exception the wall time so far is saved and the failure is handled as :func:`guarding` says (``saves``: what an
    interrupted run keeps): the run resumes next time. ``unit_marker``: see :func:`repair`."""
    run = prepare_run(open_run(experiment, config, root=root), force=force, tables=tables, checkpoints=checkpoints,
                      unit_marker=unit_marker)
    job = Computation(run, profile=profile, code=code, seed=seed, device=device)
    try:
        with guarding(run.path, saves.format(folder=run.path) if saves else None):
            yield job
    except BaseException:
        if not job.complete and run.path.exists():
            try:
                job.save_progress()
            except OSError:
                pass                            # a full disk must not hide the original error
        raise
    if job.complete or job._stopped:
        return
    _finish(job, checkpoints)


@contextmanager
def _sigint_deferred() -> Iterator[list[int]]:
    """Ctrl-C (SIGINT) held back inside the with-block: the signals that arrived are in the yielded list. Outside the
    main thread (where no handler can be set) nothing is deferred."""
    import signal
    import threading
    caught: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield caught
        return
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield caught
    finally:
        signal.signal(signal.SIGINT, previous)


def _finish(job: Computation, checkpoints: Sequence[str]) -> None:
    """Finish a computed run, atomic with respect to Ctrl-C: the manifest is written (atomically) before anything it
    replaces — the progress file, the checkpoints — is removed, with SIGINT held back meanwhile; a Ctrl-C that came
    during it is raised afterwards as :class:`RunInterrupted` saying that the run was saved."""
    run = job.run
    with _sigint_deferred() as caught:
        run.finish(profile=job.profile, seed=job.seed, wall_time_s=job.elapsed, code=job.code, device=job.device,
                   **job.extra)
        for name in (PROGRESS, *checkpoints):
            (run.path / name).unlink(missing_ok=True)
    if caught:
        raise RunInterrupted(run.path, f"the run had finished: it is complete and saved in {run.path}")


def shown_run(experiment: str, profile: str, *, expected_config: Callable[[str], dict | None] | None = None,
              rerun: bool = False, include_custom: bool = False) -> Run | None:
    """The run a chapter shows for ``profile`` (:func:`select_run`), checked (:meth:`Run.validate`), or None when
    there is none; a corrupt local run is reported in one line and left to the caller, whose computation repairs it
    (:func:`repair`) and resumes; a corrupt committed run raises."""
    run = select_run(experiment, profile, expected_config=expected_config, rerun=rerun,
                     include_custom=include_custom)
    if run is None:
        return None
    try:
        return run.validate()
    except CorruptRunError as err:
        if run.committed:
            raise
        print(f"[depthlib] {err}; repairing it (what is whole is kept)", file=sys.stderr)
        return None


def roots(rerun: bool = False) -> list[Path]:
    """Where runs are looked for: committed first, then local; ``rerun`` looks only at local runs."""
    committed = paths.committed_results_dir()
    out = [] if rerun or committed is None else [committed]
    return out + [paths.local_results_dir()]


def find_runs(experiment: str, search: Iterable[Path] | None = None) -> list[Run]:
    """All complete, readable runs of an experiment (committed ones first), also under its former names
    (:func:`depthlib.chapters.former_names`: a local cache from before a rename). Unreadable ones are reported."""
    from depthlib.chapters import former_names
    runs = []
    for root in roots() if search is None else [Path(r) for r in search]:
        for manifest in [m for name in (experiment, *former_names(experiment))
                         for m in sorted((root / name).glob("*/manifest.json"))]:
            try:
                run = Run.load(manifest.parent)
            except CorruptRunError as err:
                print(f"[depthlib] skipping {err}", file=sys.stderr)
                continue
            if run.complete:
                runs.append(run)
    return runs


def select_run(experiment: str, profile: str, *, expected_config: Callable[[str], dict | None] | None = None,
               rerun: bool = False, include_custom: bool = False,
               search: Iterable[Path] | None = None) -> Run | None:
    """THE rule for which run a chapter shows (every chapter calls this, nothing else ranks runs).

    Candidates: complete runs of ``experiment`` whose profile may be shown for ``profile``
    (:func:`shown_profiles`; plus CLI ``custom`` runs if ``include_custom``) and, where ``expected_config``
    gives the current settings of that profile, whose config equals them. Best first: the higher profile
    (paper > cpu > smoke), then fresh before stale (fingerprint), then committed before local, then newest.
    ``rerun`` considers only fresh local runs, so a chapter recomputes what is not in the local cache."""
    allowed = shown_profiles(profile) + ((CUSTOM,) if include_custom else ())
    candidates = []
    for run in find_runs(experiment, roots(rerun) if search is None else search):
        prof = run.profile
        if prof not in allowed:
            continue
        want = expected_config(prof) if expected_config is not None and prof != CUSTOM else None
        if want is not None and run.config != normalise(want):
            continue
        if rerun and run.stale:
            continue
        candidates.append(run)
    if not candidates:
        return None
    rank = {p: i for i, p in enumerate(PROFILE_RANK + (CUSTOM,))}
    candidates.sort(key=lambda r: r.manifest.get("created", ""), reverse=True)       # newest first ...
    candidates.sort(key=lambda r: (rank[r.profile], r.stale, not r.committed))        # ... stable within rank
    return candidates[0]


def chapter_run(experiment: str, profile: str, compute: Callable[[], Run], *,
                expected_config: Callable[[str], dict | None] | None = None, rerun: bool = False,
                include_custom: bool = False) -> Run:
    """The run a chapter shows for ``profile`` (:func:`select_run`), computed now with ``compute`` (cached,
    resumable) if there is none. A corrupt local run is recomputed."""
    run = shown_run(experiment, profile, expected_config=expected_config, rerun=rerun, include_custom=include_custom)
    return run if run is not None else compute()


def commit_run(run: Run, dest: Path | None = None, omit: Sequence[str] = ()) -> Path:
    """Copy a finished run's manifest and tables (no checkpoints, no per-step scratch) into ``data/results``.

    ``omit`` leaves out tables the book does not read (e.g. the token sample of a sensitivity run) to keep the
    repository small; the committed manifest lists them under ``omitted_tables``."""
    if not run.complete:
        raise InputError(f"run {run.path} is not complete")
    dest_root = dest or paths.committed_results_dir()
    if dest_root is None:
        raise InputError("no data/results folder here (not a checkout): set DEPTHLIB_RESULTS_DIR")
    # named by the manifest's experiment: a run found under a former name (a local cache from before a rename)
    target = Path(dest_root) / (run.manifest.get("experiment") or run.experiment) / run.key
    if target.resolve() == run.path.resolve():
        raise InputError(f"run {run.path} is already committed")
    target.mkdir(parents=True, exist_ok=True)
    manifest = run.manifest
    unknown = set(omit) - set(manifest.get("tables", {}))
    if unknown:
        raise InputError(f"run {run.path} has no table(s) {', '.join(sorted(unknown))} to omit")
    for name in manifest.get("tables", {}):
        if name not in omit:
            shutil.copy2(run.table_path(name), target / f"{name}.parquet")
    if omit:
        manifest["omitted_tables"] = sorted(set(omit) | set(manifest.get("omitted_tables", [])))
        manifest["tables"] = {k: v for k, v in manifest["tables"].items() if k not in omit}
    text = json.dumps(manifest, indent=2, sort_keys=True, default=str, allow_nan=False)
    atomic_write(target / "manifest.json", lambda tmp: tmp.write_text(text + "\n"))
    return target


# ---- what a chapter says about its run -------------------------------------------------------------------
def provenance(run: Run) -> str:
    """One line for a chapter's text: profile, device, commit, fingerprint, date, wall time, where it came from."""
    m = run.manifest
    commit = m.get("git_sha") or "unknown"
    if m.get("git_dirty"):
        # a dirty tree at compute time: the commit alone does not name the code; say which commit holds it
        commit += (f" with local edits; its computing code is commit {m['code_commit'][:7]}'s" if m.get("code_commit")
                   else f" with local edits to {', '.join(m['git_edited_files'])}" if m.get("git_edited_files")
                   else " with local edits (the code fingerprint identifies the computing code)")
    where = "committed run" if run.committed else "computed on this machine"
    return (f"profile `{m.get('profile')}` · {m.get('device')} · commit {commit} · code {m.get('code_fingerprint')}"
            f" · {m.get('created')} · wall time {m.get('wall_time_s', 0):.0f} s · {where} ({run.experiment}/{run.key})")


def run_info(run: Run) -> dict[str, Any]:
    """The provenance every chapter states about its run: profile, device, date, commit, wall time."""
    m = run.manifest
    return {"profile": m.get("profile"), "device": m.get("device"), "date": m.get("created"),
            "commit": m.get("git_sha"), "wall_time_s": m.get("wall_time_s")}


def staleness_note(run: Run) -> str:
    """A warning sentence when the run was computed by other code than the current one; '' when it is fresh."""
    if not run.stale:
        return ""
    m = run.manifest
    try:
        now = code_fingerprint(m["code_modules"]) if m.get("code_modules") else "unknown"
    except InputError:
        now = "unknown"
    return (f"These numbers were computed by code with fingerprint {m.get('code_fingerprint', '(unrecorded)')}; "
            f"the current code ({', '.join(m.get('code_modules', [])) or 'modules unrecorded'}) has {now}. "
            "They may not be what the current code computes: rebuild with `make book RERUN=1` to recompute.")


def _digest_at(commit: str, module: str) -> str | None:
    """:func:`_module_digest` of ``module``'s source at git ``commit`` (None if it did not exist there)."""
    spec = importlib.util.find_spec(module)
    rel = Path(spec.origin).resolve().relative_to(paths.REPO_ROOT.resolve()).as_posix()
    shown = subprocess.run(["git", "show", f"{commit}:{rel}"], cwd=paths.REPO_ROOT, capture_output=True, text=True)
    if shown.returncode != 0:
        return None
    return hashlib.sha256(ast.dump(_strip_docstrings(ast.parse(shown.stdout))).encode()).hexdigest()


def restamp(run: Run, *, write: bool = True) -> tuple[str, str]:
    """Move a committed run recorded under hand-listed code modules to the derived rule, where that hides nothing.

    Returns (verdict, reason); verdict is ``derived`` (already recorded as derived), ``restamped`` or ``recompute``.
    A run is re-stamped (its manifest's ``code_modules`` and ``code_fingerprint`` replaced by the derived ones, the
    old ones kept under ``restamped``) only if (1) the old record says it is fresh at the current code and (2) every
    module the derived rule adds has the same code (docstring-free syntax tree) now as at the run's commit; then the
    derived fingerprint describes the code that computed it. Otherwise it must be recomputed."""
    from depthlib.chapters import compute_entry
    m = run.manifest
    entry = compute_entry(run.experiment)
    derived = list(compute_modules(entry))
    old = list(m.get("code_modules") or [])
    if old == derived and not run.stale:
        return "derived", f"records the derived modules of {entry}"
    if not old or run.stale:
        return "recompute", "its recorded code differs from the current code (stale under its own record)"
    sha = m.get("git_sha")
    added = sorted(set(derived) - set(old))
    if added and not sha:
        return "recompute", "no commit recorded to compare the added modules at"
    changed = [mod for mod in added if _digest_at(sha, mod) != _module_digest(mod)]
    if changed:
        return "recompute", f"modules the derived rule adds changed since {sha}: {', '.join(changed)}"
    if write:
        head, _ = git_state()
        m["restamped"] = {"code_modules": old, "code_fingerprint": m.get("code_fingerprint"), "at_commit": head,
                          "entry": entry, "added": added, "removed": sorted(set(old) - set(derived)),
                          "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        m["code_entries"] = [entry]
        m["code_modules"] = derived
        m["code_fingerprint"] = code_fingerprint(derived)
        text = json.dumps(m, indent=2, sort_keys=True, default=str, allow_nan=False)
        atomic_write(run.path / "manifest.json", lambda tmp: tmp.write_text(text + "\n"))
    added_text = f"added {', '.join(added)} (unchanged since {sha})" if added else "no module added"
    return "restamped", added_text + (f"; dropped {', '.join(sorted(set(old) - set(derived)))}"
                                      if set(old) - set(derived) else "")


def code_commit(run: Run) -> str | None:
    """The first commit, from the run's own on, whose code of the run's computing modules has the run's code
    fingerprint: the commit that holds the code of a run computed from a tree with local edits (None if none does)."""
    m = run.manifest
    sha, modules = m.get("git_sha"), sorted(set(m.get("code_modules") or []))
    if not sha or not modules or not paths.in_checkout():
        return None
    later = subprocess.run(["git", "rev-list", "--reverse", "--ancestry-path", f"{sha}..HEAD"], cwd=paths.REPO_ROOT,
                           capture_output=True, text=True).stdout.split()
    for commit in [sha, *later]:
        h = hashlib.sha256()
        for module in modules:
            digest = _digest_at(commit, module)
            if digest is None:
                break
            h.update(f"{module}:{digest}\n".encode())
        else:
            if h.hexdigest()[:12] == m.get("code_fingerprint"):
                return subprocess.run(["git", "rev-parse", "--short=12", commit], cwd=paths.REPO_ROOT,
                                      capture_output=True, text=True).stdout.strip()
    return None


def locate(run: Run) -> str | None:
    """Record in a run computed from a tree with local edits the commit that holds its computing code
    (:func:`code_commit`), so its provenance names it; returns that commit."""
    found = code_commit(run)
    if found and run.manifest.get("code_commit") != found:
        m = {**run.manifest, "code_commit": found}
        text = json.dumps(m, indent=2, sort_keys=True, default=str, allow_nan=False)
        atomic_write(run.path / "manifest.json", lambda tmp: tmp.write_text(text + "\n"))
    return found


USAGE = ("usage: python -m depthlib.results commit RUN_FOLDER [RUN_FOLDER ...]\n"
         "       python -m depthlib.results restamp [--dry-run] [RUN_FOLDER ...]   (default: every committed run)\n"
         "       python -m depthlib.results locate [RUN_FOLDER ...]   (default: committed runs made with local edits)")
#: the options each subcommand takes
_OPTIONS = {"commit": (), "restamp": ("--dry-run",), "locate": ()}


def _finished(path: Path) -> Run:
    """The finished run in the folder ``path``, else InputError (CorruptRunError) saying in one line what is wrong."""
    if not path.is_dir():
        raise InputError(f"no run folder at {path}")
    run = Run.load(path)
    if not run.complete:
        raise InputError(f"run {path} is not finished (no complete manifest): compute it to the end first")
    return run


def _committed_folders() -> list[Path]:
    root = paths.committed_results_dir()
    return sorted(p.parent for p in root.glob("*/*/manifest.json")) if root is not None else []


def main(argv: list[str] | None = None) -> int:
    """``python -m depthlib.results commit RUN_FOLDER ...`` copies finished local runs into ``data/results``;
    ``python -m depthlib.results restamp`` moves committed runs to the derived code rule (:func:`restamp`) and prints
    one line per run: derived, restamped or recompute, with the reason; ``locate`` names the commit holding the code
    of runs computed with local edits (:func:`locate`). A failure is one line ``error: ...`` and exit status 2."""
    argv = sys.argv[1:] if argv is None else argv
    if {"-h", "--help"} & set(argv):
        print(USAGE)
        return 0
    command, args = (argv[0], argv[1:]) if argv else ("", [])
    usage = next((line.strip().removeprefix("usage: ") for line in USAGE.splitlines()
                  if command in _OPTIONS and f" {command} " in line),
                 "python -m depthlib.results commit|restamp|locate ... (--help for more)")
    unknown = [a for a in args if a.startswith("-") and a not in _OPTIONS.get(command, ())]
    if command not in _OPTIONS:
        why = f"unknown command {command!r}" if command else "no command"
    elif unknown:
        why = f"{command}: unknown option {unknown[0]}"
    else:
        why = "commit: name the run folder(s) to commit" if command == "commit" and not args else None
    if why:
        print(f"error: {why} (usage: {' '.join(usage.split())})", file=sys.stderr)
        return 2
    folders = [Path(a) for a in args if not a.startswith("-")]
    failed = located = 0
    try:
        for path in folders or (_committed_folders() if command != "commit" else []):
            run = _finished(path)
            name = f"{path.parent.name}/{path.name}"
            if command == "commit":
                if run.committed:
                    print(f"already committed: {path}")
                elif run.stale:
                    raise InputError(f"run {path} was computed by code other than the current code; "
                                     "recompute it first")
                else:
                    print(commit_run(run.validate()))
            elif command == "restamp":
                verdict, reason = restamp(run, write="--dry-run" not in args)
                failed += verdict == "recompute"
                print(f"{verdict:10s} {name}: {reason}")
            elif run.manifest.get("git_dirty"):
                found = locate(run)
                failed, located = failed + (found is None), located + 1
                print(f"{name}: computed at {run.manifest.get('git_sha')} with local edits; "
                      + (f"its code is commit {found}'s" if found else "no commit holds its code: recompute it"))
            elif folders:                      # by default only the runs made with local edits are listed
                print(f"{name}: not computed with local edits (its commit "
                      f"{run.manifest.get('git_sha') or '(unrecorded)'} holds its code): nothing to locate")
        if command == "locate" and not folders and not located:
            print("no committed run was computed with local edits: nothing to locate")
    except InputError as err:
        print(f"error: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    except OSError as err:
        print(f"error: {command} failed on {err.filename or 'a run folder'}: {err.strerror or err}", file=sys.stderr)
        return 2
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
