"""The registry of the book's chapters: what each chapter is called in every place, in the book's order.

The CLI, the book build, the committed-run tests and the notebooks loop over :data:`CHAPTERS` instead of
knowing seven shapes. Each :class:`Chapter` names its package, whose ``chapter`` module implements the chapter
contract (:mod:`depthlib.contract`): ``PROFILES``, ``runs``, ``compute``, ``replay``, ``describe``, ``summary`` and
``COMPUTE``. This module imports nothing heavy: a chapter's module is imported when it is asked for.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from depthlib.errors import InputError


@dataclass(frozen=True)
class Chapter:
    """One chapter of the book and the names it goes by."""

    number: int
    name: str                    # the package's last name (``depthlib.<name>``)
    title: str
    notebook: str                # stem of notebooks/<notebook>.ipynb
    plots: str                   # its figures: depthlib.plots.<plots>, imported in the notebook as ``plots``
    experiments: tuple[str, ...]  # results-cache experiments of its runs; a name ending in "-" is a prefix
    command: str                 # the ``depthlib`` command that computes its runs
    offline_models: bool = False  # its notebook loads the offline LMs when it computes (the book converts them first)

    @property
    def package(self) -> str:
        return f"depthlib.{self.name}"

    @property
    def module(self) -> ModuleType:
        """The chapter's ``chapter`` module (the contract's names)."""
        return importlib.import_module(f"{self.package}.chapter")

    @property
    def plots_module(self) -> ModuleType:
        return importlib.import_module(f"depthlib.plots.{self.plots}")

    def owns(self, experiment: str) -> bool:
        """Whether ``experiment`` (a results-cache experiment name) holds runs of this chapter."""
        return any(experiment == e or (e.endswith("-") and experiment.startswith(e)) for e in self.experiments)


CHAPTERS: tuple[Chapter, ...] = (
    Chapter(1, "scaling", "The decomposed scaling law on the Chinchilla runs", "01_chinchilla_fit", "chinchilla",
            ("chinchilla",), "fit"),
    Chapter(2, "probes", "Hidden states of real LLMs", "02_hidden_states", "hidden_states", ("probes-",), "probe",
            offline_models=True),
    Chapter(3, "toy", "Toy teacher-student residual networks", "03_toy_regimes", "toy",
            ("toy", "toy-calibration", "toy-converged", "toy-converged-units"),
            "toy"),
    Chapter(4, "tracing", "Causal tracing: functional groups of layers", "04_causal_tracing", "tracing",
            ("causal_tracing",), "trace", offline_models=True),
    Chapter(5, "interventions", "Interventions: delete, reorder, run in parallel", "05_interventions", "interventions",
            ("interventions-",), "intervene"),
    Chapter(6, "lm", "A depth series of small LMs trained here", "06_depth_series", "lm", ("lm-depth",), "lm-depth"),
    Chapter(7, "compose", "Can depth be made compositional?", "07_compose", "compose", ("compose-",), "compose"),
)


def chapter_of(experiment: str) -> Chapter:
    """The chapter whose runs live under ``experiment``."""
    for chapter in CHAPTERS:
        if chapter.owns(experiment):
            return chapter
    raise InputError(f"no chapter computes runs of the experiment {experiment!r}")


def by_name(name: str) -> Chapter:
    """A chapter by its name, number, notebook stem or command."""
    for chapter in CHAPTERS:
        if name in (chapter.name, str(chapter.number), chapter.notebook, chapter.command):
            return chapter
    raise InputError(f"no chapter {name!r} (have {', '.join(c.name for c in CHAPTERS)})")


def compute_entry(experiment: str) -> str:
    """The compute entry (``module:function``) of ``experiment``'s runs, from its chapter's ``COMPUTE`` table (an
    exact experiment name first, else the longest prefix ending in "-")."""
    table = chapter_of(experiment).module.COMPUTE
    if experiment in table:
        return table[experiment]
    prefixes = sorted((e for e in table if e.endswith("-") and experiment.startswith(e)), key=len, reverse=True)
    if not prefixes:
        raise InputError(f"chapter {chapter_of(experiment).name} has no compute entry for {experiment!r}")
    return table[prefixes[0]]


__all__ = ["CHAPTERS", "Chapter", "by_name", "chapter_of", "compute_entry"]
