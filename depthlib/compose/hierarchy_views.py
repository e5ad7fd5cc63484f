"""Chapter 7's hierarchy part read for the notebook: its tables, its answer paragraph and its verdict rows.

Everything here is read from a finished ``compose-hierarchy-lm`` run (:mod:`depthlib.compose.hierarchy`): no compute
entry imports this module, so editing it never makes a run stale. Every function takes the run or a mapping of its
tables (table name → DataFrame, with ``"config"`` → the run's config and ``"manifest"`` → its manifest), so that the
rules can be tested on tables with known answers. Units: next-leaf excess in nats per leaf, root cross-entropy in
nats per sequence, root error a fraction of held-out sequences, exponents dimensionless; intervals are 95 % t
intervals over replicates unless a row says otherwise.

**The verdict rows** (:func:`verdict_rows`) decide each claim by a rule stated in its row, with three statuses:

* ``holds`` — the measurement is what the claim predicts;
* ``contradicted`` — the measurement is what the row names as contradicting it;
* ``undecided`` — the rule cannot say. In particular a number from members that are still improving decides nothing,
  whatever its interval (the book's rule for chapters 3, 6 and 7): every row about an exponent or a change in slope
  is undecided unless every member it is fitted on is certified (:mod:`depthlib.compose.certify`), and says how far
  the number moved over the last round of continuations beside it. The exponent rows use the book's region for
  chapter 7 (:data:`depthlib.claims.CLAIMS`, ``hierarchical`` and ``looped``: α_ℓ < 2, half-way between ensemble
  averaging's 1 and a smooth flow's 3).

The rows that need no certificate: the held-out set is unseen (an exact count), local statistics do not solve the
target (a trained member's loss only falls with more training, and the n-gram tables are counted on as many
sequences as the longest member drew), every member is certified (the certificate itself), and whether the exponent
still moves from round to round.

**The diagnostics and chapter 5's edits** (:func:`diagnostics_table`, :func:`edits_table`, :func:`diagnostics_text`):
the paper's hidden-state measurements of the next-leaf members (angles in rad, cosines dimensionless, cluster shares
in % of probe tokens) and the cost of deleting, swapping and reordering middle block applications (next leaf: nats per
leaf; root: the rise of the error, a fraction of the probe sequences). :func:`separation_rows` reads each against what
an ensemble predicts — **separates**, **reads as an ensemble** or **undecided** (:data:`READINGS`) — by a rule stated
in its docstring; these readings are about the measurements, not claims of the verdict, and need no certificate (they
describe the members as trained). The numbers behind the figures reuse the rhm part's views
(:func:`depthlib.compose.analysis.diagnostic_table` and its profiles) on the next-leaf task's tables.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from depthlib import claims
from depthlib.compose import analysis
from depthlib.compose.analysis import mean_interval
from depthlib.sources import config as _config
from depthlib.sources import manifest as _manifest
from depthlib.sources import table as _table

__all__ = ["BREAK_MARGIN", "DELETE_EDGE", "EDITS", "EDIT_KEYS", "EDIT_UNITS", "FAR_BELOW", "READINGS", "SHORT",
           "STATUSES", "answer", "baseline_table", "certification_table", "diagnostic_numbers", "diagnostics_table",
           "diagnostics_text", "edit_costs", "edits_table", "exponent_table", "gains_table", "lag_profiles",
           "layer_profiles", "loss_table", "measurements", "round_table", "separation_rows", "settings_table",
           "slope_change_table", "unseen_text", "verdict_rows", "verdict_table", "zero_error_depths"]

STATUSES = ("holds", "contradicted", "undecided")
#: "far above": the best n-gram's excess must be at least this many times the deepest untied member's
FAR_BELOW = 2.0
#: a change in slope whose intervals both lie inside ±this is "no threshold" (half of ensemble averaging's α = 1)
BREAK_MARGIN = 0.5
_CLAIMS = {c.key: c for c in claims.CLAIMS}
#: the quantity each task's exponent rows read (the certified one: excess for the next leaf, error for the root)
TASK_QUANTITY = {"leaf": "leaf excess", "root": "root error"}
_UNITS = {"leaf excess": "nats/leaf", "root cross-entropy": "nats/sequence", "root error": "fraction"}


def _members(source) -> pd.DataFrame:
    m = _table(source, "members").copy()
    if "error" not in m:
        m["error"] = np.where(m["task"] == "root", 1.0 - m["accuracy"], np.nan)
    return m


def _iv(v: float, lo: float, hi: float, digits: int = 2, *, pct: bool = False, sig: bool = False) -> str:
    """"v [lo, hi]", "v" without an interval, "—" without a value; ``pct``: a share in % (interval clipped to
    [0, 1]); ``sig``: three significant digits."""
    if not np.isfinite(v):
        return "—"
    if pct:
        lo, hi = max(lo, 0.0), min(hi, 1.0)
    f = ((lambda x: f"{100 * x:.1f}") if pct else (lambda x: f"{x:.3g}") if sig else (lambda x: f"{x:.{digits}f}"))
    return f"{f(v)} [{f(lo)}, {f(hi)}]" if np.isfinite(lo) and np.isfinite(hi) else f(v)


def _num(v: float) -> str:
    """A small loss or error to three significant digits."""
    return _iv(v, np.nan, np.nan, sig=True)


def _gain_range(g: pd.Series) -> str:
    return claims.gain_range(g) or "—"


# ---- tables --------------------------------------------------------------------------------------------------------
def settings_table(source, profile: str) -> pd.DataFrame:
    """The grammar, the tasks, families and the budget, one row per setting (column ``<profile> profile``)."""
    from depthlib.compose.hierarchy import HierarchyConfig
    cfg, man, g = _config(source), _manifest(source), _table(source, "grammar").iloc[0]
    c = HierarchyConfig.from_dict(cfg)
    members = _members(source)
    train, cert = cfg["train"], cfg["certificate"]
    depths = {f: sorted(members.loc[members["family"] == f, "depth"].unique().tolist())
              for f in members["family"].unique()}
    stages = [c.train.steps]
    for _ in range(c.certificate.max_continuations):
        stages.append(c.certificate.continuation_config(c.train, sum(stages)).steps)
    return pd.Series({
        "grammar (v, m, s, L)": f"({int(g['v'])}, {int(g['m'])}, {int(g['s'])}, {int(g['L'])}), seed {int(g['seed'])}",
        "leaves per sequence": int(g["length"]),
        "distinct sequences Ω": f"{float(g['n_sequences']):.2e}",
        "Bayes next-leaf loss of the held-out set (nats/leaf)": f"{float(g['bayes']):.4f} (log v = "
                                                                 f"{float(g['uniform']):.4f})",
        "tasks": ", ".join(cfg["tasks"]),
        **{f"effective depths, {f}": ", ".join(map(str, d)) for f, d in depths.items()},
        "replicates (initialisation and samples)": len(cfg["seeds"]),
        "width d_model / heads": f"{cfg['model']['d_model']} / {cfg['model']['n_heads']}",
        "main stage: steps × fresh sequences": f"{train['steps']} × {train['batch_size']}",
        "continuations (each half the steps so far)": f"at most {cert['max_continuations']}: "
                                                      + " + ".join(map(str, stages[1:])) + " steps",
        "most sequences per member": f"{sum(stages) * int(train['batch_size']):,}",
        "certificate": f"a continuation gains < {100 * cert['gain_below']:.0f} % (leaf: excess, floor "
                       f"{cert['resolution']:g} nats; root: error, floor {cert.get('resolution_sequences', 3)} "
                       "held-out sequences)",
        "held-out / probe sequences": f"{train['n_held_out']} / {cfg['n_probe']}",
        "held-out sequences seen in training (exact)": f"{man.get('held_out_overlap', '—')} of "
                                                       f"{man.get('training_sequences', 0):,} draws",
        "members trained": len(members)}, name=f"{profile} profile").to_frame()


def loss_table(source) -> pd.DataFrame:
    """quantity, family, depth, value (mean over replicates), lo, hi (95 % t), replicates, certified (how many of
    them): the next-leaf excess, the root cross-entropy and the root error of every (family, depth)."""
    m = _members(source)
    rows = []
    for quantity, (task, col) in {"leaf excess": ("leaf", "excess"), "root cross-entropy": ("root", "excess"),
                                  "root error": ("root", "error")}.items():
        for (family, depth), g in m[m["task"] == task].groupby(["family", "depth"], sort=False):
            v, lo, hi, n = mean_interval(g[col])
            rows.append({"quantity": quantity, "family": family, "depth": int(depth), "value": v, "lo": lo, "hi": hi,
                         "replicates": n, "certified": int(g["certified"].astype(bool).sum())})
    return pd.DataFrame(rows).sort_values(["quantity", "family", "depth"], kind="stable").reset_index(drop=True)


def certification_table(source) -> pd.DataFrame:
    """Per task and family: members, certified, the continuations run (range) and the last continuation's gain of the
    members not certified (range, %): what the certificate says and why."""
    m = _members(source)
    rows = []
    for (task, family), g in m.groupby(["task", "family"], sort=False):
        open_ = g[~g["certified"].astype(bool)]
        rows.append({"task": task, "family": family, "certified quantity": TASK_QUANTITY[task].split()[-1],
                     "members": len(g), "certified": int(g["certified"].astype(bool).sum()),
                     "continuations run": f"{int(g['continuations'].min())}–{int(g['continuations'].max())}",
                     "last gain, not certified": _gain_range(open_["last_gain"])})
    return pd.DataFrame(rows).set_index(["task", "family"])


def gains_table(source) -> pd.DataFrame:
    """Every continuation's gain: task, family, depth, seed, round (1, 2, …), gain (fraction of the certified
    quantity before it), sequences (drawn by the member up to the end of that continuation)."""
    st = _table(source, "stages")
    st = st.assign(round=st["stage"].map(lambda s: 0 if s == "main" else int(str(s)[1:])))
    st = st.sort_values(["task", "family", "depth", "seed", "round"])
    st["sequences"] = (st["sample_stop"] - st["sample_start"]).groupby(
        [st["task"], st["family"], st["depth"], st["seed"]]).cumsum()
    return st[st["round"] > 0][["task", "family", "depth", "seed", "round", "gain", "sequences"]].reset_index(drop=True)


def baseline_table(source) -> pd.DataFrame:
    """The next-leaf excess (nats/leaf) of the position-specific n-gram tables by context size beside each family's
    deepest member: source, context (previous leaves), excess, lo, hi (n-gram: ± 1.96 standard errors over held-out
    sequences; members: t over replicates), sequences (what the table was counted on, or the most a member drew)."""
    ng = _table(source, "ngram")
    rows = [{"source": f"n-gram, {int(r.context)} previous leaves", "context": int(r.context), "excess": r.excess,
             "lo": r.excess - 1.96 * r.excess_se, "hi": r.excess + 1.96 * r.excess_se, "sequences": int(r.n_train)}
            for r in ng.itertuples()]
    m = _members(source)
    leaf = m[m["task"] == "leaf"]
    for family, g in leaf.groupby("family", sort=False):
        d = int(g["depth"].max())
        v, lo, hi, _ = mean_interval(g.loc[g["depth"] == d, "excess"])
        rows.append({"source": f"{family}, ℓ = {d}", "context": np.nan, "excess": v, "lo": lo, "hi": hi,
                     "sequences": int(g.loc[g["depth"] == d, "samples"].max())})
    return pd.DataFrame(rows)


def exponent_table(source) -> pd.DataFrame:
    """Per quantity and family (the run's ``fit_stability``): α_ℓ over every depth with its interval, without ℓ = 1,
    the drop-one range, whether the chapter shows it (else why not), and how far α moved over the last round."""
    s = _table(source, "fit_stability")
    moved = _moves(source)
    rows = []
    for r in s.itertuples():
        mv = moved.get((r.quantity, r.family), {})
        rows.append({"quantity": r.quantity, "family": r.family, "α_ℓ (all depths)": _iv(r.alpha, r.lo, r.hi),
                     "without ℓ = 1": _iv(r.alpha_without_1, r.lo_without_1, r.hi_without_1),
                     "drop-one range": (f"{r.drop_one_min:.2f} – {r.drop_one_max:.2f}"
                                        if np.isfinite(r.drop_one_min) else "—"),
                     "last round's move": (f"{mv['move']:+.2f} (half-width {mv['half']:.2f})"
                                           if np.isfinite(mv.get("move", np.nan)) else "—"),
                     "shown": "yes" if r.shown else f"no: {r.why_not}"})
    return pd.DataFrame(rows).set_index(["quantity", "family"])


def slope_change_table(source) -> pd.DataFrame:
    """Per quantity and family with a two-segment fit (``fit_break``): the break ℓ_b with its bootstrap interval, the
    change in slope Δ = α_after − α_before with its bootstrap and t intervals, and whether the change is resolved and
    its break is near L."""
    b = _table(source, "fit_break")
    if b.empty:
        return pd.DataFrame(columns=["quantity", "family"]).set_index(["quantity", "family"])
    return pd.DataFrame([{
        "quantity": r["quantity"], "family": r["family"],
        "break ℓ_b": f"{r['break']:.1f} [{r['break_lo']:.1f}, {r['break_hi']:.1f}]",
        "α before / after": f"{r['alpha_before']:.2f} / {r['alpha_after']:.2f}",
        "change Δ (bootstrap)": _iv(r["change"], r["change_lo"], r["change_hi"]),
        "Δ (t, break held)": f"[{r['change_t_lo']:.2f}, {r['change_t_hi']:.2f}]",
        "resolved": "yes" if r["changes"] else "no",
        f"break near L = {int(r['L'])} ({r['near_lo']:g}–{r['near_hi']:g})": "yes" if r["break_at_L"] else "no"}
        for _, r in b.iterrows()]).set_index(["quantity", "family"])


def round_table(source) -> pd.DataFrame:
    """α_ℓ after every round of continuations (``fit_rounds``): quantity, family, round, sequences (the most a
    member had drawn), alpha, lo, hi, shown."""
    r = _table(source, "fit_rounds")
    return r[["quantity", "family", "round", "sequences", "alpha", "lo", "hi", "shown"]].reset_index(drop=True)


def zero_error_depths(source) -> dict[str, int | None]:
    """Per family: the smallest effective depth from which every root member of every replicate has no held-out error
    at all depths above it too (None: no such depth)."""
    m = _members(source)
    root = m[m["task"] == "root"]
    out = {}
    for family, g in root.groupby("family", sort=False):
        zero = g.groupby("depth")["error"].max().sort_index() <= 0
        depth = None
        for d in zero.index[::-1]:
            if not zero[d]:
                break
            depth = int(d)
        out[family] = depth
    return out


# ---- the rules ------------------------------------------------------------------------------------------------
def _moves(source) -> dict:
    """(quantity, family) → move (α at the last round − α at the round before), half (the last round's interval
    half-width), from, to, move_without_1 (the same without ℓ = 1), seqs (the sequences a member had drawn at the
    two rounds): from ``fit_rounds``; NaN where a round has no fit."""
    r = _table(source, "fit_rounds")
    out = {}
    for (q, f), g in r.groupby(["quantity", "family"], sort=False):
        g = g.sort_values("round")
        if len(g) < 2:
            out[(q, f)] = {"move": np.nan, "half": np.nan, "from": np.nan, "to": np.nan, "move_without_1": np.nan,
                           "seqs": (np.nan, np.nan)}
            continue
        a, b = g.iloc[-2], g.iloc[-1]
        out[(q, f)] = {"move": float(b["alpha"] - a["alpha"]), "half": float(b["hi"] - b["lo"]) / 2,
                       "from": float(a["alpha"]), "to": float(b["alpha"]),
                       "move_without_1": float(b["alpha_without_1"] - a["alpha_without_1"]),
                       "seqs": (int(a["sequences"]), int(b["sequences"]))}
    return out


def _open(source, task: str | None = None, family: str | None = None) -> pd.DataFrame:
    """The members not certified (of one task and family)."""
    m = _members(source)
    if task is not None:
        m = m[m["task"] == task]
    if family is not None:
        m = m[m["family"] == family]
    return m[~m["certified"].astype(bool)]


def _row(key, claim, prediction, would_contradict, measured, status, reason) -> dict:
    return {"key": key, "claim": claim, "prediction": prediction, "would_contradict": would_contradict,
            "measured": measured, "status": status, "reason": reason}


def _unseen_row(source) -> dict:
    man = _manifest(source)
    n = int(_config(source)["train"]["n_held_out"])
    found = man.get("held_out_overlap")
    measured = (f"{found} of {n} held-out sequences among the {int(man.get('training_sequences', 0)):,} training "
                f"sequences the members drew (compared exactly); {man.get('held_out_replaced', 0)} first draws were "
                f"replaced because a member may train on them (a uniform draw shares "
                f"{float(man.get('expected_overlap', np.nan)):.2f} in expectation)")
    if found is None:
        status, reason = "undecided", "the run has no exact check"
    else:
        status, reason = ("holds", "none found") if int(found) == 0 else ("contradicted", f"{found} found")
    return _row("unseen", "The held-out sequences are unseen: what the members learn is not memorised",
                "no held-out sequence occurs among the training sequences any member drew (exact count 0)",
                "any held-out sequence found there", measured, status, reason)


def _baseline(source) -> dict:
    """The best n-gram against the deepest untied member's next-leaf excess: the table's row, the member's mean and
    t interval, and the ratio n-gram / member with its interval (the n-gram's ± 1.96 s.e. against the member's)."""
    ng = _table(source, "ngram")
    best = ng.loc[ng["excess"].idxmin()]
    m = _members(source)
    leaf = m[(m["task"] == "leaf") & (m["family"] == "untied")]
    if leaf.empty:
        leaf = m[m["task"] == "leaf"]
    d = int(leaf["depth"].max())
    v, lo, hi, n = mean_interval(leaf.loc[leaf["depth"] == d, "excess"])
    ng_lo, ng_hi = best["excess"] - 1.96 * best["excess_se"], best["excess"] + 1.96 * best["excess_se"]
    return {"best": best, "family": leaf["family"].iloc[0], "depth": d, "value": v, "lo": lo, "hi": hi, "n": n,
            "ratio": best["excess"] / v if v > 0 else np.inf,
            "ratio_lo": ng_lo / hi if np.isfinite(hi) and hi > 0 else np.nan,
            "ratio_hi": ng_hi / lo if np.isfinite(lo) and lo > 0 else np.inf}


def _ratio_text(b: dict) -> str:
    """:func:`_baseline`'s ratio n-gram / member with its interval, "27.5 [17.0, 63.5]"."""
    return f"{b['ratio']:.1f} [{b['ratio_lo']:.1f}, {b['ratio_hi']:.1f}]"


def _baseline_row(source) -> dict:
    b = _baseline(source)
    best, r_lo, r_hi = b["best"], b["ratio_lo"], b["ratio_hi"]
    measured = (f"best n-gram ({int(best['context'])} previous leaves, counted on {int(best['n_train']):,} sequences): "
                f"excess {_num(best['excess'])} ± {_num(1.96 * best['excess_se'])} nats/leaf; {b['family']} "
                f"ℓ = {b['depth']}: {_num(b['value'])} [{_num(b['lo'])}, {_num(b['hi'])}] over {b['n']} replicates; "
                f"ratio {_ratio_text(b)}")
    if np.isfinite(r_lo) and r_lo >= FAR_BELOW:
        status, reason = "holds", f"the ratio's lower bound {r_lo:.1f} ≥ {FAR_BELOW:g}"
    elif r_hi <= 1.0:
        status, reason = "contradicted", f"the ratio's upper bound {r_hi:.2f} ≤ 1: the networks are no better"
    else:
        status, reason = "undecided", (f"the ratio's interval [{r_lo:.1f}, {r_hi:.1f}] reaches below {FAR_BELOW:g} "
                                       "and above 1")
    return _row("needs_hierarchy", "Local statistics do not solve the next leaf: the target needs the hierarchy",
                f"the best position-specific n-gram's excess is at least {FAR_BELOW:g}× the deepest untied member's "
                "(the ratio's interval from the n-gram's ± 1.96 s.e. and the member's t interval lies at or above "
                f"{FAR_BELOW:g})", "a ratio whose interval lies at or below 1 (the members no better than the table)",
                measured, status, reason)


def _certified_row(source) -> dict:
    m = _members(source)
    cfg = _config(source)
    cert = cfg.get("certificate", {})
    gain = float(cert.get("gain_below", 0.02))
    parts = []
    for task, g in m.groupby("task", sort=False):
        open_ = g[~g["certified"].astype(bool)]
        parts.append(f"{task} ({TASK_QUANTITY[task].split()[-1]}): {len(g) - len(open_)} of {len(g)} certified"
                     + (f", the others' last continuation gained {_gain_range(open_['last_gain'])}" if len(open_)
                        else ""))
    open_ = _open(source)
    status = "holds" if open_.empty else "contradicted"
    return _row("certified", "Every member is at its floor (the book's certificate)",
                f"a continuation of {100 * float(cert.get('continuation', 0.5)):.0f} % of a member's steps so far, "
                f"re-warmed and decayed, lowers its certified quantity (next leaf: excess; root: error) by less than "
                f"{100 * gain:.0f} % of it or than the held-out set resolves, within "
                f"{cert.get('max_continuations', '?')} continuations", f"a member whose last allowed continuation "
                f"still gained {100 * gain:.0f} % or more", "; ".join(parts), status,
                "every member certified" if status == "holds" else f"{len(open_)} of {len(m)} member(s) still gaining")


def _rounds_row(source) -> dict:
    mv = _moves(source).get(("leaf excess", "untied"), {})
    move, half = mv.get("move", np.nan), mv.get("half", np.nan)
    if np.isfinite(move) and np.isfinite(half):
        a, b = mv["seqs"]
        measured = (f"untied next-leaf α_ℓ {mv['from']:.2f} → {mv['to']:.2f} from {a:,} to {b:,} sequences a member "
                    f"(the last round of continuations; each member's best stage so far): moved {move:+.2f} against "
                    f"the half-width {half:.2f}; without ℓ = 1 it moved {mv['move_without_1']:+.2f}")
        status, reason = (("holds", f"|{move:.2f}| < {half:.2f}") if abs(move) < half
                          else ("contradicted", f"|{move:.2f}| ≥ {half:.2f}"))
    else:
        measured, status, reason = "no fit at one of the last two rounds", "undecided", "no fit to compare"
    return _row("exponent_settled", "(Ours) More training no longer moves the untied next-leaf exponent",
                "over the last round of continuations α_ℓ moves by less than the half-width of its last interval",
                "a move at least as large as that half-width", measured, status, reason)


def _exponent_row(source, key: str, claim_key: str, task: str, families: tuple[str, ...], title: str) -> dict:
    """An exponent row titled ``title``: the book's region for ``claim_key``, α_ℓ of ``task``'s certified quantity
    for ``families`` (the weakest status wins), gated by the certificate and the fit's stability."""
    claim = _CLAIMS[claim_key]
    quantity = TASK_QUANTITY[task]
    s = _table(source, "fit_stability")
    moves = _moves(source)
    zero = zero_error_depths(source) if task == "root" else {}
    statuses, said = [], []
    for family in families:
        row = s[(s["quantity"] == quantity) & (s["family"] == family)]
        if row.empty:
            continue
        r = row.iloc[0]
        mv = moves.get((quantity, family), {})
        text = (f"{family}: α_ℓ = {_iv(r['alpha'], r['lo'], r['hi'])}, without ℓ = 1 "
                f"{_iv(r['alpha_without_1'], r['lo_without_1'], r['hi_without_1'])}, drop-one "
                + (f"{r['drop_one_min']:.2f}–{r['drop_one_max']:.2f}" if np.isfinite(r["drop_one_min"]) else "—"))
        if np.isfinite(mv.get("move", np.nan)):
            text += f", last round's move {mv['move']:+.2f}"
        if zero.get(family) is not None:
            text += f"; no held-out error from ℓ = {zero[family]} on"
        said.append(text)
        open_ = _open(source, task, family)
        if len(open_):
            statuses.append(("undecided", f"{family}: {len(open_)} member(s) not certified"))
        elif not bool(r["shown"]):
            statuses.append(("undecided", f"{family}: not shown ({r['why_not']})"))
        else:
            st, why = claims.region_status(claim, float(r["alpha"]), float(r["lo"]), float(r["hi"]))
            statuses.append((st, f"{family}: {why}"))
    # several families: the weakest status wins, as in the book's verdict (contradicted, then undecided, then holds)
    found = {st for st, _ in statuses}
    status = ("undecided" if not statuses else "contradicted" if "contradicted" in found
              else "undecided" if "undecided" in found else "holds")
    reason = "; ".join(why for _, why in statuses) or "no fit"
    return _row(key, title,
                f"{claim.region_text}: the 95 % interval of α_ℓ (excess law E = c·ℓ^−α over every depth; every member "
                "certified, the fit not moved outside its interval by leaving out one depth)",
                "an interval wholly above 2 (toward composition or a flow), from certified members",
                "; ".join(said) or "no fit", status, reason)


def _break_row(source, task: str) -> dict:
    quantity = TASK_QUANTITY[task]
    b = _table(source, "fit_break")
    L = int(_config(source)["grammar"]["L"])
    row = b[(b["quantity"] == quantity) & (b["family"] == "untied")] if len(b) else b
    claim = (f"(Ours) Composition: the untied {'next-leaf excess' if task == 'leaf' else 'root error'} changes slope "
             f"near the grammar's depth L = {L}")
    prediction = ("the two-segment fit's change in slope has both intervals (bootstrap over replicates, and t with the "
                  "break held) excluding 0, and the break's bootstrap interval meets the stretch of the depth grid "
                  "around L (from the measured depth below L to the one above)")
    contradict = (f"both intervals of the change inside ±{BREAK_MARGIN:g} (no threshold anywhere), or a resolved "
                  "change whose break's interval lies outside that stretch — from certified members")
    if row.empty:
        why = ("a member has no held-out error (log 0)" if task == "root" and (_members(source).query(
            "task == 'root'")["error"] <= 0).any() else "fewer than 4 depths or 2 replicates")
        return _row(f"{task}_break", claim, prediction, contradict, f"no two-segment fit: {why}", "undecided", why)
    r = row.iloc[0]
    measured = (f"break ℓ_b = {r['break']:.1f} [{r['break_lo']:.1f}, {r['break_hi']:.1f}], α {r['alpha_before']:.2f} → "
                f"{r['alpha_after']:.2f}, change Δ = {_iv(r['change'], r['change_lo'], r['change_hi'])} (bootstrap), "
                f"[{r['change_t_lo']:.2f}, {r['change_t_hi']:.2f}] (t)")
    rounds = _table(source, "break_rounds")
    rr = rounds[(rounds["quantity"] == quantity) & (rounds["family"] == "untied")].sort_values("round") \
        if len(rounds) else rounds
    if len(rr) >= 2:
        measured += f"; over the last round Δ went {rr['change'].iloc[-2]:.2f} → {rr['change'].iloc[-1]:.2f}"
    open_ = _open(source, task, "untied")
    inside = max(abs(r["change_lo"]), abs(r["change_hi"]), abs(r["change_t_lo"]), abs(r["change_t_hi"])) < BREAK_MARGIN
    if len(open_):
        status, reason = "undecided", f"{len(open_)} untied {task} member(s) not certified"
    elif bool(r["changes"]) and bool(r["break_at_L"]):
        status, reason = "holds", f"the change is resolved and its break lies near L ({r['near_lo']:g}–{r['near_hi']:g})"
    elif bool(r["changes"]):
        status, reason = "contradicted", (f"a resolved change whose break's interval lies outside {r['near_lo']:g}–"
                                          f"{r['near_hi']:g}")
    elif inside:
        status, reason = "contradicted", f"both intervals of the change lie inside ±{BREAK_MARGIN:g}"
    else:
        status, reason = "undecided", "the change is not resolved (an interval contains 0) and not ruled out"
    return _row(f"{task}_break", claim, prediction, contradict, measured, status, reason)


def unseen_text(source) -> str:
    """The held-out check in one line of Markdown: its status and what was compared (:func:`verdict_rows`'s
    ``unseen`` row)."""
    unseen = verdict_rows(source).set_index("key").loc["unseen"]
    return f"**Held-out check ({unseen['status']}):** {unseen['measured']}."


def verdict_rows(source) -> pd.DataFrame:
    """The hierarchy part's verdict, one row per claim: key, claim, prediction, would_contradict, measured, status
    (one of :data:`STATUSES`) and reason. Rows: the held-out set is unseen (``unseen``), the target needs the
    hierarchy (``needs_hierarchy``), every member is certified (``certified``), more training no longer moves the
    untied next-leaf exponent (``exponent_settled``), α_ℓ below 2 on the next leaf for untied (``leaf_alpha``) and
    reused depth (``leaf_alpha_reused``) and on the root error (``root_alpha``), and a change in slope near L on
    either task (``leaf_break``, ``root_break``); each row states its own rule in prediction and would_contradict."""
    fams = tuple(_members(source)["family"].unique())
    reused = tuple(f for f in ("looped", "tied") if f in fams)
    return pd.DataFrame([_unseen_row(source), _baseline_row(source), _certified_row(source), _rounds_row(source),
                         _exponent_row(source, "leaf_alpha", "hierarchical", "leaf", ("untied",),
                                       "(Ours) On the unseen grammar's next leaf, untied depth still averages: "
                                       "α_ℓ below 2"),
                         _exponent_row(source, "leaf_alpha_reused", "looped", "leaf", reused,
                                       "(Ours) Reusing depth (looped, fully tied) on the unseen grammar's next leaf: "
                                       "α_ℓ over effective depth below 2"),
                         _exponent_row(source, "root_alpha", "hierarchical", "root", ("untied",),
                                       "(Ours) On the unseen grammar's root classification, untied depth still "
                                       "averages: α_ℓ of the error below 2"),
                         _break_row(source, "leaf"), _break_row(source, "root")])


#: the book verdict's exponent claims (:data:`depthlib.claims.CLAIMS`) this part measures: claim → (task, families)
VERDICT_EXPONENTS = {"hierarchical": (("leaf", ("untied",)), ("root", ("untied",))),
                     "looped": (("leaf", ("looped", "tied")),)}


def measurements(source) -> dict[str, list[dict]]:
    """What the book's verdict reads from this part (claim → one dict per task and family, :data:`VERDICT_EXPONENTS`):
    α_ℓ of the task's certified quantity over every effective depth with its 95 % t interval over replicates where
    the fit is shown (else no value, NaN, and why: a run that gives no exponent it can stand behind leaves the claim
    undecided, not untested), whether every member it rests on is certified and how many are (``certified_of``:
    (certified, of)), the least and most the others' last continuations still gained (``gaining``), and on the first
    (the untied next leaf) the prose's :func:`facts`."""
    s = _table(source, "fit_stability")
    out: dict[str, list[dict]] = {}
    prose = facts(source)
    for claim, wanted in VERDICT_EXPONENTS.items():
        for task, families in wanted:
            quantity = TASK_QUANTITY[task]
            for family in families:
                row = s[(s["quantity"] == quantity) & (s["family"] == family)]
                if row.empty:
                    continue
                r = row.iloc[0]
                mine = _members(source).query("task == @task and family == @family")
                open_ = _open(source, task, family)
                shown = bool(r["shown"]) and np.isfinite(r["alpha"])
                note = (f"95 % t interval over replicates; {len(mine) - len(open_)} of {len(mine)} members certified"
                        if shown else f"{len(mine) - len(open_)} of {len(mine)} members certified; no exponent "
                        f"({r['why_not']})")
                out.setdefault(claim, []).append({
                    "family": family, "task": task, "quantity": quantity,
                    "depths": ", ".join(str(int(d)) for d in sorted(mine["depth"].unique())),
                    "value": float(r["alpha"]) if shown else np.nan, "lo": float(r["lo"]) if shown else np.nan,
                    "hi": float(r["hi"]) if shown else np.nan, "certified": shown and open_.empty,
                    "certified_of": (len(mine) - len(open_), len(mine)), "note": note,
                    "gaining": ((float(open_["last_gain"].min()), float(open_["last_gain"].max()))
                                if len(open_) and open_["last_gain"].notna().any() else None),
                    "facts": prose if claim == "hierarchical" and task == "leaf" else {}})
    return out


def verdict_table(source) -> pd.DataFrame:
    """:func:`verdict_rows` as the notebook shows it: indexed by claim; prediction, would contradict, measured,
    status."""
    return verdict_rows(source).set_index("claim")[["prediction", "would_contradict", "measured", "status"]].rename(
        columns={"would_contradict": "would contradict"})


# ---- the answer paragraph ------------------------------------------------------------------------------------------
#: the rows that check the control itself, not a claim about depth
CONTROL_ROWS = ("unseen", "needs_hierarchy", "certified", "exponent_settled")


def answer(source) -> str:
    """The hierarchy part's answer (Markdown) generated from its tables: a lead saying how many of the claims about
    depth the run decides, whether the control is a positive control (held-out sequences unseen, local statistics
    far from enough) and how many members are certified; then one bullet per row of :func:`verdict_rows` — the claim,
    its status, what was measured and, where undecided, why."""
    rows = verdict_rows(source)
    by = rows.set_index("key")
    m = _members(source)
    parts = ["*(smoke profile: placeholder numbers.)*"] if _config(source).get("profile") == "smoke" else []
    science = rows[~rows["key"].isin(CONTROL_ROWS)]
    decided = science[science["status"] != "undecided"]
    lead = ("Undecided at this budget" if decided.empty else "Decided" if len(decided) == len(science)
            else f"Partly decided ({len(decided)} of {len(science)} claims about depth)")
    sound = all(by.loc[k, "status"] == "holds" for k in ("unseen", "needs_hierarchy"))
    b = _baseline(source)
    control = (f"The control is a positive control: no held-out sequence occurs in training, and the best n-gram "
               f"table leaves {_ratio_text(b)} times the excess of the deepest {b['family']} member." if sound else
               "The control is not yet a positive control (see its first two rows below).")
    counts = ", ".join(f"{task} {int(g['certified'].astype(bool).sum())} of {len(g)}"
                       for task, g in m.groupby("task", sort=False))
    consequence = (", so every exponent and change in slope below is undecided, however narrow its interval."
                   if decided.empty and not m["certified"].astype(bool).all() else ".")
    parts.append(f"**{lead}.** {control} **{int(m['certified'].astype(bool).sum())} of {len(m)} members are "
                 f"certified** ({counts}){consequence}")
    lines = [f"* {r.claim} — **{r.status}**: {r.measured}"
             + (f" ({r.reason})." if r.status == "undecided" and r.reason not in r.measured else ".")
             for r in rows.itertuples()]
    zero = {f: d for f, d in zero_error_depths(source).items() if d is not None}
    if zero:
        lines.append("* No held-out root error at all from " + ", ".join(f"ℓ = {d} ({f})" for f, d in zero.items())
                     + " on: the root error has no power law to fit there.")
    return " ".join(parts) + "\n\n" + "\n".join(lines)


# ---- the diagnostics and chapter 5's edits ------------------------------------------------------------------------
#: the three readings of a diagnostic against what an ensemble predicts (:func:`separation_rows`)
READINGS = ("separates", "reads as an ensemble", "undecided")
#: an ensemble of similar members loses about what E ∝ 1/ℓ loses with one member fewer; the ratio of a deletion's
#: cost to that (:func:`depthlib.compose.analysis.delete_vs_ensemble`) is ≈ α_ℓ for E ∝ ℓ^−α, so the book's
#: boundary between averaging (1) and a smooth flow (3) for α_ℓ, 2, is the boundary here too
DELETE_EDGE = 2.0
#: the edits a member records (:mod:`depthlib.compose.diagnostics`, :func:`depthlib.compose.roots.root_edits`), as the
#: tables name them: every one acts on the middle applications 1 … ℓ−2 only
EDITS = {"delete": "delete one middle block", "swap": "swap two middle neighbours", "permute": "permute the middle"}
#: what a task's edit costs are measured in
EDIT_UNITS = {"leaf": "Δ next-leaf loss (nats/leaf)", "root": "Δ root error (fraction of probe sequences)"}


class _TaskTables:
    """A run's (or a mapping's) tables restricted to one task, read through ``table(name)`` as the functions of
    :mod:`depthlib.compose.analysis` (written for the one-task rhm part) read a run."""

    def __init__(self, source, task: str):
        self.source, self.task = source, task

    def table(self, name: str) -> pd.DataFrame:
        t = _table(self.source, name)
        return t[t["task"] == self.task].reset_index(drop=True) if "task" in t else t


def diagnostic_numbers(source) -> pd.DataFrame:
    """The next-leaf members' diagnostics per family and effective depth, as the rhm part's
    :func:`depthlib.compose.analysis.diagnostic_table` gives them (each ``col`` with ``col_lo``, ``col_hi``: mean over
    replicates and 95 % t interval): theta_middle_mean (rad), theta_dh_mean (rad), long_lag_cos, cluster_evenly
    (fraction of probe tokens), the edits' summaries (nats/leaf), probe_excess (nats/leaf) and delete_vs_ensemble
    (ratio); and cluster_explained_pc1 (fraction of variance), clusters_min / clusters_max (the trajectory clusters
    that hold any token, over replicates; NaN below ℓ = 4) and replicates. Numbers for figures
    (:func:`depthlib.plots.compose.diagnostic_vs_depth`); :func:`diagnostics_table` is the table for the reader."""
    leaf = _TaskTables(source, "leaf")
    m = leaf.table("members")
    if m.empty or "delete_middle_delta" not in m:                 # a run without the next-leaf task
        return pd.DataFrame(columns=["family", "depth", "replicates"])
    d = analysis.diagnostic_table(leaf)
    extra = []
    cl = leaf.table("clusters")
    counts = {}                                   # (family, depth) → clusters holding tokens, one per replicate
    if len(cl):
        for (family, depth, _), g in cl[cl["kind"] == "cluster mean"].groupby(["family", "depth", "seed"]):
            counts.setdefault((family, int(depth)), []).append(g["cluster"].nunique())
    for (family, depth), g in m.groupby(["family", "depth"]):
        row = {"family": family, "depth": int(depth), "replicates": len(g)}
        if "cluster_explained_pc1" in g:
            (row["cluster_explained_pc1"], row["cluster_explained_pc1_lo"], row["cluster_explained_pc1_hi"],
             _) = mean_interval(g["cluster_explained_pc1"])
        n = counts.get((family, int(depth)), [])
        row["clusters_min"], row["clusters_max"] = (float(min(n)), float(max(n))) if n else (np.nan, np.nan)
        extra.append(row)
    return d.merge(pd.DataFrame(extra), on=["family", "depth"], how="left")


def layer_profiles(source, metric: str = "theta") -> pd.DataFrame:
    """Per next-leaf family, depth and block: θ(h_l, h_l+1) (``metric="theta"``) or θ(Δh_l, Δh_l+1) (``"theta_dh"``),
    rad, mean over replicates of the per-block means over probe tokens with its 95 % t interval (columns family, depth,
    layer, mean, lo, hi: :func:`depthlib.compose.analysis.layer_profiles`, for
    :func:`depthlib.plots.compose.profiles`)."""
    return analysis.layer_profiles(_TaskTables(source, "leaf"), metric)


def lag_profiles(source) -> pd.DataFrame:
    """Per next-leaf family, depth and lag k (blocks): the mean cosine cos(Δh_l, Δh_l+k) over l and probe tokens,
    mean over replicates with its 95 % t interval (family, depth, k, cos, lo, hi:
    :func:`depthlib.compose.analysis.lag_profiles`)."""
    return analysis.lag_profiles(_TaskTables(source, "leaf"))


def _col(r, col: str, **kw) -> str:
    return _iv(r.get(col, np.nan), r.get(f"{col}_lo", np.nan), r.get(f"{col}_hi", np.nan), **kw)


def diagnostics_table(source) -> pd.DataFrame:
    """The paper's hidden-state diagnostics of the next-leaf members, per family and effective depth ℓ, as "mean
    [95 % t interval over replicates]" (the mean alone with one replicate; "—" where a depth has none), on the probe
    set's tokens (:mod:`depthlib.compose.diagnostics`):

    * **middle-block angle θ(h_l, h_l+1)** (rad): how far one block application turns the residual stream, averaged
      over the middle blocks 1 … ℓ−2 (all blocks for ℓ ≤ 2);
    * **update angle θ(Δh_l, Δh_l+1)** (rad): between consecutive updates over the middle pairs; π/2 = 1.57: unrelated
      updates, 0: one shared direction;
    * **long-lag cosine** (dimensionless): cos(Δh_l, Δh_l+k) over the lags k ≥ ℓ/4, 0: distant updates unrelated;
    * **trajectory clusters holding tokens** (of the two of paper Fig. 2b, range over replicates) and **tokens in the
      "updated evenly" cluster** (% of probe tokens; the paper's 99.6 %), for ℓ ≥ 4;
    * replicates."""
    d = diagnostic_numbers(source)
    if d.empty:
        return pd.DataFrame(columns=["family", "effective depth ℓ"]).set_index(["family", "effective depth ℓ"])
    rows = []
    for _, r in d.sort_values(["family", "depth"], key=lambda s: s.map(_family_order) if s.name == "family" else s,
                              kind="stable").iterrows():
        lo, hi = r.get("clusters_min", np.nan), r.get("clusters_max", np.nan)
        rows.append({"family": r["family"], "effective depth ℓ": int(r["depth"]),
                     "middle-block angle θ(h_l, h_l+1) (rad)": _col(r, "theta_middle_mean"),
                     "update angle θ(Δh_l, Δh_l+1) (rad)": _col(r, "theta_dh_mean"),
                     "long-lag cosine, k ≥ ℓ/4": _col(r, "long_lag_cos"),
                     "trajectory clusters holding tokens": ("—" if not np.isfinite(lo) else f"{lo:.0f}" if lo == hi
                                                            else f"{lo:.0f}–{hi:.0f}"),
                     "tokens in the 'evenly' cluster (%)": _col(r, "cluster_evenly", pct=True),
                     "replicates": int(r["replicates"])})
    return pd.DataFrame(rows).set_index(["family", "effective depth ℓ"])


def _family_order(f: str) -> int:
    return ("untied", "looped", "tied").index(f) if f in ("untied", "looped", "tied") else 3


def _member_edits(source) -> pd.DataFrame:
    """Per member (task, family, depth, seed) and edit: the mean cost over the edit's middle positions — deleting one
    of the applications 1 … ℓ−2, swapping j and j+1 for j = 1 … ℓ−3 (both in the middle), a random order of the middle
    (every draw) — as the increase of the next-leaf loss (nats/leaf) or of the root error (−Δ accuracy)."""
    e = _table(source, "edits")
    if e.empty:
        return pd.DataFrame(columns=["task", "family", "depth", "seed", "edit", "cost"])
    e = e.assign(cost=np.where(e["task"] == "root", -e.get("delta_accuracy", np.nan), e["delta"]))
    last = np.where(e["edit"] == "swap", e["depth"] - 3, e["depth"] - 2)
    middle = (e["edit"] == "permute") | ((e["position"] >= 1) & (e["position"] <= last))
    return (e[middle].groupby(["task", "family", "depth", "seed", "edit"], as_index=False)["cost"].mean())


def edit_costs(source) -> pd.DataFrame:
    """Chapter 5's edits per task, family, effective depth and edit (delete, swap, permute: :data:`EDITS`, each on the
    middle applications only): value (the members' mean cost over the edit's positions, then the mean over
    replicates), lo, hi (95 % t over replicates), replicates, unit (:data:`EDIT_UNITS`: next leaf, the rise of the
    probe loss in nats/leaf; root, the rise of the error, a fraction of the probe sequences). Only the edits a member
    can make: a swap needs two middle applications (ℓ ≥ 4) and distinct blocks (untied, or looped at ℓ = 3, whose three
    blocks are distinct), a permutation ℓ ≥ 4 and untied; the root task records no permutation."""
    per = _member_edits(source)
    rows = []
    for (task, family, depth, edit), g in per.groupby(["task", "family", "depth", "edit"], sort=False):
        v, lo, hi, n = mean_interval(g["cost"])
        rows.append({"task": task, "family": family, "depth": int(depth), "edit": edit, "value": v, "lo": lo, "hi": hi,
                     "replicates": n, "unit": EDIT_UNITS.get(task, "")})
    out = pd.DataFrame(rows, columns=["task", "family", "depth", "edit", "value", "lo", "hi", "replicates", "unit"])
    return out.sort_values(["task", "family", "depth", "edit"], key=lambda s: s.map(_family_order) if s.name == "family"
                           else s.map(list(EDITS).index) if s.name == "edit" else s, kind="stable").reset_index(drop=True)


def _compare(a: dict, b: dict) -> tuple[str, str]:
    """Where one cost's interval lies against another's: "above", "below" or "overlap" (or "no interval"), and why."""
    if not all(np.isfinite(x) for x in (a["lo"], a["hi"], b["lo"], b["hi"])):
        return "no interval", "fewer than two replicates: no interval"
    if a["lo"] > b["hi"]:
        return "above", f"its interval's lower end {a['lo']:.3g} lies above the other's upper end {b['hi']:.3g}"
    if a["hi"] < b["lo"]:
        return "below", f"its interval's upper end {a['hi']:.3g} lies below the other's lower end {b['lo']:.3g}"
    return "overlap", "the two intervals overlap"


def edits_table(source) -> pd.DataFrame:
    """Chapter 5's edits where a member made them, per task, family and effective depth ℓ (ℓ ≥ 3: one middle
    application at least): the cost of deleting one middle block, of swapping two middle neighbours and of a random
    order of the middle (mean over replicates [95 % t interval], in the unit the task's index label names: next leaf nats
    per leaf, root the rise of the error as a fraction of the probe sequences, i.e. −Δ accuracy); **swap against delete**:
    whether the swap's interval lies wholly above the deletion's (order costs more than a block's absence: an assembly
    line, not an ensemble, whose order only matters through the weak coupling of its members — chapter 5's prediction
    3), wholly below, or overlaps; and for the next leaf **deletion ÷ an ensemble's cost**: the deletion's cost over
    what an ensemble with E ∝ 1/ℓ would lose, E/(ℓ − 1) (:func:`depthlib.compose.analysis.delete_vs_ensemble`; ≈ 1 for
    an ensemble, ≫ 1 for a step that cannot be spared), dimensionless."""
    c = edit_costs(source)
    if c.empty:
        return pd.DataFrame()
    diag = diagnostic_numbers(source).set_index(["family", "depth"])
    rows = []
    for (task, family, depth), g in c.groupby(["task", "family", "depth"], sort=False):
        if depth < 3:
            continue
        by = {r.edit: {"value": r.value, "lo": r.lo, "hi": r.hi} for r in g.itertuples()}
        empty = {"value": np.nan, "lo": np.nan, "hi": np.nan}
        d, s, p = (by.get(k, empty) for k in EDITS)
        where, _ = _compare(s, d) if np.isfinite(s["value"]) else ("—", "")
        ratio = "—"
        if task == "leaf" and (family, depth) in diag.index:
            ratio = _col(diag.loc[(family, depth)], "delete_vs_ensemble", digits=1)
        rows.append({"task (cost in)": f"{task}: {EDIT_UNITS[task]}", "family": family, "effective depth ℓ": int(depth),
                     EDITS["delete"]: _iv(d["value"], d["lo"], d["hi"], sig=True),
                     EDITS["swap"]: _iv(s["value"], s["lo"], s["hi"], sig=True),
                     EDITS["permute"]: _iv(p["value"], p["lo"], p["hi"], sig=True),
                     "swap against delete": {"above": "swap costs more", "below": "swap costs less",
                                             "overlap": "intervals overlap", "no interval": "no interval"}.get(where, "—"),
                     "deletion ÷ an ensemble's cost": ratio,
                     "replicates": int(g["replicates"].max())})
    return pd.DataFrame(rows).set_index(["task (cost in)", "family", "effective depth ℓ"])


def _region(value: float, lo: float, hi: float, region: tuple[float, float], what: str) -> tuple[str, str]:
    """A reading of (value, lo, hi) against the region an ensemble predicts: inside it "reads as an ensemble",
    wholly outside "separates", straddling an edge (or without an interval) "undecided"; and why."""
    r_lo, r_hi = region
    if not np.isfinite(value):
        return "undecided", "not measured"
    if not (np.isfinite(lo) and np.isfinite(hi)):
        return "undecided", "fewer than two replicates: no interval"
    if r_lo <= lo and hi <= r_hi:
        return "reads as an ensemble", f"[{lo:.2f}, {hi:.2f}] lies inside {what}"
    if hi < r_lo or lo > r_hi:
        return "separates", f"[{lo:.2f}, {hi:.2f}] lies wholly outside {what}"
    return "undecided", f"[{lo:.2f}, {hi:.2f}] straddles an edge of {what}"


def _deepest(d: pd.DataFrame, col: str, family: str = "untied") -> pd.Series | None:
    """The row of ``d`` (family, depth, ``col``…) at the deepest depth of ``family`` where ``col`` is measured."""
    g = d[(d["family"] == family) & np.isfinite(d[col].astype(float))] if col in d else d.iloc[:0]
    return None if g.empty else g.sort_values("depth").iloc[-1]


def _theta_exponents(source) -> dict:
    """α_θ of the untied next-leaf members: per replicate the least-squares ⟨θ⟩_mid ∝ ℓ^−α_θ over the depths with two
    middle blocks or more (:func:`depthlib.lm.fit.angle_exponent`, ℓ ≥ 4), then mean and 95 % t over replicates."""
    from depthlib.lm.fit import ANGLE_MIN_DEPTH, angle_exponent
    m = _members(source)
    u = m[(m["task"] == "leaf") & (m["family"] == "untied")]
    if "theta_middle_mean" not in u:
        u = u.assign(theta_middle_mean=np.nan)
    alphas = [angle_exponent(g[["depth", "theta_middle_mean"]], "theta_middle_mean")["alpha"]
              for _, g in u.groupby("seed")]
    v, lo, hi, n = mean_interval(alphas)
    depths = sorted(int(x) for x in u.loc[u["depth"] >= ANGLE_MIN_DEPTH, "depth"].unique())
    return {"value": v, "lo": lo, "hi": hi, "n": n, "depths": depths}


def separation_rows(source) -> pd.DataFrame:
    """Which measurement tells the compositional control — the **untied** members on this hierarchical target — from
    what an **ensemble** predicts, one row per measurement, each at the deepest untied depth where it is measured:
    key, measurement, depth, ensemble (what an ensemble predicts, and whose rule that is), measured, value, lo, hi,
    reading (one of :data:`READINGS`) and reason. The rules:

    * **edits, swap** and **permute** (next leaf; ``root_swap``: the root error): the cost's 95 % interval against
      deleting one middle block's. An ensemble's order matters only through the weak coupling of its members, so
      moving blocks costs less than removing one (chapter 5's prediction 3 and its claim ``order_matters_little``:
      reordering ÷ deleting < 1). Wholly above: **separates** (order costs more than a block's absence: an assembly
      line); wholly below: **reads as an ensemble**; overlapping intervals: **undecided**;
    * **deletion ÷ an ensemble's cost** (:func:`depthlib.compose.analysis.delete_vs_ensemble`): ≈ 1 for an ensemble
      (≈ α_ℓ if E ∝ ℓ^−α); an interval wholly at or above :data:`DELETE_EDGE` separates, wholly below it reads as an
      ensemble;
    * **update angle θ(Δh)** and **long-lag cosine**: chapter 3's rule (:data:`depthlib.interventions.predictions.
      THETA_MIN`, ``LONG_LAG_MAX``): an ensemble has θ(Δh) > 1.2 rad and a long-lag cosine < 0.1;
    * **"updated evenly" share**: the paper reads ≥ 75 % of tokens there as "not compositional" (the book's region for
      the claim ``tokens_evenly``);
    * **α_θ**, the middle angle's fall with depth (⟨θ⟩_mid ∝ ℓ^−α_θ over the untied depths ≥ 4, fitted per replicate):
      an ensemble (and a flow) gives α_θ within 0.5 of 1 (the claim ``angle_depth``).

    Inside the region an ensemble predicts: **reads as an ensemble**; wholly outside: **separates**; straddling an edge,
    or one replicate (no interval): **undecided**."""
    from depthlib.interventions.predictions import LONG_LAG_MAX, THETA_MIN
    rows = []
    costs = edit_costs(source)
    d = diagnostic_numbers(source)

    def add(key, measurement, depth, ensemble, measured, v, lo, hi, reading, reason):
        rows.append({"key": key, "measurement": measurement, "depth": depth, "ensemble": ensemble,
                     "measured": measured, "value": v, "lo": lo, "hi": hi, "reading": reading, "reason": reason})

    for key, task, edit in (("swap", "leaf", "swap"), ("permute", "leaf", "permute"), ("root_swap", "root", "swap")):
        c = costs[(costs["task"] == task) & (costs["family"] == "untied")]
        had = c[(c["edit"] == edit) & np.isfinite(c["value"])]
        what = (f"{'swapping two middle neighbours' if edit == 'swap' else 'a random order of the middle'} against "
                f"deleting one middle block on the {'next leaf' if task == 'leaf' else 'root error'}")
        unit = "nats/leaf" if task == "leaf" else "of the probe sequences"
        ensemble = "a move costs less than a deletion"
        if had.empty:
            add(key, what, np.nan, ensemble, "not measured", np.nan, np.nan, np.nan, "undecided",
                "no untied member made this edit")
            continue
        depth = int(had["depth"].max())
        a = had[had["depth"] == depth].iloc[0]
        b = c[(c["edit"] == "delete") & (c["depth"] == depth)]
        b = b.iloc[0] if len(b) else pd.Series({"value": np.nan, "lo": np.nan, "hi": np.nan})
        where, why = _compare(dict(a), dict(b))
        reading = {"above": "separates", "below": "reads as an ensemble"}.get(where, "undecided")
        add(key, what, depth, ensemble,
            f"{_iv(a['value'], a['lo'], a['hi'], sig=True)} against {_iv(b['value'], b['lo'], b['hi'], sig=True)} "
            f"{unit}", a["value"], a["lo"], a["hi"], reading, why)
    specs = (("delete_vs_ensemble", "delete_vs_ensemble", "deletion ÷ an ensemble's cost", (-np.inf, DELETE_EDGE),
              f"≈ 1, below {DELETE_EDGE:g}", "", 1),
             ("theta_dh", "theta_dh_mean", "update angle θ(Δh_l, Δh_l+1)", (THETA_MIN, np.inf),
              f"above {THETA_MIN:g} rad", " rad", 2),
             ("long_lag", "long_lag_cos", "long-lag cosine", (-np.inf, LONG_LAG_MAX),
              f"below {LONG_LAG_MAX:g}", "", 2),
             ("evenly", "cluster_evenly", "tokens in the 'updated evenly' cluster", _CLAIMS["tokens_evenly"].region,
              "75 % or more", "", 0))
    for key, col, what, region, ensemble, unit, digits in specs:
        r = _deepest(d, col) if len(d) else None
        if r is None:
            add(key, what, np.nan, ensemble, "not measured", np.nan, np.nan, np.nan, "undecided",
                "no untied member has it")
            continue
        v, lo, hi = (float(r[c]) for c in (col, f"{col}_lo", f"{col}_hi"))
        if key == "evenly":
            lo, hi = (max(lo, 0.0), min(hi, 1.0)) if np.isfinite(lo) else (lo, hi)
            measured = _iv(v, lo, hi, pct=True) + " % of probe tokens"
        else:
            measured = _iv(v, lo, hi, digits=digits) + unit
        reading, why = _region(v, lo, hi, region, "the ensemble's region")
        add(key, what, int(r["depth"]), ensemble, measured, v, lo, hi, reading, why)
    a = _theta_exponents(source)
    region = _CLAIMS["angle_depth"].region
    reading, why = _region(a["value"], a["lo"], a["hi"], region, "the ensemble's region")
    fitted = len(a["depths"]) >= 2
    add("alpha_theta", "the middle angle's fall with depth α_θ", np.nan, "within 0.5 of 1",
        (_iv(a["value"], a["lo"], a["hi"]) + f" over ℓ = {', '.join(map(str, a['depths']))}") if fitted
        else "not measured", a["value"], a["lo"], a["hi"], reading if fitted else "undecided",
        why if fitted else "fewer than two untied depths ≥ 4")
    return pd.DataFrame(rows)


#: the rows of :func:`separation_rows` that are chapter 5's edits (the rest are the paper's hidden-state signatures)
EDIT_KEYS = ("swap", "permute", "root_swap", "delete_vs_ensemble")
#: each row's short name in the conclusion of :func:`diagnostics_text`
SHORT = {"swap": "the swap", "permute": "the random order", "root_swap": "the root's swap",
         "delete_vs_ensemble": "the deletion's cost over an ensemble's", "theta_dh": "θ(Δh)",
         "long_lag": "the long-lag cosine", "evenly": "the 'evenly' share", "alpha_theta": "α_θ"}


def _phrase(r) -> str:
    """One row of :func:`separation_rows` as the prose states it: what, where, the number and an ensemble's region."""
    at = f" at ℓ = {int(r.depth)}" if np.isfinite(r.depth) else ""
    return f"{r.measurement}{at}: {r.measured} (an ensemble: {r.ensemble})"


def signatures_reading(rows: pd.DataFrame) -> str:
    """What chapter 5's edits say of the hidden-state signatures, by a stated rule on :func:`separation_rows` (one
    sentence, the conclusion of :func:`diagnostics_text`): if some edit separates and none reads them as an ensemble,
    the untied members are not an ensemble by chapter 5's edits, so a signature that reads them as one cannot tell
    composition from averaging here; if the edits disagree, or none decides, that stays open; if the edits read them
    as an ensemble, this run's control does not compose and cannot show which measurement would tell."""
    rows = rows.assign(short=rows["key"].map(SHORT))
    edits = rows[rows["key"].isin(EDIT_KEYS)]
    signs = rows[~rows["key"].isin(EDIT_KEYS)]
    sep = list(edits.loc[edits["reading"] == "separates", "short"])
    ens = list(edits.loc[edits["reading"] == "reads as an ensemble", "short"])
    blind = list(signs.loc[signs["reading"] == "reads as an ensemble", "short"])
    tell = list(signs.loc[signs["reading"] == "separates", "short"])
    if sep and not ens:
        return ("by chapter 5's edits that decide (" + ", ".join(sep) + ") the untied members are not an ensemble; a "
                "hidden-state signature that reads them as one cannot tell composition from averaging here ("
                + (", ".join(blind) or "none does") + "), one that separates them can ("
                + (", ".join(tell) or "none does") + ").")
    if sep and ens:
        return ("the edits disagree (separating: " + ", ".join(sep) + "; reading an ensemble: " + ", ".join(ens)
                + "), so which signatures are blind to composition stays undecided.")
    if ens:
        return ("by the edits that decide (" + ", ".join(ens) + ") the untied members read as an ensemble here and no "
                "edit separates them: this run's control does not compose by the edits, so it cannot show which "
                "measurement would tell a compositional network from an ensemble.")
    return "no edit decides here, so which signatures are blind to composition stays undecided."


def diagnostics_text(source) -> str:
    """A Markdown paragraph generated from :func:`separation_rows`: which measurements tell the untied members from
    what an ensemble predicts (with their numbers, at the deepest untied depth that has them), which read them as an
    ensemble and which are undecided, then what follows (:func:`signatures_reading`)."""
    rows = separation_rows(source)
    cfg = _config(source)
    parts = ["*(smoke profile: placeholder numbers.)*"] if cfg.get("profile") == "smoke" else []
    n = int(_members(source).query("family == 'untied'")["seed"].nunique())
    groups = {k: rows[rows["reading"] == k] for k in READINGS}
    parts.append(f"**Which measurements tell the compositional control from an ensemble** (untied members, means over "
                 f"{n} replicate{'s' if n != 1 else ''} with 95 % t intervals, each at the deepest untied depth that has "
                 "it; an edit's cost is the rise of the next-leaf loss, or of the root error; what an ensemble gives, in "
                 "parentheses, is chapter 5's prediction 3 for moving blocks, chapter 3's rule for θ(Δh) and the "
                 "long-lag cosine, and the paper's own readings for the 'evenly' cluster and α_θ).")
    parts.append("**Separate it** (outside what an ensemble predicts): "
                 + ("; ".join(_phrase(r) for r in groups["separates"].itertuples()) or "none") + ".")
    parts.append("**Read it as an ensemble:** "
                 + ("; ".join(_phrase(r) for r in groups["reads as an ensemble"].itertuples()) or "none") + ".")
    parts.append("**Undecided:** " + ("; ".join(f"{_phrase(r)} — {r.reason}" for r in groups["undecided"].itertuples())
                                     or "none") + ".")
    parts.append("**So:** " + signatures_reading(rows))
    return " ".join(parts)


def facts(source) -> dict[str, str]:
    """What the book's hand-written prose quotes from this part beside its exponents (the verdict's
    ``hierarchical_<name>``, :data:`depthlib.verdict.FACTS`), so that a recomputed run changes the prose:
    ``ngram_ratio``, the best n-gram table's excess over the deepest untied member's with its interval
    (:func:`_baseline`); ``signs``, the paper's update angle θ(Δh) and 'evenly' share of the untied members at their
    deepest depth with what an ensemble gives and how each reads (:func:`separation_rows`); ``edits``, what chapter 5's
    edits then say of the signatures (:func:`signatures_reading`)."""
    rows = separation_rows(source)
    by = rows.set_index("key")
    signs = "; ".join(f"{_phrase(by.loc[k])}, {by.loc[k, 'reading']}" for k in ("theta_dh", "evenly"))
    return {"ngram_ratio": _ratio_text(_baseline(source)), "signs": signs, "edits": signatures_reading(rows)}
