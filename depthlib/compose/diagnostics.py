"""The paper's hidden-state diagnostics and chapter 5's edits, on one trained member of a compose family.

On the probe set (its own stream of fresh sequences, every token of every sequence) the residual stream h_0 … h_ℓ of
:meth:`depthlib.compose.network.GrammarNet.forward` gives, as chapter 2 computes them on LLMs (paper §2.7, Fig. 2):

* θ(h_l, h_{l+1}) per block and token (:func:`depthlib.measures.angle_between`, fp32), its middle-block mean
  (:func:`depthlib.measures.middle_blocks`);
* θ(Δh_l, Δh_{l+1}) between consecutive updates, over the middle pairs (:func:`depthlib.measures.middle_update_pairs`):
  near π/2 for ensemble averaging, near 0 for a smooth (ODE-like) flow;
* the **long-lag cosine** cos(Δh_l, Δh_{l+k}) averaged over l and tokens for every lag k; its mean over k ≥ ℓ/4
  (k ≥ 1) says whether distant blocks push the state the same way (a shared direction, as a tied block or a flow
  would) or not;
* the trajectory clusters of Fig. 2b (:func:`depthlib.probes.trajectory.analyze_trajectories`): the share of tokens
  near the "updated evenly" ideal, the number behind the paper's "99.6 % — not compositional" (§2.7), for ℓ ≥ 4.

And chapter 5's edits (paper §2.5's reading: an ensemble survives the loss of one member and does not care about the
order of its members; an assembly line does), as forward passes with another schedule:

* **delete** the application at position j (every j): Δloss;
* **swap** the applications at positions j and j+1 (every j);
* **permute** the middle applications (1 … ℓ−2) at random (``n_permutations`` seeded draws, never the identity).

Δloss is in nats per token on the probe set. In a tied or looped member the middle applications are one block, so a
swap or a permutation of them is the same schedule (Δloss 0 by construction, not recorded).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import torch

from depthlib.compose.network import GrammarNet
from depthlib.measures import angle_between, middle_blocks, middle_update_pairs
from depthlib.probes.trajectory import analyze_trajectories

#: the smallest depth whose trajectories are clustered (two middle blocks, as chapter 6's angle fits)
CLUSTER_MIN_DEPTH = 4


def _loss(model: GrammarNet, leaves: torch.Tensor, order: list[int]) -> float:
    from depthlib.compose.train import evaluate
    return float(evaluate(model, leaves, order=order).mean())


@torch.no_grad()
def diagnose(model: GrammarNet, leaves: torch.Tensor, bayes: float, *, n_permutations: int = 4,
             seed: int = 0) -> dict[str, pd.DataFrame | dict]:
    """The diagnostics of one member on ``leaves`` (the probe set; ``bayes`` its mean Bayes loss): tables
    ``layers`` (metric, layer, mean, std), ``lags`` (k, cos), ``clusters``, ``edits`` (edit, position, loss, delta)
    and the dict ``summary`` of the numbers the chapter states."""
    model.eval()
    logits, hs = model(leaves, states=True)
    d = hs[0].shape[-1]
    h = torch.stack([x.reshape(-1, d) for x in hs])                      # (ℓ + 1, tokens, d)
    dh = h[1:] - h[:-1]                                                  # (ℓ, tokens, d)
    depth = dh.shape[0]
    theta = angle_between(h[:-1], h[1:]).T.numpy().astype(np.float64)    # (tokens, ℓ)
    rows = [{"metric": "theta", "layer": b, "mean": float(theta[:, b].mean()), "std": float(theta[:, b].std())}
            for b in range(depth)]
    theta_dh = angle_between(dh[:-1], dh[1:]).T.numpy() if depth > 1 else np.zeros((theta.shape[0], 0))
    rows += [{"metric": "theta_dh", "layer": b, "mean": float(theta_dh[:, b].mean()),
              "std": float(theta_dh[:, b].std())} for b in range(depth - 1)]
    lags = []
    for k in range(1, depth):
        cos = torch.nn.functional.cosine_similarity(dh[:-k], dh[k:], dim=-1)       # (ℓ − k, tokens)
        lags.append({"k": k, "cos": float(cos.mean()), "pairs": int(depth - k)})
    lags = pd.DataFrame(lags, columns=["k", "cos", "pairs"])
    long = lags[lags["k"] >= max(1.0, depth / 4)]
    base = _loss(model, leaves, model.schedule)
    excess = base - bayes
    edits = [{"edit": "delete", "position": j, "loss": _loss(model, leaves, model.schedule[:j] + model.schedule[j + 1:])}
             for j in range(depth) if depth > 1]
    untied = len(set(model.schedule)) == depth
    if untied and depth > 1:
        for j in range(depth - 1):
            order = list(model.schedule)
            order[j], order[j + 1] = order[j + 1], order[j]
            edits.append({"edit": "swap", "position": j, "loss": _loss(model, leaves, order)})
    if untied and depth > 3:
        rng = np.random.default_rng([seed, depth, 7])
        for p in range(n_permutations):
            middle = list(model.schedule[1:-1])
            while middle == model.schedule[1:-1]:                  # never the identity
                middle = [int(b) for b in rng.permutation(model.schedule[1:-1])]
            edits.append({"edit": "permute", "position": p,
                          "loss": _loss(model, leaves, [model.schedule[0], *middle, model.schedule[-1]])})
    edits = pd.DataFrame(edits, columns=["edit", "position", "loss"])
    edits["delta"] = edits["loss"] - base
    mid = middle_blocks(depth)
    deleted_mid = edits[(edits["edit"] == "delete") & edits["position"].between(1, depth - 2)]
    summary = {"probe_loss": base, "probe_bayes": bayes, "probe_excess": excess,
               "theta_middle_mean": float(theta[:, mid].mean()),
               "theta_first": float(theta[:, 0].mean()), "theta_last": float(theta[:, -1].mean()),
               "theta_dh_mean": float(theta_dh[:, middle_update_pairs(depth)].mean()) if depth > 1 else np.nan,
               "long_lag_cos": float(long["cos"].mean()) if len(long) else np.nan,
               "delete_middle_delta": float(deleted_mid["delta"].mean()) if len(deleted_mid) else np.nan,
               "delete_middle_max": float(deleted_mid["delta"].max()) if len(deleted_mid) else np.nan,
               "delete_first_delta": float(edits.loc[(edits["edit"] == "delete") & (edits["position"] == 0),
                                                     "delta"].mean()) if depth > 1 else np.nan,
               "swap_delta": float(edits.loc[edits["edit"] == "swap", "delta"].mean()) if untied and depth > 1 else np.nan,
               "permute_delta": float(edits.loc[edits["edit"] == "permute", "delta"].mean())
               if untied and depth > 3 else np.nan}
    clusters = pd.DataFrame(columns=["cluster", "kind", "fraction", "block", "theta"])
    if depth >= CLUSTER_MIN_DEPTH:
        analysis = analyze_trajectories(theta)
        summary["cluster_evenly"] = analysis.fractions.get("evenly", np.nan)
        summary["cluster_explained_pc1"] = float(analysis.explained[0])
        clusters = pd.DataFrame([{"cluster": name, "kind": kind, "fraction": analysis.fractions.get(name, np.nan),
                                  "block": b + 1, "theta": float(v)}
                                 for kind, table in (("cluster mean", analysis.cluster_means),
                                                     ("ideal", analysis.ideals))
                                 for name, traj in table.items() for b, v in enumerate(traj)])
    else:
        summary["cluster_evenly"] = np.nan
        summary["cluster_explained_pc1"] = np.nan
    return {"layers": pd.DataFrame(rows), "lags": lags, "clusters": clusters, "edits": edits, "summary": summary}


__all__ = ["CLUSTER_MIN_DEPTH", "diagnose"]
