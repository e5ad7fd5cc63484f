"""What chapter 2's notebook says about the probed models, generated from their runs: the key-number table, figure
captions and the "Measured" paragraphs, every number computed here from the runs' tables and summaries (none typed by
hand). The signatures are the paper's §2: the angle θ(h_l, h_{l+1}) between neighbouring hidden states, the angle
θ(Δh_l, Δh_{l+1}) between successive updates, the token-trajectory clusters (§2.7) and the logit lens."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from depthlib import results
from depthlib.claims import Measurement, t_interval, wilson_interval
from depthlib.probes import trajectory
from depthlib.probes.chapter import angle_summary, ideal_distances, lens_precision, model_runs

__all__ = ["NEAR_ORTHOGONAL", "angles_paragraph", "answer", "clusters_paragraph", "depth_law_paragraph",
           "key_numbers", "lens_paragraph", "measurements", "middle_angle_per_doc", "middle_update_angle",
           "noise_paragraph", "relative_depth_caption", "run_lines", "updates_paragraph"]

#: an update angle within this of π/2 (rad) is called "near π/2": neighbouring updates nearly uncorrelated
NEAR_ORTHOGONAL = 0.1
#: the paper's middle-layer angle of Pythia-410m (24 blocks) on FineWeb, rad (its Fig. 2a)
PAPER_MIDDLE_ANGLE = 0.45


def middle_angle_per_doc(docs: pd.DataFrame) -> np.ndarray:
    """Each document's mean middle-block angle (the ``docs`` table: θ_0 … θ_{L−1} per document; the middle blocks of
    :func:`depthlib.measures.middle_blocks`)."""
    from depthlib.measures import middle_blocks
    cols = sorted((c for c in docs.columns if c.startswith("theta_") and c[6:].isdigit()), key=lambda c: int(c[6:]))
    return docs[cols].to_numpy(float)[:, middle_blocks(len(cols))].mean(1)


def middle_update_angle(layers: pd.DataFrame) -> tuple[float, float]:
    """(mean θ(Δh) over the middle pairs, its token-level standard error) from the ``layers`` table."""
    from depthlib.measures import middle_update_pairs
    dh = layers[layers["metric"] == "theta_dh"].sort_values("layer")
    if dh.empty:
        return math.nan, math.nan
    n_blocks = len(dh) + 1
    mid = dh.iloc[middle_update_pairs(n_blocks)]
    se = float((mid["std"] / np.sqrt(mid["count"])).mean())     # as if every pair moved together: the larger SE
    return float(mid["mean"].mean()), se


def run_lines(runs: dict[str, results.Run]) -> str:
    """One line per probed model: documents, corpus, tokens per document, valid tokens and dtype of its run."""
    lines = []
    for model, run in runs.items():
        man, s = run.manifest, run.manifest["summary"]
        lines.append(f"{model}: {s['n_docs']} documents of {man['corpus']} x <= {man['config']['max_length']} tokens "
                     f"= {s['n_tokens']} valid tokens, {s['dtype']}")
    return "\n".join(lines)


def key_numbers(runs: dict[str, results.Run], analysis: dict) -> pd.DataFrame:
    """One column per model: its depth, first, middle and last angles, mean update angle, the two trajectory
    clusters' shares and the model's loss (``analysis``: :func:`depthlib.probes.trajectory.analyze_trajectories` per
    model)."""
    def column(m: str, r: results.Run) -> dict:
        s = r.manifest["summary"]
        return {"blocks L": s["n_layers"], "first-block angle (rad)": s["theta_by_layer"][0],
                "middle-layer mean angle (rad)": s["theta_middle_mean"], "last-block angle (rad)": s["theta_by_layer"][-1],
                "mean update angle θ(Δh_l, Δh_l+1) (rad)": s["theta_dh_mean"],
                "cluster 'evenly' (%)": 100 * analysis[m].fractions["evenly"],
                "cluster 'stops early' (%)": 100 * analysis[m].fractions["stops early"],
                "model loss (nats/token)": s["ce_logit_by_layer"][-1]}
    return pd.DataFrame({m: column(m, r) for m, r in runs.items()})


def relative_depth_caption(runs: dict[str, results.Run]) -> str:
    """Caption of the angle profiles against relative depth: whether the deepest model's plateau lies below the
    shallowest's."""
    s = {m: r.manifest["summary"] for m, r in runs.items()}
    deep, shallow = max(s, key=lambda m: s[m]["n_layers"]), min(s, key=lambda m: s[m]["n_layers"])
    if deep == shallow:
        return "The same profile against relative depth l/L."
    below = s[deep]["theta_middle_mean"] < s[shallow]["theta_middle_mean"]
    return (f"The same profiles against relative depth l/L. The deeper model ({deep}, {s[deep]['n_layers']} blocks) "
            f"turns by {'smaller' if below else 'larger'} middle angles than {shallow} ({s[shallow]['n_layers']} "
            f"blocks): {s[deep]['theta_middle_mean']:.3f} against {s[shallow]['theta_middle_mean']:.3f} rad on average"
            + (". They are different families, so this is suggestive only." if below else
               ", against what 1/L scaling would give; they are different families, so this decides nothing."))


