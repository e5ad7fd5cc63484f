"""Chapter 7 (ours): can depth be made compositional?

The paper (Liu et al., arXiv 2602.05970) ends (§5) on a proposal it does not test: architectures that reuse depth
(looped or tied blocks) or targets with real hierarchy might use depth compositionally and beat the 1/ℓ of ensemble
averaging (§3–4). This package trains small residual transformers on a target with known hierarchy, the random
hierarchy model (:mod:`depthlib.compose.rhm`), in three families that differ in how they reuse depth (chapter 6's
model with a schedule of its blocks, :mod:`depthlib.compose.network`), to convergence
(:mod:`depthlib.compose.train`), and runs the paper's hidden-state diagnostics (§2.7) and chapter 5's edits on them
(:mod:`depthlib.compose.diagnostics`; one run: :mod:`depthlib.compose.experiment`). The same families are trained on
an unseen, deeper grammar (:mod:`depthlib.compose.hierarchy`) and on chapter 6's text at chapter 6's certified
budget, with chapter 6's own model and training loop (:mod:`depthlib.compose.text_certified`), and looped students
in chapter 3's toy (:mod:`depthlib.compose.looped`), trained and certified by chapter 3's certified protocol
(:mod:`depthlib.compose.looped_certified`) and read by :mod:`depthlib.compose.looped_views`.
:mod:`depthlib.compose.analysis` holds the chapter's views of the runs, :mod:`depthlib.compose.chapter` its glue
(the chapter contract).
"""
