"""Figures of the causal-tracing chapter (paper §6, Fig. 6), built from the tidy tables of :mod:`depthlib.tracing`.

- :func:`trace_heatmap`: restored p(target) over (token, block) for one or more (prompt, kind) traces,
  a dropdown to switch between them, the block axis at the bottom and normalised depth l/ℓ on top.
- :func:`average_effect_figure`: mean normalised indirect effect by normalised depth for the last subject
  token and the last token, over a fact set, one dropdown entry per restored kind.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from depthlib import plots

#: ROME's colours for the three kinds (block: purple, MLP: green, attention: red).
KIND_SCALES = {"block": "Purples", "mlp": "Greens", "attn": "Reds"}
KIND_NAMES = {"block": "block output", "mlp": "MLP output", "attn": "attention output"}
ROLE_COLORS = {"last subject": plots.PALETTE[0], "last token": plots.PALETTE[1],
               "first subject": plots.PALETTE[2], "middle subject": plots.PALETTE[3],
               "first subsequent": plots.PALETTE[4], "further tokens": plots.PALETTE[5],
               "before subject": plots.PALETTE[7]}


def _role_name(role: str) -> str:
    return role if role.endswith("token") or role.endswith("tokens") else f"{role} token"


def _token_labels(sub: pd.DataFrame) -> list[str]:
    toks = sub.drop_duplicates("token_index").sort_values("token_index")
    subject = set(toks.loc[toks["role"].str.contains("subject") & ~toks["role"].eq("before subject"), "token_index"])
    return [f"{t!r}{'*' if i in subject else ''}".replace("'", "") if t.strip() else repr(t)
            for i, t in zip(toks["token_index"], toks["token"])]


def _heatmap(sub: pd.DataFrame, visible: bool, coloraxis: str) -> go.Heatmap:
    L = int(sub["layer"].max()) + 1
    T = int(sub["token_index"].max()) + 1
    z = np.full((T, L), np.nan)
    eff = np.full((T, L), np.nan)
    z[sub["token_index"], sub["layer"]] = sub["p"]
    eff[sub["token_index"], sub["layer"]] = sub["effect"]
    labels = _token_labels(sub)
    depth = (np.arange(L) + 1) / L
    custom = np.dstack([np.broadcast_to(depth, (T, L)), eff])
    return go.Heatmap(
        z=z, x=np.arange(1, L + 1), y=list(range(T)), customdata=custom, visible=visible, coloraxis=coloraxis,
        text=[[labels[t]] * L for t in range(T)],
        hovertemplate="token %{text}<br>block l=%{x} (l/ℓ=%{customdata[0]:.2f})<br>"
                      "restored p=%{z:.3f}<br>indirect effect=%{customdata[1]:.2f}<extra></extra>")


def trace_heatmap(table: pd.DataFrame, *, title: str | None = None, height: int = 470) -> go.Figure:
    """Heat map(s) of restored p(target) over (token, block l), one per (prompt, kind) in ``table``.

    ``table`` is the concatenation of :meth:`depthlib.tracing.Trace.table` rows (one model). With more
    than one (prompt, kind) a dropdown switches between them (works in the static book). Subject tokens
    are starred; the colour scale runs from p_corrupt (white) to p_clean.
    """
    combos = table[["prompt", "kind"]].drop_duplicates().itertuples(index=False)
    combos = sorted(combos, key=lambda c: (list(table["prompt"].unique()).index(c[0]), list(KIND_SCALES).index(c[1])))
    model = str(table["model"].iloc[0]) if "model" in table else ""
    fig = plots.new_figure(title or "", "block l (output h_l restored at this block)", "token (* = subject)",
                           height=height)
    buttons, titles, axes = [], [], {}
    for i, (prompt, kind) in enumerate(combos):
        sub = table[(table["prompt"] == prompt) & (table["kind"] == kind)]
        axis = "coloraxis" if i == 0 else f"coloraxis{i + 1}"
        fig.add_trace(_heatmap(sub, i == 0, axis))
        p_clean, p_corrupt = float(sub["p_clean"].iloc[0]), float(sub["p_corrupt"].iloc[0])
        target = sub["target"].iloc[0]
        axes[axis] = dict(colorscale=KIND_SCALES[kind], cmin=p_corrupt, cmax=max(p_clean, float(sub["p"].max())),
                          colorbar=dict(title=dict(text=f"p({target.strip()})"), len=0.9), showscale=i == 0)
        t = (f"{model} · {KIND_NAMES[kind]} restored (window {int(sub['window'].iloc[0])})<br>"
             f"<sup>\"{prompt}\" → \"{target}\" · p(clean) = {p_clean:.3f}, p(corrupted) = {p_corrupt:.3f}, "
             f"{int(sub['samples'].iloc[0])} noise samples</sup>")
        titles.append(t)
        buttons.append((f"{prompt[:28]}… · {kind}" if len(prompt) > 28 else f"{prompt} · {kind}"))
    fig.update_layout(**axes)
    first = table[(table["prompt"] == combos[0][0]) & (table["kind"] == combos[0][1])]
    labels = _token_labels(first)
    fig.update_yaxes(tickmode="array", tickvals=list(range(len(labels))), ticktext=labels, autorange="reversed")
    L = int(table["layer"].max()) + 1
    ticks = [b for b in range(1, L + 1) if b % max(1, L // 6) == 0 or b == 1]
    fig.update_xaxes(tickmode="array", tickvals=ticks, ticktext=[str(b) for b in ticks])
    # normalised depth l/ℓ on a top axis, so models of different depths compare
    fig.add_trace(go.Scatter(x=[1, L], y=[0, 0], xaxis="x2", mode="markers", marker=dict(opacity=0),
                             hoverinfo="skip", showlegend=False))
    depth_ticks = [0.2, 0.4, 0.6, 0.8, 1.0]
    fig.update_layout(xaxis2=dict(overlaying="x", side="top", range=[0.5, L + 0.5], tickmode="array",
                                  tickvals=[d * L for d in depth_ticks], ticktext=[f"{d:.1f}" for d in depth_ticks],
                                  title=dict(text="normalised depth l/ℓ", standoff=2), showgrid=False,
                                  ticks="outside"),
                      margin=dict(t=110, l=130))
    fig.update_xaxes(range=[0.5, L + 0.5], selector=dict(overlaying=None))
    fig.update_layout(title=dict(text=titles[0], yref="container", y=1.0, yanchor="top", pad=dict(t=22)))
    if len(combos) > 1:
        menu = []
        n = len(combos)
        for i, label in enumerate(buttons):
            visible = [j == i for j in range(n)] + [True]
            cax = {f"{'coloraxis' if j == 0 else f'coloraxis{j + 1}'}.showscale": j == i for j in range(n)}
            sub = table[(table["prompt"] == combos[i][0]) & (table["kind"] == combos[i][1])]
            labels = _token_labels(sub)
            menu.append(dict(method="update", label=label,
                             args=[{"visible": visible},
                                   {"title.text": titles[i], "yaxis.tickvals": list(range(len(labels))),
                                    "yaxis.ticktext": labels, **cax}]))
        plots.dropdown(fig, menu, x=1.0, y=1.0, direction="down")
        fig.update_layout(updatemenus=[dict(fig.layout.updatemenus[0].to_plotly_json(), yanchor="bottom",
                                            y=1.2, x=0.0, xanchor="left")])
        fig.update_layout(margin=dict(t=175, l=130), height=height + 40)
    return fig


def average_effect_figure(avg: pd.DataFrame, *, roles=("last subject", "last token"), title: str = "",
                          height: int = 450) -> go.Figure:
    """Mean normalised indirect effect vs normalised depth l/ℓ, by token role, over a fact set.

    ``avg`` comes from :func:`depthlib.tracing.average_effect` (one or more models). Colours are the token
    roles, dash styles the models, shaded bands ±1 standard error over facts; a dropdown picks the kind.
    """
    kinds = [k for k in KIND_SCALES if k in set(avg["kind"])]
    models = list(dict.fromkeys(avg["model"]))
    fig = plots.new_figure(title, "normalised depth l/ℓ (block l of ℓ)", "normalised indirect effect (1)",
                           height=height)
    dashes = ("solid", "dash", "dot", "dashdot")
    groups = []
    for kind in kinds:
        idx = []
        for mi, model in enumerate(models):
            for role in roles:
                sub = avg[(avg["kind"] == kind) & (avg["model"] == model) & (avg["role"] == role)].sort_values("depth")
                if sub.empty:
                    continue
                color = ROLE_COLORS.get(role, plots.color(mi))
                n = int(sub["n_facts"].max())
                lo, hi = sub["effect"] - sub["sem"].fillna(0), sub["effect"] + sub["sem"].fillna(0)
                idx.append(len(fig.data))
                fig.add_trace(go.Scatter(x=np.r_[sub["depth"], sub["depth"][::-1]], y=np.r_[hi, lo[::-1]],
                                         fill="toself", fillcolor=color, opacity=0.15, line=dict(width=0),
                                         hoverinfo="skip", showlegend=False, visible=kind == kinds[0]))
                idx.append(len(fig.data))
                fig.add_trace(go.Scatter(
                    x=sub["depth"], y=sub["effect"], mode="lines+markers", visible=kind == kinds[0],
                    name=f"{_role_name(role)} · {model} ({n} facts)", line=dict(color=color, dash=dashes[mi % 4]),
                    customdata=np.c_[sub["layer"] + 1, sub["p"]],
                    hovertemplate=(f"{model}, {_role_name(role)}<br>block l=%{{customdata[0]}} (l/ℓ=%{{x:.2f}})<br>"
                                   "effect=%{y:.3f}<br>mean restored p=%{customdata[1]:.3f}<extra></extra>")))
        groups.append(idx)
    fig.add_hline(y=0, line=dict(color="#999", width=1))
    fig.update_xaxes(range=[0, 1.02])
    fig.update_layout(legend=dict(orientation="h", y=-0.3, x=0, yanchor="top"), margin=dict(b=150))
    if len(kinds) > 1:
        n = len(fig.data)
        buttons = []
        for kind, idx in zip(kinds, groups):
            visible = [i in idx for i in range(n)]
            buttons.append(dict(method="update", label=f"restore: {KIND_NAMES[kind]}", args=[{"visible": visible}]))
        plots.dropdown(fig, buttons, x=1.0, y=1.16)
    return fig


def note(markdown: str) -> None:
    """Show generated Markdown (numbers read from a run) as formatted text in the notebook and the book."""
    from IPython.display import Markdown, display
    display(Markdown(markdown))
