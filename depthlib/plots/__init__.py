"""Plotly figure builders and the book renderer: one look for every chapter.

Call :func:`setup_plotly` once per notebook. It registers a ``book`` renderer that emits small
``text/html`` (no inlined plotly.js: the book loads the copy vendored from the plotly wheel once per
page) next to the native plotly mimetype that JupyterLab draws. Without it plotly >= 6 emits only the
plotly mimetype inside a kernel, which Jupyter Book cannot render, and figures silently vanish.

Every chapter builds figures with :func:`new_figure` (shared template, units in axis titles) and shows
them with :func:`show`, which puts a caption under the figure saying what to see.
"""
from __future__ import annotations

import re
from typing import Iterable, Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
import plotly.io as pio
from plotly.io.base_renderers import MimetypeRenderer

#: Colour-blind-safe palette (Okabe–Ito), used in this order by every chapter.
PALETTE = ("#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#F0E442", "#000000")
#: Sequential colour scale for heat maps.
HEAT = "Viridis"
FONT = "Inter, Helvetica Neue, Arial, sans-serif"
WIDTH_CSS = "100%"
HEIGHT = 430


class BookHtmlRenderer(MimetypeRenderer):
    """Renders a figure as an HTML fragment that relies on a page-level plotly.js."""

    def to_mimebundle(self, fig_dict):
        html = pio.to_html(fig_dict, include_plotlyjs=False, include_mathjax=False, full_html=False,
                           default_width=WIDTH_CSS, default_height=fig_dict.get("layout", {}).get("height", HEIGHT),
                           validate=False, config={"displaylogo": False, "responsive": True,
                                                   "displayModeBar": "hover"})
        return {"text/html": html}


def _template() -> go.layout.Template:
    t = go.layout.Template()
    t.layout = go.Layout(
        font=dict(family=FONT, size=13, color="#222"),
        colorway=list(PALETTE),
        plot_bgcolor="white", paper_bgcolor="white",
        margin=dict(l=70, r=30, t=80, b=60),
        height=HEIGHT,
        hovermode="closest",
        legend=dict(bgcolor="rgba(255,255,255,0.8)", bordercolor="#ddd", borderwidth=1),
        xaxis=dict(showline=True, linecolor="#444", mirror=True, ticks="outside", gridcolor="#eee", zeroline=False),
        yaxis=dict(showline=True, linecolor="#444", mirror=True, ticks="outside", gridcolor="#eee", zeroline=False),
    )
    return t


#: the chapter whose figures :func:`show` numbers ("Fig. k.n"), and how many it has shown
_NUMBERING = {"chapter": None, "n": 0}


def setup_plotly(chapter: int | None = None) -> None:
    """Register the depthlib template and the book renderer (idempotent). With ``chapter``, :func:`show` numbers
    the figures it shows from then on "Fig. chapter.1", "Fig. chapter.2", ... (one numbering per notebook)."""
    _NUMBERING.update(chapter=chapter, n=0)
    pio.templates["depthlib"] = _template()
    pio.templates.default = "plotly_white+depthlib"
    pio.renderers["book"] = BookHtmlRenderer()
    pio.renderers.default = "plotly_mimetype+book"
    # tables show whole cells: pandas cuts strings over 50 characters to "...", which hides a reading's numbers
    pd.set_option("display.max_colwidth", None)


def new_figure(title: str, x_title: str, y_title: str, *, log_x: bool = False, log_y: bool = False,
               height: int = HEIGHT) -> go.Figure:
    """An empty figure in the shared style. Axis titles must carry units, e.g. 'depth ℓ (blocks)'."""
    fig = go.Figure()
    fig.update_layout(title=dict(text=title, x=0.01, xanchor="left", y=0.97, yanchor="top"), height=height)
    # not "linear": plotly then types each axis from its data, so category labels get a category axis
    fig.update_xaxes(title_text=x_title, type="log" if log_x else "-")
    fig.update_yaxes(title_text=y_title, type="log" if log_y else "-")
    return fig


