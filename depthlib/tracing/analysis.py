"""Summaries of traced tables (paper §6, Fig. 6): fact-set averages, the two functional groups, prompt peaks.

These read the tidy tables the tracer writes (:meth:`TraceResult.table`, :func:`trace_facts`, a chapter run's
``check``/``prompts``/``facts``) and are computed when a chapter is shown, so they are not part of a run's code
fingerprint: redrawing a committed run with new summaries needs no recomputation.

The paper's reading of Fig. 6: recovery at the last subject token in the early-to-middle layers (l/ℓ ≲ 0.6), at
the last token in the later layers, fluctuating from layer to layer inside each group: two functional groups of
layers, with the work distributed inside each.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from depthlib.tracing.facts import load_facts
from depthlib.tracing.patching import KINDS


def average_effect(table: pd.DataFrame, *, min_gap: float = 0.0) -> pd.DataFrame:
    """Mean normalised indirect effect by (model, kind, role, layer) over facts (ROME's average figure).

    Facts with p_clean − p_corrupt <= ``min_gap`` (the noise did not remove the fact) are left out.
    Columns: model, kind, role, layer, depth, effect (mean), sem (standard error), p (mean), n_facts.
    """
    t = table[(table["p_clean"] - table["p_corrupt"]) > min_gap]
    g = t.groupby(["model", "kind", "role", "layer", "depth"], sort=True)
    out = g.agg(effect=("effect", "mean"), sd=("effect", "std"), p=("p", "mean"),
                n_facts=("effect", "size")).reset_index()
    out["sem"] = out["sd"] / np.sqrt(out["n_facts"])
    return out.drop(columns="sd")


def _noise_jitter(facts: pd.DataFrame, baseline: pd.DataFrame, role: str, layers: list[int]) -> float:
    """Layer-to-layer jitter that sampling noise alone produces: per fact, d_l = effect under one noise seed minus
    effect under another; mean |d_l+1 − d_l| / √2 over the group's layers (the √2: d holds two noises), mean over facts."""
    keys = ["fact_id", "layer"]
    a = facts[(facts["role"] == role) & facts["layer"].isin(layers)][keys + ["effect"]]
    b = baseline[(baseline["role"] == role) & baseline["layer"].isin(layers)][keys + ["effect"]]
    both = a.merge(b, on=keys, suffixes=("", "_b")).sort_values(keys)
    both["d"] = both["effect"] - both["effect_b"]
    jit = both.groupby("fact_id")["d"].apply(lambda d: np.abs(np.diff(d.to_numpy())).mean() if len(d) > 1 else np.nan)
    return float(jit.mean() / np.sqrt(2)) if len(jit) else float("nan")


def functional_groups(facts_table: pd.DataFrame, kind: str = "block",
                      baseline: pd.DataFrame | None = None) -> pd.DataFrame:
    """The paper's reading of Fig. 6 made into numbers, one row per model.

    From the fact-set average of one kind: the *late group* = the blocks from the crossover on, where
    restoring the last token recovers at least as much as restoring the last subject token (for this block
    and every later one); the *early group* = the blocks below the crossover. Reports where each group
    sits (in l/ℓ), its peak mean effect, and how much recovery fluctuates from layer to layer inside it:
    ``jitter_fact`` = mean over facts of the mean |Δ effect| between neighbouring blocks (inside the group,
    at the group's token), ``jitter_mean`` = the same on the averaged curve. Averaging n facts shrinks pure
    sampling noise by about √n, so jitter_fact ≫ jitter_mean alone proves nothing; with ``baseline`` (the same
    facts traced under independent noise) ``jitter_noise`` is the jitter that noise alone produces, and only
    jitter_fact well above jitter_noise says the fluctuations belong to the facts. ``*_step`` is the largest
    rise of the mean curve between neighbouring blocks inside the group (a group made by one block has a step
    close to its peak).
    """
    rows = []
    avg = average_effect(facts_table[facts_table["kind"] == kind])
    for model, a in avg.groupby("model", sort=False):
        s = a[a["role"] == "last subject"].set_index("layer")["effect"]
        t = a[a["role"] == "last token"].set_index("layer")["effect"]
        L = int(a["layer"].max()) + 1
        # crossover: the first block from which restoring the last token beats the last subject token
        # for every later block; the early group is below it, the late group from it on (contiguous)
        cross = L
        for l in range(L - 1, -1, -1):
            if t.get(l, np.nan) >= s.get(l, np.nan):
                cross = l
            else:
                break
        early, late = list(range(cross)), list(range(cross, L))
        row = {"model": model, "kind": kind, "n_layers": L, "n_facts": int(a["n_facts"].max())}
        f = facts_table[(facts_table["model"] == model) & (facts_table["kind"] == kind)
                        & ((facts_table["p_clean"] - facts_table["p_corrupt"]) > 0)]
        for group, layers, role, curve in (("early", early, "last subject", s), ("late", late, "last token", t)):
            if not layers:
                continue
            row[f"{group}_from"] = (min(layers) + 1) / L
            row[f"{group}_to"] = (max(layers) + 1) / L
            row[f"{group}_peak_depth"] = (int(curve.loc[layers].idxmax()) + 1) / L
            row[f"{group}_peak_effect"] = float(curve.loc[layers].max())
            per = f[(f["role"] == role) & f["layer"].isin(layers)].sort_values("layer")
            jit = per.groupby("fact_id")["effect"].apply(lambda e: np.abs(np.diff(e.to_numpy())).mean()
                                                           if len(e) > 1 else np.nan)
            row[f"{group}_jitter_fact"] = float(jit.mean())
            half = [l for l in layers if curve.get(l, np.nan) >= 0.5]
            row[f"{group}_half_depth"] = (min(half) + 1) / L if half else float("nan")
            c = curve.loc[layers].to_numpy()
            row[f"{group}_jitter_mean"] = float(np.abs(np.diff(c)).mean()) if len(c) > 1 else float("nan")
            full = curve.sort_index()
            lo = max(min(layers) - 1, 0)
            seg = full.loc[lo:max(layers)]
            if len(seg) > 1:
                rise = seg.diff().iloc[1:]
                at = int(rise.idxmax())
                row[f"{group}_step"] = float(rise.max())            # the largest rise between neighbouring blocks
                row[f"{group}_step_block"] = at + 1                 # ... arriving at this block (1-based)
                row[f"{group}_step_from"] = float(full.loc[at - 1])
                row[f"{group}_step_to"] = float(full.loc[at])
            if baseline is not None and not baseline.empty:
                bf = baseline[(baseline["model"] == model) & (baseline["kind"] == kind)]
                row[f"{group}_jitter_noise"] = _noise_jitter(f, bf, role, layers)
        rows.append(row)
    return pd.DataFrame(rows)


def prompt_peaks(prompts_table: pd.DataFrame) -> pd.DataFrame:
    """Per (model, prompt, kind): p_clean, p_corrupt and where restoring recovers most, at the last subject
    token and at the last token (block l and l/ℓ, restored p), and the first block whose restoration at the
    last token recovers half of the fact (effect >= 0.5; for block outputs the peak there is trivially the
    last block, whose output *is* the clean prediction)."""
    rows = []
    for (model, prompt, kind), g in prompts_table.groupby(["model", "prompt", "kind"], sort=False):
        row = {"model": model, "prompt": prompt, "kind": kind, "target": g["target"].iloc[0],
               "p_clean": float(g["p_clean"].iloc[0]), "p_corrupt": float(g["p_corrupt"].iloc[0])}
        for role, tag in (("last subject", "subject"), ("last token", "last")):
            r = g[g["role"] == role].sort_values("layer")
            best = r.loc[r["p"].idxmax()]
            row[f"{tag}_peak_block"] = int(best["layer"]) + 1
            row[f"{tag}_peak_depth"] = float(best["depth"])
            row[f"{tag}_peak_p"] = float(best["p"])
        # where the late site takes over: the first block whose restoration at the last token recovers half
        half = g[(g["role"] == "last token") & (g["effect"] >= 0.5)]
        row["last_half_block"] = int(half["layer"].min()) + 1 if not half.empty else None
        row["last_half_depth"] = float(half["depth"].min()) if not half.empty else None
        rows.append(row)
    return pd.DataFrame(rows)


def _jitter(g: pd.Series, group: str) -> str:
    text = f"jitter per fact {g[f'{group}_jitter_fact']:.3f}, of the mean {g[f'{group}_jitter_mean']:.3f}"
    noise = g.get(f"{group}_jitter_noise")
    return text + (f", of noise alone {noise:.3f}" if noise is not None and pd.notna(noise) else "")


def closing_note(tables: dict[str, pd.DataFrame]) -> str:
    """The chapter's closing numbers as Markdown, read from a run's tables (:func:`chapter_tables`)."""
    lines = []
    peaks = prompt_peaks(tables["prompts"]) if not tables["prompts"].empty else pd.DataFrame()
    check = tables["check"]
    for model in dict.fromkeys(check["model"]):
        c = check[(check["model"] == model) & (check["kind"] == "fact")]
        lines.append(f"**{model}** gets {int(c['correct'].sum())} of the {len(c)} facts checked right at top-1 "
                     f"(the fact set has {len(load_facts())}).")
        pk = peaks[peaks["model"] == model] if not peaks.empty else peaks
        for row in pk.itertuples():
            lines.append(
                f"- \"{row.prompt}\" → \"{row.target}\", {row.kind}: p_clean = {row.p_clean:.3f}, "
                f"p_corrupt = {row.p_corrupt:.3f}; best recovery at the last subject token at block "
                f"{row.subject_peak_block} (l/ℓ = {row.subject_peak_depth:.2f}, p = {row.subject_peak_p:.3f}), "
                f"at the last token at block {row.last_peak_block} (l/ℓ = {row.last_peak_depth:.2f}, "
                f"p = {row.last_peak_p:.3f})" + (
                    f"; the last token recovers half from block {int(row.last_half_block)} "
                    f"(l/ℓ = {row.last_half_depth:.2f})." if pd.notna(row.last_half_block) else "."))
        f = tables["facts"]
        if f.empty or model not in set(f["model"]):
            continue
        for kind in [k for k in KINDS if k in set(f["kind"])]:
            b = tables.get("baseline")
            g = functional_groups(f[f["model"] == model], kind,
                                  b[b["model"] == model] if b is not None and not b.empty else None)
            if g.empty:
                continue
            g = g.iloc[0]
            parts = [f"- fact-set average ({int(g['n_facts'])} facts), {kind}:"]
            if "early_from" in g and pd.notna(g.get("early_from")):
                parts.append(f"early group l/ℓ {g['early_from']:.2f}–{g['early_to']:.2f} (peak effect "
                             f"{g['early_peak_effect']:.2f} at l/ℓ = {g['early_peak_depth']:.2f}; {_jitter(g, 'early')}),")
            if "late_from" in g and pd.notna(g.get("late_from")):
                half = (f"mean effect ≥ 0.5 from l/ℓ = {g['late_half_depth']:.2f}"
                        if pd.notna(g.get("late_half_depth")) else "mean effect < 0.5 throughout")
                step = (f"; the mean effect jumps {g['late_step_from']:.3f} → {g['late_step_to']:.3f} at block "
                        f"{int(g['late_step_block'])}" if pd.notna(g.get("late_step_block")) else "")
                parts.append(f"late group l/ℓ {g['late_from']:.2f}–{g['late_to']:.2f} ({half}{step}; "
                             f"{_jitter(g, 'late')}).")
            lines.append(" ".join(parts))
        lines.append("")
    return "\n".join(lines).strip()
