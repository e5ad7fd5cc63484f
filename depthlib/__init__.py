"""depthlib: the computations behind the Inverse Depth Scaling book.

Reproduces and extends Liu, Kangaslahti, Liu & Gore, "Inverse Depth Scaling From Most Layers Being
Similar" (ICML 2026, arXiv 2602.05970). One module per concept:

- :mod:`depthlib.paths`    checkout or wheel; the user cache (``DEPTHLIB_CACHE_DIR``); package data
- :mod:`depthlib.chapters` the registry :data:`CHAPTERS`: each chapter's number, package, notebook, plots module,
                           results-cache experiments and command (the CLI, the book, the tests loop over it)
- :mod:`depthlib.contract` the chapter contract: the one profile type, the one config-from-JSON helper
- :mod:`depthlib.results`  results cache, derived code fingerprints, THE rule for which run a chapter shows, and
                           THE run lifecycle (:func:`~depthlib.results.computing`)
- :mod:`depthlib.inputs`   what a run's model and corpus are (the fingerprints its cache key records)
- :mod:`depthlib.validate` shared validators (device, finite numbers, ranges) behind the one-line errors
- :mod:`depthlib.executors` serial | joblib | submitit: where units of work (one run each) are computed
- :mod:`depthlib.runtime`  process settings for long CPU runs (steady glibc malloc)
- :mod:`depthlib.sources`  what a chapter's views read: a finished run or a mapping of its tables
- :mod:`depthlib.measures` angles, middle-block ranges, power-law fits (one definition each)
- :mod:`depthlib.data`     the Chinchilla CSV and text corpora
- :mod:`depthlib.models`   model adapters: architecture table, loading (offline GGUF -> HF folder), hooks
- :mod:`depthlib.scaling`  the decomposed scaling law and its fits (paper §3, App. B)          chapter 1
- :mod:`depthlib.probes`   hidden-state probes of real LLMs (paper §2, App. A)                 chapter 2
- :mod:`depthlib.toy`      teacher-student residual networks (paper §4, App. C)                chapter 3
- :mod:`depthlib.tracing`  ROME-style causal tracing (paper Fig. 6)                            chapter 4
- :mod:`depthlib.interventions` delete / reorder / parallel-sum blocks of real LMs and toy students     chapter 5
- :mod:`depthlib.lm`       a depth series of small LMs trained here: α_ℓ and θ against ℓ (§3)   chapter 6
- :mod:`depthlib.compose`  can depth be made compositional? hierarchical data, looped depth (§5)  chapter 7
- :mod:`depthlib.plots`    plotly figures in one style, one module per chapter
- :mod:`depthlib.book`     executes the notebooks (papermill) and builds the Jupyter Book

Every chapter package has a ``chapter`` module with the same names (:mod:`depthlib.contract`): ``PROFILES``
(smoke | cpu | paper, values of one :class:`~depthlib.contract.Profile` subclass), ``runs(profile, *, rerun,
executor, device)`` (the runs its notebook shows, by part name, each found by
:func:`depthlib.results.select_run` or computed now), ``compute`` (one run into the local cache), ``replay``
(recompute a cheap prefix of a run with the current code), ``describe`` and ``summary`` (what the chapter's text
and the ``depthlib`` command say about a run) and ``COMPUTE`` (the compute entry of each experiment's runs). A run
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
