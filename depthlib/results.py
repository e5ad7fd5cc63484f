"""Results cache: an experiment's config -> a hash -> a folder of tidy tables plus a manifest.

Layout::

    <root>/<experiment>/<key>/manifest.json      what produced it (git sha, versions, device, seed, wall time)
    <root>/<experiment>/<key>/<table>.parquet    tidy tables, one row per measurement

Two roots are searched: ``data/results/`` (committed runs, e.g. a `paper` profile run done on a GPU)
and ``data/cache/results/`` (git-ignored runs done on this machine). New runs are written to the cache;
commit one by copying its folder to ``data/results/``. Tables are written atomically, so a long run can
save as it goes and resume after an interruption by checking which tables already exist.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import pandas as pd

REPO_ROOT = Path(__file__).resolve().parents[1]

#: Profiles from best to worst: a notebook shows the best complete run available.
PROFILE_RANK = ("paper", "cpu", "smoke")


def _repo_checkout() -> bool:
    return (REPO_ROOT / "pyproject.toml").exists()


def committed_root() -> Path:
    """Committed results (``data/results``), overridable with ``DEPTHLIB_RESULTS_DIR``."""
    return Path(os.environ.get("DEPTHLIB_RESULTS_DIR", REPO_ROOT / "data" / "results"))


def cache_dir() -> Path:
    """Git-ignored cache for downloads, converted models and local runs (``DEPTHLIB_CACHE_DIR``)."""
    env = os.environ.get("DEPTHLIB_CACHE_DIR")
    if env:
        return Path(env)
    if _repo_checkout():
        return REPO_ROOT / "data" / "cache"
    return Path.home() / ".cache" / "depthlib"


def local_root() -> Path:
    return cache_dir() / "results"


def config_key(config: dict[str, Any]) -> str:
    """Stable 12-hex-digit hash of a JSON-able config (key order does not matter)."""
    blob = json.dumps(config, sort_keys=True, default=str, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def git_sha() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=REPO_ROOT,
                             capture_output=True, text=True, timeout=5)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


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
    if device and device.startswith("cuda"):
        try:
            import torch
            return f"cuda ({torch.cuda.get_device_name(torch.device(device))})"
        except Exception:  # noqa: BLE001 - description only
            return device
    return f"cpu ({os.cpu_count()} cores, {platform.machine()})"


@dataclass
class Run:
    """One run of one experiment under one config: a folder of tables and a manifest."""

    experiment: str
    config: dict[str, Any]
    path: Path

    @property
    def key(self) -> str:
        return self.path.name

    # -- tables ---------------------------------------------------------------------------------
    def table_path(self, name: str) -> Path:
        return self.path / f"{name}.parquet"

    def has(self, name: str) -> bool:
        return self.table_path(name).exists()

    def write_table(self, name: str, df: pd.DataFrame) -> Path:
        """Write a tidy table atomically (a crash never leaves half a file behind)."""
        self.path.mkdir(parents=True, exist_ok=True)
        final = self.table_path(name)
        tmp = final.with_suffix(f".tmp{os.getpid()}")
        df.to_parquet(tmp, index=False)
        os.replace(tmp, final)
        return final

    def table(self, name: str) -> pd.DataFrame:
        path = self.table_path(name)
        if not path.exists():
            raise FileNotFoundError(f"run {self.experiment}/{self.key} has no table '{name}'")
        return pd.read_parquet(path)

    def tables(self, prefix: str = "") -> list[str]:
        return sorted(p.stem for p in self.path.glob(f"{prefix}*.parquet"))

    # -- manifest -------------------------------------------------------------------------------
    @property
    def manifest(self) -> dict[str, Any]:
        path = self.path / "manifest.json"
        return json.loads(path.read_text()) if path.exists() else {}

    @property
    def complete(self) -> bool:
        return self.manifest.get("status") == "complete"

    def finish(self, *, profile: str, seed: int | None, wall_time_s: float,
               device: str | None = None, **extra: Any) -> dict[str, Any]:
        """Mark the run complete and record what produced it."""
        manifest = {
            "experiment": self.experiment,
            "key": self.key,
            "status": "complete",
            "profile": profile,
            "config": self.config,
            "seed": seed,
            "wall_time_s": round(float(wall_time_s), 3),
            "device": device_description(device),
            "git_sha": git_sha(),
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "versions": environment_versions(),
            **extra,
        }
        self.path.mkdir(parents=True, exist_ok=True)
        tmp = self.path / "manifest.json.tmp"
        tmp.write_text(json.dumps(manifest, indent=2, sort_keys=True, default=str))
        os.replace(tmp, self.path / "manifest.json")
        return manifest


def provenance(profile: str, device: str | None = None, manifest: dict | None = None) -> str:
    """One line for a chapter's text: which profile, device, commit and date produced its numbers."""
    if manifest:
        return (f"profile `{manifest.get('profile')}` · {manifest.get('device')} · commit {manifest.get('git_sha') or 'unknown'}"
                f" · {manifest.get('created')} · wall time {manifest.get('wall_time_s', 0):.0f} s")
    return (f"profile `{profile}` · {device_description(device)} · commit {git_sha() or 'unknown'}"
            f" · {time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}")


def open_run(experiment: str, config: dict[str, Any], root: Path | None = None) -> Run:
    """The run folder for (experiment, config) in the local cache; created on first write.

    Re-opening the same config returns the same folder, so a resumed run finds its finished tables.
    """
    root = local_root() if root is None else Path(root)
    return Run(experiment, dict(config), root / experiment / config_key(config))


def find_runs(experiment: str, roots: Iterable[Path] | None = None) -> list[Run]:
    """All complete runs of an experiment, committed ones first."""
    roots = [committed_root(), local_root()] if roots is None else [Path(r) for r in roots]
    runs = []
    for root in roots:
        for manifest in sorted((root / experiment).glob("*/manifest.json")):
            info = json.loads(manifest.read_text())
            if info.get("status") == "complete":
                runs.append(Run(experiment, info.get("config", {}), manifest.parent))
    return runs


def best_run(experiment: str, roots: Iterable[Path] | None = None,
             profiles: Iterable[str] = PROFILE_RANK) -> Run | None:
    """The best complete run: highest profile (paper > cpu > smoke), then committed, then newest."""
    profiles = list(profiles)
    candidates = [r for r in find_runs(experiment, roots) if r.manifest.get("profile") in profiles]
    if not candidates:
        return None
    candidates.sort(key=lambda r: r.manifest.get("created", ""), reverse=True)  # newest first ...
    committed = committed_root().resolve()
    candidates.sort(key=lambda r: (profiles.index(r.manifest["profile"]),  # ... then stable by rank
                                   not r.path.resolve().is_relative_to(committed)))
    return candidates[0]
