"""depthlib: the computations behind the Inverse Depth Scaling book.

Reproduces and extends Liu, Kangaslahti, Liu & Gore, "Inverse Depth Scaling From Most Layers Being
Similar" (ICML 2026, arXiv 2602.05970). One module per concept:

- :mod:`depthlib.paths`    checkout or wheel; the user cache (``DEPTHLIB_CACHE_DIR``); package data
- :mod:`depthlib.chapters` the registry :data:`CHAPTERS`: each chapter's number, package, notebook, plots module,
                           results-cache experiments and command (the CLI, the book, the tests loop over it)
- :mod:`depthlib.contract` the chapter contract: the one profile type, the one config-from-JSON helper
- :mod:`depthlib.settings` ``--set FIELD=VALUE``: any field of a profile, read as its type, checked by its validate()
- :mod:`depthlib.store`    the run store: a folder of tables and a manifest, the one atomic writer
- :mod:`depthlib.fingerprints` a run's code identity: the modules derived from its compute entry, their fingerprint
- :mod:`depthlib.lifecycle` THE run lifecycle (:func:`~depthlib.results.computing`): repair, resume, time, finish
- :mod:`depthlib.selection` THE rule for which run a chapter shows (:func:`~depthlib.results.select_run`)
- :mod:`depthlib.results`  one namespace over store, fingerprints, lifecycle and selection for the chapters
- :mod:`depthlib.purity`   a pure refactor keeps its runs: the smoke replay before and after a change, the re-stamp
- :mod:`depthlib.inputs`   what a run's model and corpus are (the fingerprints its cache key records)
- :mod:`depthlib.validate` shared validators (device, finite numbers, ranges) behind the one-line errors
- :mod:`depthlib.executors` serial | joblib | submitit: where units of work (one run each) are computed
- :mod:`depthlib.units`    runs made of units (a teacher, temperature and replicate), one resumable run each, merged
- :mod:`depthlib.runtime`  process settings for long CPU runs (steady glibc malloc)
- :mod:`depthlib.sources`  what a chapter's views read: a finished run or a mapping of its tables
- :mod:`depthlib.measures` angles, middle-block ranges, power-law fits (one definition each)
- :mod:`depthlib.certificate` the book's one convergence certificate (a re-warmed continuation gains < 2 %)
- :mod:`depthlib.training` the one training loop of the book's transformers (chapters 6 and 7)
- :mod:`depthlib.data`     the Chinchilla CSV and text corpora
- :mod:`depthlib.models`   model adapters: architecture table, loading (offline GGUF -> HF folder), hooks
- :mod:`depthlib.scaling`  the decomposed scaling law and its fits (paper §3, App. B)          chapter 1
- :mod:`depthlib.probes`   hidden-state probes of real LLMs (paper §2, App. A)                 chapter 2
- :mod:`depthlib.toy`      teacher-student residual networks (paper §4, App. C)                chapter 3
- :mod:`depthlib.tracing`  ROME-style causal tracing (paper Fig. 6)                            chapter 4
- :mod:`depthlib.interventions` delete / reorder / parallel-sum blocks of real LMs and toy students     chapter 5
- :mod:`depthlib.lm`       a depth series of small LMs trained here: α_ℓ and θ against ℓ (§3)   chapter 6
- :mod:`depthlib.compose`  can depth be made compositional? hierarchical data, looped depth (§5)  chapter 7
- :mod:`depthlib.claims`   the paper's claims, each with its region, and the written status rule
- :mod:`depthlib.verdict`  the book's verdict: one row per claim from the runs the chapters show
- :mod:`depthlib.plots`    plotly figures in one style, one module per chapter
- :mod:`depthlib.book`     executes the notebooks (papermill) and builds the Jupyter Book

Every chapter package has a ``chapter`` module with the same names (:mod:`depthlib.contract`): ``PROFILES``
(smoke | cpu | paper, values of one :class:`~depthlib.contract.Profile` subclass), ``runs(profile, *, rerun,
executor, device, progress)`` (the runs its notebook shows, by part name, each found by
:func:`depthlib.results.select_run` or computed now), ``compute(cfg, device, *, force, progress, executor)`` (one
run of the settings ``cfg`` into the local cache, the same shape in every chapter), ``replay`` (recompute a cheap
prefix of a run with the current code), ``describe`` and ``summary`` (what the chapter's text and the ``depthlib``
command say about a run) and ``COMPUTE`` (the compute entry of each experiment's runs). A run
records the code modules its numbers depend on, derived from the imports of its compute entry
(:func:`depthlib.results.compute_modules`; orchestration and plotting left out). A chapter whose run splits into
independent units of work has a ``shards`` module (toy, probes, tracing; the depth series trains one member per unit
itself): the same run as jobs of an executor, merged into the one-process run's cache key.
"""
from depthlib import chapters as _chapters
from depthlib.errors import InputError

__version__ = "0.1.0"
__all__ = ["CHAPTERS", "InputError", "__version__"]


def __getattr__(name: str):
    """``depthlib.CHAPTERS`` is the registry as it is now (:func:`depthlib.chapters.register` rebinds it)."""
    if name == "CHAPTERS":
        return _chapters.CHAPTERS
    raise AttributeError(f"module 'depthlib' has no attribute {name!r}")
