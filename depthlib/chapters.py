"""The registry of the book's chapters: what each chapter is called in every place, in the book's order.

The CLI, the book build, the committed-run tests and the notebooks loop over :data:`CHAPTERS` instead of
knowing seven shapes, and a chapter goes by one name everywhere (:class:`Chapter`). Each :class:`Chapter` names its
package, whose ``chapter`` module implements the chapter contract (:mod:`depthlib.contract`): ``PROFILES``,
``runs``, ``compute``, ``replay``, ``describe``, ``summary`` and ``COMPUTE``. This module imports nothing heavy: a
chapter's module is imported when it is asked for.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from types import ModuleType

from depthlib.errors import InputError


@dataclass(frozen=True)
class Chapter:
    """One chapter of the book. It has one name, ``name``, in every place: its package ``depthlib.<name>``, its
    notebook ``notebooks/NN_<name>.ipynb``, its figures ``depthlib.plots.<name>``, its results-cache experiments
    (``<name>`` or ``<name>-…``) and its command ``depthlib <name>``. The names of an earlier layout stay readable: a
    local cache's runs under a former experiment name are still found (``former_experiments``: former names of the
    chapter's first experiment), a former command still runs (``former_commands``)."""

    number: int
    name: str                    # the package's last name (``depthlib.<name>``)
    title: str
    experiments: tuple[str, ...]  # results-cache experiments of its runs; a name ending in "-" is a prefix
    offline_models: bool = False  # its notebook loads the offline LMs when it computes (the book converts them first)
    former_experiments: tuple[str, ...] = ()   # former names of its first experiment
    former_commands: tuple[str, ...] = ()      # former names of its command
    needs: tuple[str, ...] = ()                # chapters whose local runs its runs start from (weights never committed)

    @property
    def package(self) -> str:
        return f"depthlib.{self.name}"

    @property
    def notebook(self) -> str:
        """Stem of the chapter's notebook, ``NN_<name>``."""
        return f"{self.number:02d}_{self.name}"

    @property
    def command(self) -> str:
        """The ``depthlib`` command that computes its runs."""
        return self.name

    @property
    def module(self) -> ModuleType:
        """The chapter's ``chapter`` module (the contract's names)."""
        return importlib.import_module(f"{self.package}.chapter")

    @property
    def plots_module(self) -> ModuleType:
        """Its figures, ``depthlib.plots.<name>`` (imported in the notebook as ``figs``)."""
        return importlib.import_module(f"depthlib.plots.{self.name}")

    def owns(self, experiment: str) -> bool:
        """Whether ``experiment`` (a results-cache experiment name) holds runs of this chapter."""
        return experiment in self.former_experiments or any(
            experiment == e or (e.endswith("-") and experiment.startswith(e)) for e in self.experiments)


CHAPTERS: tuple[Chapter, ...] = (
    Chapter(1, "scaling", "The decomposed scaling law on the Chinchilla runs", ("scaling",),
            former_experiments=("chinchilla",), former_commands=("fit",)),
    Chapter(2, "probes", "Hidden states of real LLMs", ("probes-",), offline_models=True,
            former_commands=("probe",)),
    Chapter(3, "toy", "Toy teacher-student residual networks",
            ("toy", "toy-calibration", "toy-converged", "toy-converged-units", "toy-certified",
             "toy-certified-units")),
    Chapter(4, "tracing", "Causal tracing: functional groups of layers", ("tracing",), offline_models=True,
            former_experiments=("causal_tracing",), former_commands=("trace",)),
    Chapter(5, "interventions", "Interventions: delete, reorder, run in parallel", ("interventions-",),
            former_commands=("intervene",), needs=("toy",)),
    Chapter(6, "lm", "A depth series of small LMs trained here", ("lm", "lm-converged"),
            former_experiments=("lm-depth",), former_commands=("lm-depth",)),
    Chapter(7, "compose", "Can depth be made compositional?", ("compose-",)),
)


def former_names(experiment: str) -> tuple[str, ...]:
    """The former results-cache names of ``experiment`` (a local cache from before a rename holds its runs there):
    those of a chapter's first experiment."""
    return next((c.former_experiments for c in CHAPTERS if c.experiments[:1] == (experiment,)), ())


def chapter_of(experiment: str) -> Chapter:
    """The chapter whose runs live under ``experiment``."""
    for chapter in CHAPTERS:
        if chapter.owns(experiment):
            return chapter
    raise InputError(f"no chapter computes runs of the experiment {experiment!r}")


def by_name(name: str) -> Chapter:
    """A chapter by its name, number, notebook stem or a former command."""
    for chapter in CHAPTERS:
        if name in (chapter.name, str(chapter.number), chapter.notebook, *chapter.former_commands):
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


__all__ = ["CHAPTERS", "Chapter", "by_name", "chapter_of", "compute_entry", "former_names"]