def angles_paragraph(runs: dict[str, results.Run], layers: dict[str, pd.DataFrame]) -> str:
    """The neighbouring-state angles: first, middle and last per model, and each model's largest middle rotation."""
    per = " ".join(f"{m}: first block {r.manifest['summary']['theta_by_layer'][0]:.2f} rad, middle-block mean "
                   f"{r.manifest['summary']['theta_middle_mean']:.3f} rad, last block "
                   f"{r.manifest['summary']['theta_by_layer'][-1]:.2f} rad ({r.manifest['profile']} profile, "
                   f"{r.manifest['summary']['n_tokens']} tokens)." for m, r in runs.items())
    spikes = " ".join(f"{m}: the largest middle-block rotation is block {s['spike_block']} ({s['spike_angle']:.2f} rad, "
                      f"{s['spike_angle'] / s['middle_mean']:.1f}× the middle mean)"
                      + (", so the middle is not uniform." if s["spike_angle"] > 2 * s["middle_mean"] else ".")
                      for m, s in ((m, angle_summary(layers[m])) for m in runs))
    return (f"**Measured.** {per} The paper reports ≈ {PAPER_MIDDLE_ANGLE} rad in the middle of Pythia-410m (24 blocks) "
            f"on FineWeb. {spikes}")


def updates_paragraph(layers: dict[str, pd.DataFrame]) -> str:
    """The angles between successive updates: a smooth flow gives ≈ 0, unrelated updates π/2 (within
    :data:`NEAR_ORTHOGONAL`)."""
    s = {m: angle_summary(t) for m, t in layers.items()}
    per = " ".join(f"{m}: mean update angle over the middle pairs {v['update_mean']:.2f} rad (π/2 = 1.57), lowest "
                   f"{v['update_min']:.2f} rad between blocks {v['update_min_pair']} and {v['update_min_pair'] + 1}."
                   for m, v in s.items())
    near = [m for m, v in s.items() if abs(v["update_mean"] - math.pi / 2) < NEAR_ORTHOGONAL]
    nearer_flow = [m for m, v in s.items() if v["update_mean"] < math.pi / 4]
    flow = ("Nearer a smooth flow's ≈ 0 than π/2: " + ", ".join(nearer_flow) + "." if nearer_flow else
            "Every model is nearer π/2 than a smooth flow's ≈ 0.")
    ortho = (f"Within {NEAR_ORTHOGONAL} rad of π/2: " + (", ".join(near) if near else "none") + ".")
    return f"**Measured.** {per} {flow} {ortho}"