def _error_ends(trace, letter: str, arr: np.ndarray) -> list[np.ndarray]:
    """The ends of a trace's error bars along ``letter`` (type "data": ``array`` above, ``arrayminus`` or else
    ``array`` below), which autorange shows as well as the points."""
    err = getattr(trace, f"error_{letter}", None)
    if err is None or err.visible is False or err.array is None or (err.type or "data") != "data":
        return []
    plus = np.asarray(err.array, dtype=float).ravel()
    minus = plus if err.arrayminus is None else np.asarray(err.arrayminus, dtype=float).ravel()
    if len(plus) != len(arr) or len(minus) != len(arr):
        return []
    return [arr + plus, arr - minus]


def _axis_values(fig: go.Figure, axis: str, traces: Iterable[int] | None = None) -> np.ndarray:
    """The finite positive data values drawn on layout axis ``axis`` ('xaxis', 'yaxis2', ...) by the traces numbered
    ``traces`` (default: every trace), the ends of their error bars included (autorange spans them too)."""
    letter, suffix = axis[0], axis[5:]
    chosen = range(len(fig.data)) if traces is None else traces
    values = []
    for i in chosen:
        trace = fig.data[i]
        if (getattr(trace, f"{letter}axis", None) or letter) != letter + suffix:
            continue
        data = getattr(trace, letter, None)
        if data is None:
            continue
        try:
            arr = np.asarray(data, dtype=float).ravel()
        except (TypeError, ValueError):
            continue
        for a in (arr, *_error_ends(trace, letter, arr)):
            values.append(a[np.isfinite(a) & (a > 0)])
    return np.concatenate(values) if values else np.array([])


#: the fewest labelled ticks a log axis gets (the browser test fails an axis with fewer than 2: one label is no scale),
#: and the most decades labelled (more: every second, third … decade)
MIN_LOG_LABELS, MAX_LOG_LABELS = 3, 8


def _tick_text(v: float, step: float | None = None, power: bool = False) -> str:
    """A tick label: plain digits from 0.001 to 99 999, else (or with ``power``) m×10<sup>e</sup> (plotly's own
    "100μ" reads as a unit); with ``step`` (a linear ladder), as many decimals as the step needs."""
    if step is not None and 1e-3 <= step and v < 1e5:
        decimals = max(0, -int(np.floor(np.log10(step) + 1e-9)))
        return f"{v:.{decimals}f}"
    if 1e-3 <= v < 1e5 and not power:
        return f"{float(f'{v:.6g}'):g}"
    e = int(np.floor(np.log10(v) + 1e-9))
    m = float(f"{v / 10 ** e:.3g}")
    exponent = f"10<sup>{'−' if e < 0 else ''}{abs(e)}</sup>"
    return exponent if m == 1 else f"{m:g}×{exponent}"


