"""THE rule for which run a chapter shows (design: Profiles): :func:`select_run`, and the runs it looks among;
:func:`shown_runs` looks up every run a chapter shows without computing any.

Two roots: committed runs (``data/results`` of a checkout, :func:`depthlib.paths.committed_results_dir`) and
local runs (``<cache>/results``). A run whose code fingerprint differs from the current code's is *stale*; a chapter
shows it with a visible warning and ``--rerun`` recomputes it.
"""
from __future__ import annotations

import contextvars
import dataclasses
from pathlib import Path
from typing import Callable, Iterable

from depthlib import paths
from depthlib.errors import InputError
from depthlib.store import CorruptRunError, Run, normalise, say_damaged

#: The profiles, best first (design: Profiles). ``custom`` marks a run with overridden settings (CLI flags).
PROFILE_RANK = ("paper", "cpu", "smoke")
CUSTOM = "custom"
#: set while :func:`shown_runs` looks up a chapter's runs: :func:`chapter_run` then returns None for a missing run
_LOOKING_UP = contextvars.ContextVar("depthlib_looking_up", default=False)


def check_profile(profile: str) -> str:
    if profile not in PROFILE_RANK:
        raise InputError(f"unknown profile {profile!r}; use one of {', '.join(PROFILE_RANK[::-1])}")
    return profile


def named_settings(settings, profiles: dict, field: str | None = None, label: str = "name"):
    """``settings`` as they are if they are a profile's own (one of ``profiles``' values, or that value's ``field``:
    a part's settings), else with their ``label`` field set to :data:`CUSTOM`: a run of custom settings is labelled
    custom, never taken for a profile's run."""
    own = [getattr(p, field) if field else p for p in profiles.values()]
    return settings if settings in own else dataclasses.replace(settings, **{label: CUSTOM})


def profile_settings(profile, profiles: dict):
    """The settings of ``profile``: a profile's name (checked), or custom settings themselves (e.g. from ``--set``),
    labelled custom unless they are a profile's own (:func:`named_settings`)."""
    if isinstance(profile, str):
        return profiles[check_profile(profile)]
    return named_settings(profile, profiles)


def shown_profiles(profile: str) -> tuple[str, ...]:
    """Which profiles a chapter built for ``profile`` may show: ``smoke`` only smoke (so the committed notebook
    outputs are reproducible), ``cpu`` a paper or a cpu run, ``paper`` only a paper run."""
    check_profile(profile)
    return ("smoke",) if profile == "smoke" else PROFILE_RANK[: PROFILE_RANK.index(profile) + 1]


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
        say_damaged(run.path, f"[depthlib] {err}; " + ("left as it is (nothing is computed here)" if _LOOKING_UP.get()
                                                       else "repairing it (what is whole is kept)"))
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
                say_damaged(manifest.parent, f"[depthlib] skipping {err}")
                continue
            if run.complete:
                runs.append(run)
    return runs


def fresh_run(experiment: str, config: dict, search: Iterable[Path] | None = None) -> Run | None:
    """The complete run of exactly ``config`` computed by the current code (committed first, then local; ``search``:
    other roots), or None: what a run that extends another one reads instead of computing it again."""
    want = normalise(config)
    return next((r for r in find_runs(experiment, search) if r.config == want and not r.stale), None)


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
    resumable) if there is none (None instead inside :func:`shown_runs`). A corrupt local run is recomputed."""
    run = shown_run(experiment, profile, expected_config=expected_config, rerun=rerun, include_custom=include_custom)
    return run if run is not None or _LOOKING_UP.get() else compute()



def looking_up() -> bool:
    """Whether this call is inside :func:`shown_runs`: a chapter's ``runs`` that computes a missing run by a path of its
    own (not :func:`chapter_run`) returns None for it instead."""
    return _LOOKING_UP.get()


def shown_runs(runs: Callable[..., dict[str, Run]], profile: str, **kwargs) -> dict[str, Run | None]:
    """What a chapter's ``runs(profile, **kwargs)`` returns (the runs its notebook shows, by part), without computing
    anything: each part is the run the one rule picks (:func:`shown_run`), or None where there is none. It is the
    chapter's own ``runs``, called with :func:`chapter_run` finding but never computing, so a reader of the runs (the
    verdict) reads exactly what the notebook shows. Only a part found through :func:`chapter_run` is looked up this
    way, or by a path that asks :func:`looking_up` first (chapter 3's calibration, whose missing runs go to an
    executor), and ``profile`` is a profile's name (a chapter computes custom
    settings directly, never choosing among runs)."""
    if not isinstance(profile, str):
        raise InputError(f"only a profile's name is looked up, not custom settings ({type(profile).__name__})")
    check_profile(profile)
    token = _LOOKING_UP.set(True)
    try:
        return runs(profile, **kwargs)
    finally:
        _LOOKING_UP.reset(token)
