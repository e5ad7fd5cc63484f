"""The chapter contract: what every chapter's ``chapter`` module defines, and the one profile type.

Every chapter package (:data:`depthlib.chapters.CHAPTERS`) has a module ``<package>.chapter`` with the same names:

``PROFILES``    ``{"smoke" | "cpu" | "paper": <a Profile>}``, one :class:`Profile` subclass per chapter
``runs(profile, *, rerun=False, executor=None, device="cpu", progress=False) -> dict[str, Run]``
                the runs its notebook shows for a profile, by part name, each the one run the rule of
                :func:`depthlib.results.select_run` picks, computed now (cached, resumable) if there is none
``compute(cfg, device="cpu", *, force=False, progress=True, executor=None) -> Run``
                computes (or resumes, or loads) one run of the chapter into the local results cache: ``cfg`` is
                the settings of that one run (its part's config, or for probes and interventions a
                ``ProbeRun`` / ``InterventionRun``: model, corpus, documents, config, label), ``force`` deletes
                it first, ``executor`` (:class:`depthlib.executors.ExecutorConfig`, with its ``shards``) says
                where its pieces run
``replay(run) -> DataFrame``
                recomputes a cheap prefix of a run with the current code: columns ``committed`` and ``replayed``
``describe(run) -> dict``
                the provenance and settings the chapter's text states about a run
``summary(run) -> dict``
                the key numbers of a run, JSON-able: what the ``depthlib`` command prints
``reduction(profile) -> str``
                how a profile's runs are reduced against the paper's: the chapter's line in the verdict's list
``COMPUTE``     ``{experiment: "module:function"}``: the compute entry of each experiment's runs; the code modules a
                run's numbers depend on are derived from its imports (:func:`depthlib.results.compute_modules`)

A chapter with claims in :data:`depthlib.claims.CLAIMS` has a module ``<package>.views`` (its readers of finished
runs, never imported by code that computes) with ``measurements(parts) -> {claim key: [Measurement]}``: the numbers
the book's verdict states for those claims, one :class:`depthlib.claims.Measurement` per model, from the runs its
notebook shows (``parts``: what ``runs`` returns, a part without a run None).

A config is rebuilt from a run's JSON by one helper, :func:`from_dict` (what :meth:`Profile.from_dict` uses).
"""
from __future__ import annotations

import dataclasses
import types
import typing
from typing import Any, TypeVar, Union

#: the names every chapter module defines
NAMES = ("PROFILES", "runs", "compute", "replay", "describe", "summary", "reduction", "COMPUTE")

T = TypeVar("T")


def _rebuild(hint: Any, value: Any) -> Any:
    """``value`` (as it reads back from JSON) as the type ``hint`` of a dataclass field: nested dataclasses built
    again, lists as tuples where the field is a tuple."""
    if value is None:
        return None
    origin = typing.get_origin(hint)
    if origin in (Union, types.UnionType):
        for arg in typing.get_args(hint):
            if arg is type(None):
                continue
            if dataclasses.is_dataclass(arg) and isinstance(value, dict):
                return from_dict(arg, value)
            if typing.get_origin(arg) is tuple or arg is tuple:
                return _rebuild(arg, value)
        return value
    if dataclasses.is_dataclass(hint) and isinstance(value, dict):
        return from_dict(hint, value)
    if (hint is tuple or origin is tuple) and isinstance(value, (list, tuple)):
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_rebuild(args[0], v) for v in value)
        if args and len(args) == len(value):
            return tuple(_rebuild(a, v) for a, v in zip(args, value))
        return tuple(tuple(v) if isinstance(v, list) else v for v in value)
    return value


def from_dict(cls: type[T], data: dict, *, extra: str = "ignore") -> T:
    """The dataclass ``cls`` back from ``data`` (a run's JSON config, or a :meth:`Profile.to_dict`): nested
    dataclasses and tuples rebuilt from their field types. Keys that are not fields of ``cls`` (a run's key adds
    fingerprints, models, prompts ...) are ignored, or with ``extra="forbid"`` raise ``TypeError``."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls) if f.init}
    unknown = set(data) - names
    if unknown and extra == "forbid":
        raise TypeError(f"{cls.__name__} has no field(s) {', '.join(sorted(unknown))}")
    return cls(**{k: _rebuild(hints[k], v) for k, v in data.items() if k in names})


def to_dict(obj: Any) -> dict:
    """A dataclass as plain JSON types (tuples become lists), as a run's config reads back."""
    from depthlib.store import normalise
    return normalise(dataclasses.asdict(obj))


@dataclasses.dataclass(frozen=True)
class Profile:
    """Base of every chapter's profile type (the settings of smoke | cpu | paper, design: Profiles): a frozen
    dataclass that goes to and comes back from a run's JSON with the same two methods."""

    def to_dict(self) -> dict:
        return to_dict(self)

    @classmethod
    def from_dict(cls, data: dict):
        return from_dict(cls, data)


__all__ = ["NAMES", "Profile", "from_dict", "to_dict"]