def _log_ticks_for(values: np.ndarray) -> dict:
    """Axis settings that label at least :data:`MIN_LOG_LABELS` ticks inside the data's range on a log axis: decades
    (digits as unlabelled minor ticks) when the data span that many; else the 1-2-5 values; else 1-2-3-5-7;
    else every digit; else (data within less than a digit step) evenly spaced round values. Array ticks reach a
    little beyond the data, so the ones autorange's padding shows are labelled too."""
    lo, hi = float(values.min()), float(values.max())
    if hi <= lo * 1.000001:                    # one value: autorange pads it on both sides
        lo, hi = lo / 1.5, hi * 1.5
    inside = lambda vals: [v for v in vals if lo * (1 - 1e-9) <= v <= hi * (1 + 1e-9)]   # noqa: E731
    e0, e1 = int(np.floor(np.log10(lo))), int(np.floor(np.log10(hi)))
    reset = dict(tickmode=None, tickvals=None, ticktext=None, dtick=None, tick0=None, minor=None)
    decades = [10.0 ** e for e in range(e0 - 1, e1 + 3)]
    if len(inside(decades)) >= MIN_LOG_LABELS:
        every = int(np.ceil(len(inside(decades)) / MAX_LOG_LABELS))      # many decades: every 2nd, 3rd ...
        vals = [v for v in decades if round(np.log10(v)) % every == 0]
        plain = all(1e-3 <= v < 1e5 for v in inside(vals))              # one style on an axis: 0.01 or 10⁻²
        text = [_tick_text(v) if plain else _tick_text(v, power=True) for v in vals]
        return {**reset, "tickmode": "array", "tickvals": vals, "ticktext": text,
                "minor": dict(ticks="outside", ticklen=3, dtick="D1")}
    for mantissas in ((1, 2, 5), (1, 2, 3, 5, 7), (1, 2, 3, 4, 5, 6, 7, 8, 9)):
        vals = [m * 10.0 ** e for e in range(e0 - 1, e1 + 2) for m in mantissas]
        if len(inside(vals)) >= MIN_LOG_LABELS:
            vals = [v for v in vals if lo / 3 <= v <= hi * 3]
            return {**reset, "tickmode": "array", "tickvals": vals, "ticktext": [_tick_text(v) for v in vals]}
    # narrower than one digit step: the largest 1-2-5 step with enough multiples inside the data
    step = 10.0 ** np.ceil(np.log10(hi - lo))
    for s in (step, step / 2, step / 5, step / 10, step / 20, step / 50, step / 100):
        vals = [k * s for k in range(int(np.floor(lo / s)) - 2, int(np.ceil(hi / s)) + 3) if k > 0]
        if len(inside(vals)) >= MIN_LOG_LABELS:
            break
    return {**reset, "tickmode": "array", "tickvals": vals, "ticktext": [_tick_text(v, s) for v in vals]}


def _steps(fig: go.Figure):
    """Every slider step and menu button of ``fig`` that sets which traces are visible (a full list, one per trace),
    with that list: (step, visible)."""
    controls = [s for slider in (fig.layout.sliders or ()) for s in (slider.steps or ())]
    controls += [b for menu in (fig.layout.updatemenus or ()) for b in (menu.buttons or ())]
    for step in controls:
        args = list(step.args or ())
        if step.method not in ("update", "restyle") or not args or not isinstance(args[0], dict):
            continue
        visible = args[0].get("visible")
        if isinstance(visible, (list, tuple)) and len(visible) == len(fig.data) and not (
                step.method == "restyle" and len(args) > 2):
            yield step, list(visible)


def decade_ticks(fig: go.Figure) -> go.Figure:
    """Label every log axis with at least :data:`MIN_LOG_LABELS` readable ticks (:func:`_log_ticks_for`): plotly
    labels the minor ticks of a short log axis with bare digits ("3, 2, 0.1, 9, 8 …"), and an axis within one decade
    often gets one label or none. The ticks follow the traces shown: a slider step or menu button that switches the
    visible traces also switches the ticks to the ones its traces need. Axes with their own tick values are left
    alone."""
    layout = fig.layout.to_plotly_json()
    axes = [a for a, spec in layout.items() if (a.startswith("xaxis") or a.startswith("yaxis"))
            and spec.get("type") == "log" and spec.get("tickmode") != "array" and spec.get("tickvals") is None
            and spec.get("dtick") is None]
    shown = [i for i, t in enumerate(fig.data) if t.visible in (None, True)]
    for axis in axes:
        values = _axis_values(fig, axis, shown)
        if len(values) == 0:
            values = _axis_values(fig, axis)
        if len(values):
            fig.update_layout({axis: _log_ticks_for(values)})
    for step, visible in _steps(fig):
        changes = {}
        for axis in axes:
            values = _axis_values(fig, axis, [i for i, v in enumerate(visible) if v is True])
            if len(values):
                changes.update({f"{axis}.{k}": v for k, v in _log_ticks_for(values).items()})
        if changes:
            args = list(step.args)
            if step.method == "restyle":
                step.method = "update"
            step.args = [args[0], {**(args[1] if len(args) > 1 and isinstance(args[1], dict) else {}), **changes}]
    return fig


