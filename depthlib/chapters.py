"""The registry of the book's chapters: what each chapter is called in every place, in the book's order.

The CLI, the book build, the committed-run tests and the notebooks loop over :data:`CHAPTERS` instead of
knowing seven shapes, and a chapter goes by one name everywhere (:class:`Chapter`). Each :class:`Chapter` names its
package, whose ``chapter`` module implements the chapter contract (:mod:`depthlib.contract`): ``PROFILES``,
``runs``, ``compute``, ``replay``, ``describe``, ``summary`` and ``COMPUTE``. This module imports nothing heavy: a
chapter's module is imported when it is asked for.

A chapter from outside this package (a plugin, or a test's tiny chapter) joins with :func:`register`: its command
``depthlib <name>`` and its page in the book (the notebook list and the table of contents of :mod:`depthlib.book`)
follow from the registry, so nothing else is edited. Read the registry as ``chapters.CHAPTERS`` at the time of use:
:func:`register` replaces the tuple.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from depthlib.errors import InputError


@dataclass(frozen=True)
class Chapter:
    """One chapter of the book. It has one name, ``name``, in every place: its package ``depthlib.<name>``, its
    notebook ``notebooks/NN_<name>.ipynb``, its figures ``depthlib.plots.<name>``, its results-cache experiments
    (``<name>`` or ``<name>-…``) and its command ``depthlib <name>``. The names of an earlier layout stay readable: a
    local cache's runs under a former experiment name are still found (``former_experiments``: former names of the
    chapter's first experiment), a former command still runs (``former_commands``). A chapter from outside this
    package (:func:`register`) names its package (``package``, default ``depthlib.<name>``) and the folder of its
    notebook (``notebook_dir``, default the checkout's ``notebooks/``)."""

    number: int
    name: str                    # the package's last name (``depthlib.<name>``)
    title: str
    experiments: tuple[str, ...]  # results-cache experiments of its runs; a name ending in "-" is a prefix
    offline_models: bool = False  # its notebook loads the offline LMs when it computes (the book converts them first)
    former_experiments: tuple[str, ...] = ()   # former names of its first experiment
    former_commands: tuple[str, ...] = ()      # former names of its command
    needs: tuple[str, ...] = ()                # chapters whose local runs its runs start from (weights never committed)
    package: str = ""                          # its package (default ``depthlib.<name>``)
    notebook_dir: str = ""                     # the folder of its notebook (default the checkout's ``notebooks/``)

    def __post_init__(self) -> None:
        if not self.package:
            object.__setattr__(self, "package", f"depthlib.{self.name}")

    @property
    def notebook(self) -> str:
        """Stem of the chapter's notebook, ``NN_<name>``."""
        return f"{self.number:02d}_{self.name}"

    @property
    def notebook_path(self) -> Path:
        """The chapter's notebook, ``<notebook_dir>/NN_<name>.ipynb``."""
        if self.notebook_dir:
            return Path(self.notebook_dir) / f"{self.notebook}.ipynb"
        from depthlib.paths import REPO_ROOT
        return REPO_ROOT / "notebooks" / f"{self.notebook}.ipynb"

    @property
    def command(self) -> str:
        """The ``depthlib`` command that computes its runs."""
        return self.name

    @property
    def module(self) -> ModuleType:
        """The chapter's ``chapter`` module (the contract's names)."""
        return importlib.import_module(f"{self.package}.chapter")

    @property
    def views_module(self) -> ModuleType:
        """Its readers of finished runs, ``<package>.views``: the chapter's text, and ``measurements(parts)``, its
        numbers for the verdict's claims (:func:`depthlib.verdict.measurements`)."""
        return importlib.import_module(f"{self.package}.views")

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


def register(chapter: Chapter) -> Chapter:
    """Add ``chapter`` at the end of :data:`CHAPTERS` (the book's order): a chapter from outside this package, a plugin
    or a test's tiny one. It gets its command ``depthlib <name>`` (derived from its ``PROFILES``, ``PARTS`` and profile
    type, :mod:`depthlib.cli`) and its page in the book (:func:`depthlib.book.notebook_paths`,
    :func:`depthlib.book.table_of_contents`). Its ``chapter`` module must implement the contract
    (:data:`depthlib.contract.NAMES`); its name, number, command and experiments must be its own. Returns it;
    :func:`unregister` takes it out again."""
    global CHAPTERS
    from depthlib import contract
    taken = {n for c in CHAPTERS for n in (c.name, c.command, *c.former_commands)}
    if chapter.name in taken or chapter.name == "book" or not chapter.name.isidentifier():
        raise InputError(f"cannot register a chapter named {chapter.name!r}: the name is taken or not a Python name")
    if chapter.number in {c.number for c in CHAPTERS}:
        raise InputError(f"cannot register chapter {chapter.name!r} as number {chapter.number}: "
                         f"chapter {by_name(str(chapter.number)).name} has it")
    owned = [e for e in chapter.experiments for c in CHAPTERS if c.owns(e.rstrip("-") + ("-x" if e.endswith("-") else ""))]
    if owned or not chapter.experiments:
        raise InputError(f"chapter {chapter.name!r} needs experiments of its own, got {', '.join(chapter.experiments)}")
    missing = [n for n in contract.NAMES if not hasattr(chapter.module, n)]
    if missing:
        raise InputError(f"{chapter.package}.chapter does not implement the chapter contract: it lacks "
                         f"{', '.join(missing)}")
    CHAPTERS = CHAPTERS + (chapter,)
    return chapter


def unregister(name: str) -> None:
    """Take the chapter ``name`` that :func:`register` added out of :data:`CHAPTERS` again (the book's own chapters stay)."""
    global CHAPTERS
    CHAPTERS = tuple(c for c in CHAPTERS if c.name != name or c.package == f"depthlib.{c.name}")


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


__all__ = ["CHAPTERS", "Chapter", "by_name", "chapter_of", "compute_entry", "former_names", "register", "unregister"]
