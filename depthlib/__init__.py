"""depthlib: the computations behind the Inverse Depth Scaling book.

Reproduces and extends Liu, Kangaslahti, Liu & Gore, "Inverse Depth Scaling From Most Layers Being
Similar" (ICML 2026, arXiv 2602.05970). One module per concept:

- :mod:`depthlib.data`     Chinchilla CSV, text corpora, pretrained models
- :mod:`depthlib.scaling`  the decomposed scaling law and its fits (paper §3, App. B)
- :mod:`depthlib.toy`      teacher-student residual networks (paper §4, App. C)
- :mod:`depthlib.probes`   hidden-state probes of real LLMs (paper §2, App. A)
- :mod:`depthlib.tracing`  ROME-style causal tracing (paper Fig. 6)
- :mod:`depthlib.plots`    plotly figures in one style; :mod:`depthlib.results` the results cache
"""
from depthlib.errors import InputError

__version__ = "0.1.0"
__all__ = ["InputError", "__version__"]