def noise_paragraph(sensitivity: dict[float, results.Run], sens: pd.DataFrame, profile: str,
                    quantisation_eps: float = 0.08) -> str:
    """What weight noise of about a 4-bit quantisation's size (``quantisation_eps`` × std W) does to the angles of
    the model the ``sensitivity`` runs probe (``sens``: their :func:`depthlib.probes.sensitivity_table`)."""
    model = " and ".join(sorted({r.manifest["model"] for r in sensitivity.values()}))
    eps = sens["weight noise ε (× std W)"]
    base, q = sens.iloc[0], sens.iloc[int((eps - quantisation_eps).abs().idxmin())]
    steady = (sens["middle-block angle (rad)"].is_monotonic_increasing
              and sens["update angle θ(Δh) (rad)"].is_monotonic_increasing)
    return (f"**Measured** ({profile} profile, {int(base['documents'])} documents, {int(base['tokens'])} tokens): noise "
            f"of ε = {q.iloc[0]:g} × std W, about the size of the quantisation, moves {model}'s middle-block angle by "
            f"{q['Δ middle-block angle']:+.4f} rad (from {base['middle-block angle (rad)']:.4f}) and the update angle by "
            f"{q['Δ update angle θ(Δh)']:+.4f} rad (from {base['update angle θ(Δh) (rad)']:.4f}), while the model's "
            f"loss rises by {q['Δ model loss']:+.3f} nats/token. "
            + ("Both angles grow steadily with ε (the table), so the quantisation has probably raised the chapter's "
               "angles by an amount of this order: read them with that uncertainty." if steady else
               "The angles do not move monotonically with ε, so the size of the quantisation's effect is only bounded "
               "by the table, not its direction."))


def clusters_paragraph(tokens: dict[str, pd.DataFrame], analysis: dict, small: dict) -> str:
    """The two trajectory clusters (§2.7): how much of the small one is first tokens, and how far the large one is
    from the 'evenly' ideal (``small``: :func:`depthlib.probes.trajectory.small_cluster_tokens` per model)."""
    def one(m: str) -> str:
        theta = trajectory.theta_matrix(tokens[m])
        d, a, s = ideal_distances(theta, analysis[m]), analysis[m], small[m]
        return (f"{m}: the small cluster holds {100 * a.fractions['stops early']:.2f}% of {len(tokens[m])} sampled "
                f"tokens, and position 0 is {100 * s['share_position_0_overall']:.2f}% of them: "
                f"{100 * s['share_position_0']:.0f}% of the small cluster are first tokens of their document "
                f"({100 * s['share_special']:.0f}% special tokens), so the cluster is "
                f"{s['ratio_to_position_0_share']:.2f}× the position-0 share. The other {100 * a.fractions['evenly']:.1f}% "
                "are nearer the 'evenly' ideal than the 'stops early' one, which says they do not stop early, not that "
                f"they follow the even ideal: a typical token is {d['to_evenly']:.2f} rad (median distance over the "
                f"trajectory) from that ideal and {d['to_own_mean']:.2f} from its cluster's mean.")
    return ("**Measured.** " + " ".join(one(m) for m in tokens) + " One first token per document makes a small cluster "
            "whose size measures document length, so a percentage here and the paper's 0.4% (Pythia-410m, documents of "
            "up to 1024 tokens) compare document lengths as much as models.")


def lens_paragraph(layers: dict[str, pd.DataFrame]) -> str:
    """The logit lens's precision per model: tokens, the model's loss with its standard error, the loosest layer."""
    lens = {m: lens_precision(t) for m, t in layers.items()}
    return ("**Measured.** Each lens curve is a mean over a seeded random subsample of tokens (the same tokens whatever "
            "the batching): " + "; ".join(
                f"{m}: {p['tokens']} tokens, model loss {p['model_loss']:.2f} ± {p['model_loss_se']:.2f} nats (± 1 "
                f"standard error), the loosest point ± {p['max_se']:.1f} nats (the logit lens "
                + ("of the embedding h₀" if p["max_se_layer"] == 0 else f"after block {p['max_se_layer']}") + ")"
                for m, p in lens.items() if p)
            + ". Per-token losses through an early layer's lens are heavy-tailed, so read the shape through depth, not "
              "the early points' exact values.")


def depth_law_paragraph(depths: pd.DataFrame, fit: dict | None) -> str:
    """The middle-angle law ⟨θ⟩_mid ∝ L^−α through the probed models (``fit``: only through one family)."""
    if not fit:
        return ("**Not fitted.** The models shown are not one family, so a line through them would mix depth with "
                "everything else that differs between them.")
    return (f"**Measured.** Least-squares exponent through the {len(depths)} model(s) above: α = {fit['alpha']:.2f} "
            "(⟨θ⟩_mid ∝ L^−α; the paper finds ≈ 1 across Pythia). With models from different families this number "
            "mixes depth with everything else that differs between them.")