#: Axis titles are drawn at ``AXIS_TITLE_SCALE`` times the figure's font size (plotly's default, rounded: 16 px) and
#: a character of the book's sans-serif font is at most ``CHAR_WIDTH`` of that size wide on average (measured in
#: Chromium on the 139 axis titles of the cpu book longer than 15 characters: median 0.49, 95th percentile 0.53).
AXIS_TITLE_SCALE, CHAR_WIDTH = 1.2, 0.53


def _break(text: str, width: int) -> str:
    """``text`` broken with <br> at spaces (never inside an HTML tag) into lines of at most ``width`` characters of
    visible text, as few as that allows."""
    words = re.split(r" (?![^<]*>)", text)
    lines, line = [], ""
    for w in words:
        candidate = f"{line} {w}" if line else w
        if line and len(re.sub(r"<[^>]+>", "", candidate)) > width:
            lines.append(line)
            line = w
        else:
            line = candidate
    return "<br>".join(lines + [line])


def wrap(text: str, width: int = 36) -> str:
    """``text`` broken onto lines of at most ``width`` characters (at spaces; for the long row labels of a forest
    plot, which otherwise take the plot's width)."""
    return _break(text, width)


def fit_axis_titles(fig: go.Figure) -> go.Figure:
    """Break a y-axis title that is longer than its axis onto two or more lines: plotly centres a vertical title on
    its axis, so a longer one runs past the plot's top into the figure's title (and past its bottom)."""
    layout = fig.layout.to_plotly_json()
    font = (layout.get("font") or {}).get("size") or 13
    margin = layout.get("margin") or {}
    plot = (layout.get("height") or HEIGHT) - margin.get("t", 80) - margin.get("b", 60)
    for axis, spec in layout.items():
        title = (spec.get("title") or {}) if axis.startswith("yaxis") else {}
        text = title.get("text") or ""
        if not text or "<br>" in text:
            continue
        d0, d1 = spec.get("domain") or (0, 1)
        size = (title.get("font") or {}).get("size") or round(AXIS_TITLE_SCALE * font)
        room = 0.92 * plot * (d1 - d0) / (CHAR_WIDTH * size)        # characters that fit along the axis
        if len(re.sub(r"<[^>]+>", "", text)) > room:
            fig.update_layout({axis: dict(title_text=_break(text, max(int(room), 12)))})
    return fig


#: a plain-text subscript: one symbol, "_", then a one-character index with an optional ±1 or ±letter, or a braced
#: index ("α_ℓ", "h_l+1", "Δh_{l+k}"); a word after the "_" (d_model, p_clean, theta_middle_mean) is not one
_SUBSCRIPT = re.compile(r"(?<![A-Za-z])([A-Za-zα-ωΔ])_(\{[^}<]*\}|[ℓlLmDθijkn0-9*](?:[+−-](?:\d+|[a-z]))?)"
                        r"(?![A-Za-z0-9_])")


def subscripts(text: str) -> str:
    """``text`` with plain-text subscripts ("α_ℓ", "θ(h_l, h_l+1)") written as HTML subscripts, as a reader sees
    them in the book's prose."""
    return _SUBSCRIPT.sub(lambda m: f"{m.group(1)}<sub>{m.group(2).strip('{}')}</sub>", text) if text else text


