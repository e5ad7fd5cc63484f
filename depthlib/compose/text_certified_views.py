"""Chapter 7's certified text part read for the notebook: its tables, its answer paragraph and the measurements the
verdict reads.

Everything here is read from a finished ``compose-text-certified`` run (:mod:`depthlib.compose.text_certified`): no
compute entry imports this module, so editing it never makes a run stale. Every function takes the run or a mapping
of its tables (table name → DataFrame, ``"config"`` → the run's config), so that the rules can be tested on tables
with known answers. Losses are held-out cross-entropies in nats per token; intervals are 95 % paired bootstraps over
the held-out documents.

**What is a result.** A family's α_ℓ is *shown* when its law is defined (at least
:data:`~depthlib.compose.text_certified.MIN_DEPTHS` effective depths, the point fit inside the searched range), its
interval does not reach a bound of the search (:data:`depthlib.lm.fit.ALPHA_RANGE`: an interval cut by the search
range is not an interval) and no refit without one depth reaches such a bound (a fit that one point moves to a bound
is not a result). A shown exponent *decides* a claim only when every member it is fitted on is certified
(chapter 3's continuation rule); otherwise the book reports it as measured on members still improving, with their
last gains.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from depthlib.claims import gain_range
from depthlib.lm import fit
from depthlib.sources import table as _table

__all__ = ["answer", "difference_display", "difference_table", "exponent_display", "exponent_table", "loss_changes",
           "loss_table", "measurements", "member_display", "settings_table", "signatures_display",
           "signatures_text"]

FAMILY_ORDER = ("untied", "looped", "tied")


def _iv(v: float, lo: float, hi: float, digits: int = 2) -> str:
    return f"{v:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]" if np.isfinite(lo) else f"{v:.{digits}f}"


def _at_search_bound(v: float, lo: float, hi: float) -> bool:
    a, b = fit.ALPHA_RANGE
    return bool(not (np.isfinite(lo) and np.isfinite(hi)) or lo <= a * 1.05 or hi >= b * 0.95
                or not a * 1.05 < v < b * 0.95)


def _order(families) -> list[str]:
    return [f for f in FAMILY_ORDER if f in set(families)]


def settings_table(source) -> pd.DataFrame:
    """What the part trained, as (setting, value) rows: the families and their effective depths, the seeds, the model,
    the budget and the certificate (all chapter 6's converged series'), and the held-out documents."""
    from depthlib.compose.network import schedule
    from depthlib.compose.text_certified import TextCertifiedConfig
    config = source.config if hasattr(source, "config") else source["config"]
    c = TextCertifiedConfig.from_dict(config)
    s, m = c.series, _table(source, "members")
    depths = {f: ", ".join(str(int(d)) for d in sorted(g["depth"].unique()))
              for f, g in m.groupby("family", sort=False)}
    n_docs = _table(source, "final_docs")["doc_id"].nunique()
    rows = [("families (effective depths ℓ)", "; ".join(f"{f}: {depths[f]}" for f in _order(depths))),
            ("untied family", "chapter 6's converged series, read from its run (not retrained)"),
            ("seeds", ", ".join(str(x) for x in c.seeds)),
            ("model", f"chapter 6's: width {s.model.d_model}, {s.model.n_heads} heads, context {s.model.context}, "
                      f"vocabulary {s.vocab_size}"),
            ("main training", f"{s.train.steps:,} steps × {s.tokens_per_step():,} tokens = "
                              f"{s.tokens_per_member() / 1e6:.2f} M tokens a member"),
            ("certificate", f"continuations of {s.continuation:g} × the steps so far, re-warmed and decayed, until "
                            f"one gains < {100 * s.gain_below:g} % (at most {s.max_continuations})"),
            ("intervals", f"95 % paired bootstrap over {n_docs} held-out documents ({c.n_bootstrap:,} resamples)")]
    same = [f"{f} ℓ = {int(d)}" for f, d in m[m["family"] != "untied"][["family", "depth"]].drop_duplicates()
            .itertuples(index=False) if schedule(f, int(d)) == schedule("untied", int(d))]
    if same:
        rows.append(("the same model as untied", ", ".join(same) + ": every application has its own block, as in the "
                     "untied member of that depth"))
    return pd.DataFrame(rows, columns=["setting", "value"])


def loss_table(source) -> pd.DataFrame:
    """One row per member: family, effective depth, seed, parameters, held-out loss at the end of its final stage,
    certified, continuations and their gains."""
    m = _table(source, "members")
    cols = ["family", "depth", "seed", "n_params", "val_loss", "certified", "continuations", "gains"]
    out = m[cols].copy()
    out["family"] = pd.Categorical(out["family"], _order(out["family"]), ordered=True)
    return out.sort_values(["family", "depth", "seed"]).reset_index(drop=True)


def exponent_table(source) -> pd.DataFrame:
    """Per family: α_ℓ [lo, hi], the effective depths it is fitted on, whether it is shown (:mod:`this module's rule
    <depthlib.compose.text_certified_views>`) and why not, α_ℓ without ℓ = 1 and the range of the drop-one-depth
    refits, and how many of its members are certified."""
    f = _table(source, "fit")
    f = f[f["quantity"] == "alpha"].set_index("family")
    sens = _table(source, "sensitivity")
    m = _table(source, "members")
    rows = []
    for family in _order(f.index):
        r = f.loc[family]
        s = sens[sens["family"] == family] if len(sens) else sens
        drop = s[s["left_out"] > 0] if len(s) else s
        without_1 = s.loc[s["left_out"] == 1, "alpha"] if len(s) else pd.Series(dtype=float)
        mine = m[m["family"] == family]
        if not bool(r["defined"]):
            why = (f"{int(r['n_depths'])} effective depths (the law L∞ + c·ℓ^−α needs 4)" if r["n_depths"] < 4
                   else "the fit is at a bound of the searched range")
        elif _at_search_bound(r["value"], r["lo"], r["hi"]):
            why = "its interval reaches a bound of the searched range"
        elif len(drop) and any(_at_search_bound(a, a, a) for a in drop["alpha"]):
            why = "a refit without one depth reaches a bound of the searched range: one point moves it"
        else:
            why = ""
        rows.append({"family": family, "alpha": r["value"], "lo": r["lo"], "hi": r["hi"],
                     "depths": ", ".join(str(int(d)) for d in sorted(mine["depth"].unique())),
                     "shown": not why, "why_not": why,
                     "without_1": float(without_1.iloc[0]) if len(without_1) else np.nan,
                     "drop_one_min": float(drop["alpha"].min()) if len(drop) else np.nan,
                     "drop_one_max": float(drop["alpha"].max()) if len(drop) else np.nan,
                     "n_certified": int(mine["certified"].sum()), "n_members": int(len(mine))})
    return pd.DataFrame(rows)


def difference_table(source) -> pd.DataFrame:
    """Per reused family whose exponent is shown (:func:`exponent_table`): its α_ℓ minus the untied family's refitted
    on the same effective depths, with its paired interval, and where that interval lies (above 0, below 0, or
    straddling it)."""
    d = _table(source, "difference").copy()
    shown = set(exponent_table(source).query("shown")["family"])
    d = d[d["family"].isin(shown)].reset_index(drop=True)
    d["reading"] = np.where(d["lo"] > 0, "steeper than untied",
                            np.where(d["hi"] < 0, "shallower than untied", "not resolved from untied"))
    return d


def loss_changes(source, n_resamples: int = 1000, seed: int = 0) -> pd.DataFrame:
    """What more block applications buy, with 95 % paired bootstrap intervals over the held-out documents (every
    member's held-out loss is the token-weighted mean over the same resampled documents; resample 0 is the data), in
    nats/token: per family and effective depth, the loss minus the family's own shallowest member's (``against`` =
    ``"shallowest"``), and for the reused families the loss minus the untied member of the same effective depth
    (``"untied"``). Columns family, depth, against, reference_depth, value, lo, hi. Negative: lower loss."""
    docs = _table(source, "final_docs")
    cube = {}                                     # (family, depth) → (nll, tokens): (seed, doc), documents sorted
    for family, g in docs.groupby("family"):
        depths, nll, tokens = fit._cube(g, "nll_sum", "n_tokens")          # chapter 6's paired bootstrap's arrays
        cube.update({(family, int(d)): (nll[i], tokens[i]) for i, d in enumerate(depths)})
    draws, _ = fit._resample_index(docs["doc_id"].nunique(), 1, n_resamples, seed)   # resample 0: the documents

    def losses(key) -> np.ndarray:                # (n_resamples,): mean over seeds of the resampled token-mean loss
        nll, tok = cube[key]
        return (nll[:, draws].sum(2) / tok[:, draws].sum(2)).mean(0)
    rows = []
    for family in _order({f for f, _ in cube}):
        depths = sorted(d for f, d in cube if f == family)
        for depth in depths:
            refs = [("shallowest", family, depths[0])] if depth != depths[0] else []
            if family != "untied" and ("untied", depth) in cube:
                refs.append(("untied", "untied", depth))
            for name, ref_family, ref_depth in refs:
                diff = losses((family, depth)) - losses((ref_family, ref_depth))
                lo, hi = fit.interval(diff)
                rows.append({"family": family, "depth": depth, "against": name, "reference_depth": ref_depth,
                             "value": float(diff[0]), "lo": lo, "hi": hi})
    return pd.DataFrame(rows, columns=["family", "depth", "against", "reference_depth", "value", "lo", "hi"])


def _change(c: pd.DataFrame, family: str, against: str) -> str:
    """``family``'s deepest member's row of :func:`loss_changes` against ``against``, as "value [lo, hi]"."""
    r = c[(c["family"] == family) & (c["against"] == against)]
    r = r[r["depth"] == r["depth"].max()]
    return "—" if r.empty else f"{r['value'].iloc[0]:+.3f} [{r['lo'].iloc[0]:+.3f}, {r['hi'].iloc[0]:+.3f}]"


# ---- the tables as the notebook shows them (readable headers, units, formatted numbers) ------------------------------
def member_display(source) -> pd.DataFrame:
    """:func:`loss_table` for a reader: per member its parameters, held-out loss (nats/token), whether it is certified
    and every continuation's gain (%, the held-out loss it removed)."""
    t = loss_table(source)

    def gains(text) -> str:
        return ", ".join(f"{100 * float(g):+.2f} %" for g in str(text).split(",") if g.strip()) or "—"
    return pd.DataFrame({"family": t["family"].astype(str), "effective depth ℓ": t["depth"], "seed": t["seed"],
                         "parameters": t["n_params"].map("{:,}".format),
                         "held-out loss (nats/token)": t["val_loss"].map("{:.4f}".format),
                         "certified": t["certified"].map({True: "yes", False: "no"}),
                         "continuation gains (held-out loss lowered)": t["gains"].map(gains)}
                        ).set_index(["family", "effective depth ℓ"])


def exponent_display(source) -> pd.DataFrame:
    """:func:`exponent_table` for a reader: per family its effective depths, α_ℓ with its 95 % paired bootstrap
    interval (or why it is not shown), α_ℓ without ℓ = 1, the range of the refits without one depth and how many of
    its members are certified."""
    e = exponent_table(source)
    return pd.DataFrame({
        "family": e["family"], "effective depths": e["depths"],
        "α_ℓ [95 % bootstrap]": [_iv(r.alpha, r.lo, r.hi) if r.shown else f"not shown: {r.why_not}"
                                 for r in e.itertuples()],
        "α_ℓ without ℓ = 1": [f"{v:.2f}" if np.isfinite(v) else "—" for v in e["without_1"]],
        "drop-one-depth range": [f"{a:.2f}–{b:.2f}" if np.isfinite(a) else "—"
                                 for a, b in zip(e["drop_one_min"], e["drop_one_max"])],
        "members certified": [f"{r.n_certified} of {r.n_members}" for r in e.itertuples()]}).set_index("family")


def signatures_display(source) -> pd.DataFrame:
    """Chapter 2's hidden-state signatures of every member's final stage (table ``probe_summary``, chapter 6's probes
    on the held-out probe text): the mean angle θ(h_l, h_l+1) of the middle block applications, the mean angle
    θ(Δh_l, Δh_l+1) between consecutive updates (π/2: unrelated updates, as in an ensemble; near 0: one direction, as
    along a smooth flow) and the first and last application's angles, all in radians; one seed, so no interval (each
    is a mean over the probe tokens). Depth 1 has no consecutive updates: "—"."""
    p = _table(source, "probe_summary")
    p = p.assign(order=p["family"].map({f: i for i, f in enumerate(FAMILY_ORDER)})).sort_values(["order", "depth"])

    def rad(v) -> str:
        return f"{v:.2f}" if np.isfinite(v) else "—"
    return pd.DataFrame({"family": p["family"].astype(str), "effective depth ℓ": p["depth"].astype(int),
                         "θ(h_l, h_l+1), middle (rad)": p["theta_middle_mean"].map(rad),
                         "θ(Δh_l, Δh_l+1) (rad)": p["theta_dh_mean"].map(rad),
                         "θ first block (rad)": p["theta_first"].map(rad),
                         "θ last block (rad)": p["theta_last"].map(rad),
                         "stage probed": p["stage"].astype(str).str.replace(r"^c(\d+)$", r"continuation \1",
                                                                            regex=True)
                         }).set_index(["family", "effective depth ℓ"])


def signatures_text(source) -> str:
    """One sentence (Markdown) from ``probe_summary``: at the deepest effective depth every family has, the angle
    between consecutive updates θ(Δh) of each family (rad), read against π/2 (an ensemble's unrelated updates) and 0
    (a flow's updates in one direction) by the half-way edge π/4 that chapter 3's signature rows use."""
    p = _table(source, "probe_summary")
    deep = int(p.groupby("family")["depth"].max().min())
    at = p[p["depth"] == deep].set_index("family")["theta_dh_mean"]
    fams = [f for f in _order(at.index) if np.isfinite(at[f])]
    if not fams:
        return f"At ℓ = {deep} no member has consecutive updates to compare."
    said = ", ".join(f"{at[f]:.2f} rad ({f})" for f in fams)
    near_flow = [f for f in fams if at[f] < np.pi / 4]
    reading = (f"below π/4, nearer a flow's parallel updates than an ensemble's unrelated ones: {', '.join(near_flow)}"
               if near_flow else "every family above π/4, nearer an ensemble's unrelated updates than a flow's")
    return (f"At effective depth ℓ = {deep} the angle between consecutive updates θ(Δh_l, Δh_l+1) is {said}; "
            f"{reading}.")


def difference_display(source) -> pd.DataFrame:
    """:func:`difference_table` for a reader: each reused family's α_ℓ minus the untied family's on the same effective
    depths, with its 95 % paired bootstrap interval, and where that interval lies; without a reused family whose
    exponent is shown, one row that says so."""
    d = difference_table(source)
    if d.empty:
        return pd.DataFrame({"α_ℓ − α_ℓ(untied)": ["no reused family has an exponent that is shown: nothing to compare"]},
                            index=pd.Index(["looped, tied"], name="family"))
    return pd.DataFrame({"family": d["family"], "effective depths": d["depths"],
                         "α_ℓ − α_ℓ(untied) [95 % paired]": [f"{r.value:+.2f} [{r.lo:+.2f}, {r.hi:+.2f}]"
                                                             for r in d.itertuples()],
                         "reading": d["reading"]}).set_index("family")


def measurements(source) -> list[dict]:
    """What the verdict reads for the claim that reusing depth keeps α_ℓ below 2 (``looped_text``): per reused family,
    its α_ℓ and interval where it is shown, else no value (NaN) and the reason — a run that gives no exponent it can
    stand behind leaves the claim undecided, not untested — the depths, whether every member is certified and how many
    are (``certified_of``: (certified, of))."""
    out = []
    for r in exponent_table(source).itertuples():
        if r.family == "untied":
            continue
        certified = f"{r.n_certified} of {r.n_members} members certified"
        out.append({"family": r.family, "value": r.alpha if r.shown else np.nan,
                    "lo": r.lo if r.shown else np.nan, "hi": r.hi if r.shown else np.nan, "depths": r.depths,
                    "certified": bool(r.shown and r.n_certified == r.n_members),
                    "certified_of": (int(r.n_certified), int(r.n_members)),
                    "note": (f"95 % paired bootstrap over held-out documents; {certified}" if r.shown
                             else f"{certified}; {r.family}: no exponent ({r.why_not})")})
    return out


def _alpha_phrase(r) -> str:
    if not r.shown:
        return f"{r.family}: no exponent ({r.why_not})"
    text = f"{r.family} {_iv(r.alpha, r.lo, r.hi)}"
    if np.isfinite(r.drop_one_min):
        text += f" (drop-one-depth {r.drop_one_min:.2f}–{r.drop_one_max:.2f})"
    return text


def answer(source) -> str:
    """The part's answer (Markdown, one paragraph): the exponent of each family with its interval and sensitivity,
    the reused families' differences from untied, and whether the members are certified (else: undecided, with the
    last gains)."""
    e = exponent_table(source)
    d = difference_table(source)
    m = _table(source, "members")
    tokens = int(m["tokens_main"].iloc[0]) if "tokens_main" in m else None
    certified = bool(m["certified"].all())
    text = ("**Reusing depth on chapter 6's text, at chapter 6's certified budget"
            + (f" ({tokens / 1e6:.2f} M tokens a member before continuations)" if tokens else "") + ".** ")
    text += "α_ℓ over effective depth: " + "; ".join(_alpha_phrase(r) for r in e.itertuples()) + ". "
    if len(d):
        text += "Against the untied family on the same effective depths: " + "; ".join(
            f"{r.family} {r.value:+.2f} [{r.lo:+.2f}, {r.hi:+.2f}] ({r.reading})" for r in d.itertuples()) + ". "
    c = loss_changes(source)
    spans = {f: (int(g["depth"].min()), int(g["depth"].max())) for f, g in m.groupby("family")}
    text += ("What more applications buy (held-out loss, nats/token, 95 % paired bootstrap over documents): from its "
             "shallowest to its deepest member " + "; ".join(
                 f"{f} (ℓ = {spans[f][0]} → {spans[f][1]}) {_change(c, f, 'shallowest')}" for f in _order(spans))
             + ". ")
    reused = [f for f in _order(spans) if f != "untied"]
    if reused and "untied" in spans:
        text += ("Against the untied member of the same effective depth, at the deepest: " + "; ".join(
            f"{f} {_change(c, f, 'untied')}" for f in reused) + ". ")
    if certified:
        text += f"All {len(m)} members are certified (a continuation gained < 2 %)."
    else:
        open_ = m[~m["certified"]]
        text += (f"**Undecided:** {len(open_)} of {len(m)} members are not certified (last continuation gains "
                 f"{gain_range(open_['last_gain'])}), so these exponents "
                 "are measured on members still improving and decide no claim.")
    return text