def answer(rows) -> str:
    """Chapter 2's answer (Markdown) from its verdict rows (:func:`depthlib.verdict.verdict`, chapter 2), each number
    as the verdict table prints it: the middle blocks' angle, the share of tokens updated evenly, and the angle between
    consecutive updates — near π/2 (within :data:`NEAR_ORTHOGONAL`) or, below π/4, nearer a smooth flow's 0."""
    from depthlib import verdict
    by = {r.claim.key: r for r in rows}
    if not any(r.measurements for r in rows):
        return "**Not tested here:** no probe run of this profile is available."

    def quoted(key: str, unit: str = "") -> str:
        return ", ".join(f"{m} {v}{unit}" for m, v in verdict.numbers(by[key]).items())
    dh = {m.model: m.value for m in by["update_angle"].measurements}
    near = [m for m, v in dh.items() if abs(v - math.pi / 2) < NEAR_ORTHOGONAL]
    flow = [m for m, v in dh.items() if v < math.pi / 4]
    other = [m for m in dh if m not in near and m not in flow]
    statuses = {by[k].status for k in ("middle_angle", "tokens_evenly", "update_angle")}
    lead = ("Yes" if statuses == {"reproduced"} else "Yes in direction, not in the paper's values"
            if statuses <= {"reproduced", "differs"} else "Partly")
    verdict_words = (f"{lead}: in the two small models that run offline, the middle blocks turn the state by small "
                     "angles and almost no token stops being updated early")
    text = (f"**{verdict_words}.** The middle blocks turn the state by {quoted('middle_angle', ' rad')} "
            f"(the paper: {PAPER_MIDDLE_ANGLE} rad in Pythia-410m; **{by['middle_angle'].status}**), and "
            f"{quoted('tokens_evenly')} of tokens are updated evenly through the middle (the paper: 99.6 %; "
            f"**{by['tokens_evenly'].status}**). Consecutive updates meet at {quoted('update_angle', ' rad')}: ")
    parts = []
    if near:
        parts.append(f"nearly orthogonal in {', '.join(near)}")
    if other:
        parts.append(f"far from parallel but not orthogonal in {', '.join(other)}")
    if flow:
        parts.append(f"nearer a smooth flow's parallel steps in {', '.join(flow)}")
    return text + "; ".join(parts) + f" (π/2 = 1.57; **{by['update_angle'].status}**)."


def measurements(parts: dict[str, results.Run | None]) -> dict[str, list]:
    """Chapter 2's numbers for the verdict's claims, per model it shows: the share of sampled tokens in the
    evenly-updated cluster (Wilson interval), the mean middle-block angle (t interval over documents) and the middle
    update angle θ(Δh) (token-level interval)."""
    out: dict[str, list[Measurement]] = {"tokens_evenly": [], "middle_angle": [], "update_angle": []}
    for model, run in model_runs(parts).items():
        if run is None:
            continue
        if "tokens" in run.tables():
            tokens = run.table("tokens")
            share = trajectory.analyze_trajectories(trajectory.theta_matrix(tokens)).fractions["evenly"]
            out["tokens_evenly"].append(Measurement(model, share, *wilson_interval(share, len(tokens)), run.profile,
                                                    f"{len(tokens)} sampled tokens; Wilson interval"))
        per_doc = middle_angle_per_doc(run.table("docs"))
        mean, se = float(per_doc.mean()), float(per_doc.std(ddof=1) / np.sqrt(len(per_doc)))
        out["middle_angle"].append(Measurement(model, mean, *t_interval(mean, se, len(per_doc) - 1), run.profile,
                                               f"mean over {len(per_doc)} documents; t interval"))
        dh, dh_se = middle_update_angle(run.table("layers"))
        out["update_angle"].append(Measurement(model, dh, dh - 1.96 * dh_se, dh + 1.96 * dh_se, run.profile,
                                               "token-level interval (tokens of a document are not independent)"))
    return out