def write_subscripts(fig: go.Figure) -> go.Figure:
    """:func:`subscripts` on every text a figure shows: its title (and the titles its sliders and menus switch to),
    axis and colorbar titles, trace and guide names, annotations."""
    if fig.layout.title.text:
        fig.layout.title.text = subscripts(fig.layout.title.text)
    for axis, spec in fig.layout.to_plotly_json().items():
        text = ((spec.get("title") or {}).get("text") or "") if isinstance(spec, dict) else ""
        if (axis.startswith("xaxis") or axis.startswith("yaxis")) and text:
            fig.update_layout({axis: dict(title_text=subscripts(text))})
    for trace in fig.data:
        if trace.name:
            trace.name = subscripts(trace.name)
        colorbar = getattr(trace, "colorbar", None)
        if colorbar is not None and colorbar.title.text:
            colorbar.title.text = subscripts(colorbar.title.text)
    for item in list(fig.layout.annotations) + list(fig.layout.shapes):
        if getattr(item, "text", None):
            item.text = subscripts(item.text)
        if getattr(item, "name", None):
            item.name = subscripts(item.name)
    for step in [s for slider in (fig.layout.sliders or ()) for s in (slider.steps or ())] + \
            [b for menu in (fig.layout.updatemenus or ()) for b in (menu.buttons or ())]:
        args = list(step.args or ())
        if len(args) > 1 and isinstance(args[1], dict) and any(k.endswith("title.text") for k in args[1]):
            step.args = [args[0], {k: subscripts(v) if k.endswith("title.text") and isinstance(v, str) else v
                                   for k, v in args[1].items()}] + args[2:]
    return fig


#: a legend under the plot, in one row: anchored to the figure's bottom edge (container coordinates), so plotly's
#: automatic margins stack it under the x axis's tick labels and title; in paper coordinates (y < 0) it is drawn at
#: a fixed distance under the axes, over whatever labels are taller than that distance
LEGEND_BELOW = dict(orientation="h", x=0, xanchor="left", y=0, yanchor="bottom", yref="container")


def colour_key(fig: go.Figure, colours: dict[str, str], *, symbol: str = "circle") -> go.Figure:
    """Say what colour encodes where a trace colours its points one by one (a forest plot's rows): one legend entry
    per name and colour, drawing nothing."""
    for name, c in colours.items():
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=name, showlegend=True, hoverinfo="skip",
                                 marker=dict(color=c, size=10, symbol=symbol)))
    return fig


#: the two mechanisms' depth exponents, for :func:`guides` on any axis of α_ℓ
MECHANISM_GUIDES = ((1.0, "α<sub>ℓ</sub> = 1: ensemble averaging"), (3.0, "α<sub>ℓ</sub> = 3: smooth flow (paper §4)"))


def guides(fig: go.Figure, lines: Sequence[tuple[float, str]], *, axis: str = "x",
           dashes: Sequence[str] = ("dot",)) -> go.Figure:
    """Reference values (α_ℓ = 1 and 3, π/2 …) as grey dotted lines across the plot (vertical at x values with
    ``axis`` "x", else horizontal), each named in the legend (its text says its value; ``dashes`` cycles styles if
    they should differ too): labels written beside the lines print over each other when two values are close, and
    plotly widens the axis to fit their text."""
    for k, (value, text) in enumerate(lines):
        where = (dict(x0=value, x1=value, y0=0, y1=1, xref="x", yref="paper") if axis == "x" else
                 dict(y0=value, y1=value, x0=0, x1=1, xref="paper", yref="y"))
        fig.add_shape(type="line", line=dict(color="#555", dash=dashes[k % len(dashes)], width=1.5), name=text,
                      showlegend=True, **where)
    return fig


def fixed_range(fig: go.Figure, axis: str, reason: str) -> go.Figure:
    """Say that layout axis ``axis`` ('yaxis', 'xaxis2' …) spans more than its data on purpose, and why (e.g. the
    values a reader compares the data with). The book's browser test fails an axis whose data fill less than a
    quarter of it unless the figure says so here (``layout.meta["fixed_range"]``)."""
    meta = dict(fig.layout.meta) if isinstance(fig.layout.meta, dict) else {}
    meta["fixed_range"] = {**meta.get("fixed_range", {}), axis: reason}
    fig.update_layout(meta=meta)
    return fig


#: the most legend entries a figure shows at once: more hide behind a scrollbar at the book's 1280 px
MAX_LEGEND_ENTRIES = 10


def _has_data(trace) -> bool:
    """Whether ``trace`` has a finite number to draw in any of its coordinates (category labels beside missing values
    draw nothing)."""
    for k in ("x", "y", "z", "values", "r"):
        v = getattr(trace, k, None)
        if v is not None and np.size(v):
            numbers = pd.to_numeric(pd.Series(np.asarray(v, dtype=object).ravel()), errors="coerce")
            if np.isfinite(numbers.to_numpy(float)).any():
                return True
    return False


def figure_problems(fig: go.Figure) -> list[str]:
    """What keeps a reader from reading ``fig``: no trace with data, no titled x or y axis (the quantity and its
    unit; with subplots one titled axis of each kind suffices; a category axis's labels name its rows), category
    labels on an axis typed linear or log (plotly draws nothing), or more than :data:`MAX_LEGEND_ENTRIES` legend
    entries shown at once."""
    problems = [] if any(_has_data(t) for t in fig.data) else ["no trace has data"]
    layout = fig.layout.to_plotly_json()
    cartesian = any(getattr(t, "xaxis", None) is not None or t.type in ("scatter", "bar", "box", "heatmap")
                    for t in fig.data)
    for kind in ("x", "y"):
        titled = [a for a, spec in layout.items() if a.startswith(kind + "axis")
                  and ((spec.get("title") or {}).get("text") or spec.get("type") == "category")]
        if cartesian and not titled:
            problems.append(f"no {kind} axis has a title")
    for t in fig.data:
        for kind in ("x", "y"):
            values = getattr(t, kind, None)
            axis = layout.get((getattr(t, f"{kind}axis", None) or kind).replace(kind, kind + "axis", 1), {})
            if (values is not None and axis.get("type") in ("linear", "log")
                    and pd.to_numeric(pd.Series(np.asarray(values, dtype=object).ravel()), errors="coerce").isna().all()
                    and any(isinstance(v, str) for v in np.asarray(values, dtype=object).ravel())):
                problems.append(f"category labels on the numeric {kind} axis (they draw nothing)")
    shown = [t for t in fig.data if t.showlegend is not False and t.visible in (None, True, "legendonly")]
    if layout.get("showlegend") is not False and len(shown) > MAX_LEGEND_ENTRIES:
        problems.append(f"{len(shown)} legend entries shown at once (at most {MAX_LEGEND_ENTRIES})")
    return problems


def show(fig: go.Figure, caption: str) -> None:
    """Display a figure with a caption underneath (rendered as Markdown in JupyterLab and in the book).

    Log axes get at least three readable tick labels (:func:`decade_ticks`) and y-axis titles longer than their axis
    are broken onto lines (:func:`fit_axis_titles`); plain-text subscripts ("α_ℓ") are written as subscripts
    (:func:`write_subscripts`). A figure a reader cannot read
    (:func:`figure_problems`) is an error, so executing the notebooks (nbval, the book build) checks every figure."""
    from IPython.display import Markdown, display
    if not caption.strip():
        raise ValueError("a figure needs a caption that says what to see")
    problems = figure_problems(fig)
    if problems:
        raise ValueError(f"figure {fig.layout.title.text or '(untitled)'!r}: " + "; ".join(problems))
    for trace in fig.data:          # a band (filled outline) draws no markers: below 20 points plotly adds them
        if trace.type == "scatter" and trace.fill == "toself" and trace.mode is None:
            trace.mode = "lines"
    decade_ticks(fig)
    write_subscripts(fig)
    fit_axis_titles(fig)
    fig.show()
    if _NUMBERING["chapter"] is not None:
        _NUMBERING["n"] += 1
        caption = f"<b>Fig. {_NUMBERING['chapter']}.{_NUMBERING['n']}</b> — {caption}"
    display(Markdown(f"<p class='depthlib-caption'>{caption}</p>"))


#: the box every page showing a ``smoke`` run carries
PLACEHOLDER_HTML = ("<div class='admonition warning depthlib-placeholder'><p class='admonition-title'>Placeholder "
                    "numbers</p><p>This page shows <code>smoke</code> runs: they only prove that the code runs end to "
                    "end, and their numbers mean nothing. Set <code>PROFILE = \"cpu\"</code> (or build with "
                    "<code>make book</code>) for the book's results.</p></div>")


def run_note(runs) -> None:
    """Say which run(s) a chapter shows (profile, device, commit, code fingerprint) and warn visibly if stale."""
    import html

    from IPython.display import HTML, display

    from depthlib import results
    runs = list(runs.values()) if isinstance(runs, dict) else (runs if isinstance(runs, (list, tuple)) else [runs])
    if any(r.profile == "smoke" for r in runs):
        display(HTML(PLACEHOLDER_HTML))
    lines = "".join(f"<li><code>{html.escape(results.provenance(r))}</code></li>" for r in runs)
    display(HTML(f"<div class='depthlib-provenance'><p>Numbers on this page come from:</p><ul>{lines}</ul></div>"))
    for r in runs:
        warning = results.staleness_note(r)
        if warning:
            display(HTML("<div class='admonition warning'><p class='admonition-title'>Stale run "
                         f"({html.escape(r.experiment)}/{r.key})</p><p>{html.escape(warning)}</p></div>"))


def answer(text: str, title: str = "Answer, from the runs shown") -> None:
    """Show a chapter's generated answer (Markdown) in the box its question opens with: an ``admonition`` div with
    the Markdown between blank lines, which the book's theme styles as an admonition and JupyterLab and GitHub render
    as formatted text (the same form as the notebooks' question boxes, :func:`depthlib.book.portable_markdown`)."""
    import html

    from IPython.display import Markdown, display
    display(Markdown(f'<div class="admonition">\n<p class="admonition-title">{html.escape(title)}</p>\n\n'
                     f"{text.strip()}\n\n</div>"))


def color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def slider_steps(labels: Sequence[str], n_traces_per_step: int, *, n_fixed: int = 0,
                 titles: Sequence[str] | None = None) -> list[dict]:
    """Steps for a plotly slider that shows one group of ``n_traces_per_step`` traces at a time.

    Traces are laid out as ``n_fixed`` always-visible traces followed by one group per label. Works in
    the static book (no kernel): every group is precomputed. ``titles`` sets ``title.text`` per step
    (plotly.js >= 3 erases the title if a step sets a bare ``title`` string).
    """
    n = n_fixed + n_traces_per_step * len(labels)
    steps = []
    for i, label in enumerate(labels):
        visible = [True] * n_fixed + [False] * (n - n_fixed)
        start = n_fixed + i * n_traces_per_step
        visible[start:start + n_traces_per_step] = [True] * n_traces_per_step
        update: dict = {}
        if titles is not None:
            update["title.text"] = titles[i]
        steps.append(dict(method="update", label=str(label), args=[{"visible": visible}, update]))
    return steps


def add_slider(fig: go.Figure, steps: list[dict], *, active: int = 0, prefix: str = "") -> go.Figure:
    fig.update_layout(sliders=[dict(active=active, steps=steps, currentvalue=dict(prefix=prefix),
                                    pad=dict(t=50), len=0.95, x=0.025)])
    fig.update_layout(margin=dict(b=120))
    return fig


def dropdown(fig: go.Figure, buttons: list[dict], *, x: float = 1.0, y: float = 1.16,
             direction: str = "down") -> go.Figure:
    """Add a dropdown menu (static-book control) to switch between precomputed views."""
    menus = list(fig.layout.updatemenus or [])
    menus.append(dict(buttons=buttons, x=x, y=y, xanchor="right", yanchor="top", direction=direction,
                      showactive=True))
    fig.update_layout(updatemenus=menus)
    return fig


def log_ticks(values: Iterable[float]) -> dict:
    """Tick values/labels for a log axis showing the data's own values (e.g. depths 6, 12, 24, 48)."""
    vals = sorted(set(float(v) for v in values))
    return dict(tickmode="array", tickvals=vals, ticktext=[f"{v:g}" for v in vals])


def power_law_line(x: np.ndarray, coefficient: float, exponent: float, n: int = 100) -> tuple[np.ndarray, np.ndarray]:
    """Points of y = coefficient * x^(-exponent) spanning the range of x on a log grid."""
    grid = np.geomspace(np.min(x), np.max(x), n)
    return grid, coefficient * grid ** (-exponent)
