"""Legibility checks of a built page, run in the browser on plotly's rendered SVG (not on the figure's Python spec),
so each catches its kind of defect on any figure. ``tests/test_book_browser.py`` runs them on every page of the built
book; ``tests/test_figure_checks.py`` proves each can fail, on small figures built to break it.

Every check is one JS function of no argument that returns a list of problems, one line each, naming the figure by its
caption number ("Fig. 5.6") and title. Thresholds:

* :data:`OVERLAP_PX` (2 px): glyph boxes include the font's ascent and descent, about a fifth of the font size
  beyond the ink, so two labels whose boxes overlap by at most 2 px still show every glyph apart; more, and ink
  meets ink. Rotated labels are compared as rotated rectangles (separating axes), not by their axis-aligned boxes,
  which overlap for any two neighbouring labels at 45 degrees.
* :data:`MIN_TICK_LABELS` (2): one labelled tick gives no scale (a log axis with one label cannot be read at all).
  A category axis with one category is exempt: its one label names the only row, and there is no scale to read.
* :data:`MIN_DATA_SPAN` (0.25): an axis whose data fill less than a quarter of it spends three quarters of the figure
  on nothing and squeezes the data into a corner. Exempt: an axis whose data take one value (autorange centres a
  single value; there is no span to fill) and an axis the figure says is fixed on purpose, by naming it with a reason
  in ``layout.meta["fixed_range"]`` (``depthlib.plots.fixed_range`` writes it).
* colour: a colour is "grey" (drawing no distinction, e.g. reference lines) when its channels differ by less than
  :data:`GREY_SPREAD` (24 of 255). Two or more other colours among a figure's data marks must each be named, by a
  legend swatch or a text in that colour; a colorbar names every colour of a scale.
"""
from __future__ import annotations

OVERLAP_PX = 2
MIN_TICK_LABELS = 2
MIN_DATA_SPAN = 0.25
GREY_SPREAD = 24

#: Helpers shared by the checks: the figures of the page, their names, shown text elements, rotated boxes and their
#: overlap (the smallest penetration over the separating axes of two convex quadrilaterals; 0 when apart).
_HELPERS = """
  const figures = [...document.querySelectorAll('.js-plotly-plot')].filter(gd => gd._fullLayout);
  const captions = [...document.querySelectorAll('.depthlib-caption')];
  const figName = gd => {
    const after = captions.find(c => gd.compareDocumentPosition(c) & Node.DOCUMENT_POSITION_FOLLOWING);
    const m = after ? after.textContent.match(/Fig\\.\\s*(\\d+\\.\\d+)/) : null;
    const t = gd.querySelector('.gtitle');
    const title = t ? t.textContent.trim().slice(0, 60) : '(untitled)';
    return (m ? `Fig. ${m[1]}` : `figure ${figures.indexOf(gd) + 1}`) + ` '${title}'`;
  };
  const shown = el => {
    if (!el || !el.textContent.trim() && el.tagName.toLowerCase() === 'text') return false;
    for (let e = el; e && e.nodeType === 1; e = e.parentElement) {
      const cs = getComputedStyle(e);
      if (cs.display === 'none' || cs.visibility === 'hidden' || parseFloat(cs.opacity) === 0) return false;
    }
    const r = el.getBoundingClientRect();
    return r.width > 0 && r.height > 0;
  };
  const quad = el => {
    const b = el.getBBox(), m = el.getScreenCTM();
    if (!m || (b.width === 0 && b.height === 0)) return null;
    return [[b.x, b.y], [b.x + b.width, b.y], [b.x + b.width, b.y + b.height], [b.x, b.y + b.height]]
      .map(([x, y]) => [m.a * x + m.c * y + m.e, m.b * x + m.d * y + m.f]);
  };
  const overlap = (P, Q) => {
    let best = Infinity;
    for (const poly of [P, Q]) for (let i = 0; i < poly.length; i++) {
      const [x1, y1] = poly[i], [x2, y2] = poly[(i + 1) % poly.length];
      let nx = y1 - y2, ny = x2 - x1; const len = Math.hypot(nx, ny);
      if (!len) continue;
      nx /= len; ny /= len;
      const a = P.map(([x, y]) => x * nx + y * ny), c = Q.map(([x, y]) => x * nx + y * ny);
      const o = Math.min(Math.max(...a), Math.max(...c)) - Math.max(Math.min(...a), Math.min(...c));
      if (o <= 0) return 0;
      best = Math.min(best, o);
    }
    return best;
  };
  const label = el => JSON.stringify(el.textContent.trim().slice(0, 40) || '(box)');
  const axisTitles = gd => [...gd.querySelectorAll('.infolayer text')]
    .filter(t => /^[xy]\\d*title$/.test(t.getAttribute('class') || '') && shown(t));
  const axes = gd => Object.keys(gd._fullLayout).filter(k => /^[xy]axis\\d*$/.test(k)).map(k => gd._fullLayout[k]);
  const tickLabels = (gd, ax) => [...gd.querySelectorAll(`g.${ax._id}tick > text`)].filter(shown);
  const axisTraces = (gd, ax) => (gd._fullData || []).filter(t => t.visible === true &&
    (t[ax._id.charAt(0) + 'axis'] || ax._id.charAt(0)) === ax._id);
"""


def _check(body: str) -> str:
    return "() => {" + _HELPERS + body + "}"


#: (a) An axis title running into the figure's title or into another axis title.
AXIS_TITLES_JS = _check(f"""
  const bad = [];
  for (const gd of figures) {{
    const titles = axisTitles(gd).concat([...gd.querySelectorAll('.gtitle')].filter(shown));
    for (let i = 0; i < titles.length; i++) for (let j = i + 1; j < titles.length; j++) {{
      const P = quad(titles[i]), Q = quad(titles[j]);
      const o = P && Q ? overlap(P, Q) : 0;
      if (o > {OVERLAP_PX}) bad.push(`${{figName(gd)}}: title ${{label(titles[i])}} overlaps ${{label(titles[j])}} ` +
                                  `by ${{o.toFixed(0)}} px`);
    }}
  }}
  return bad;
""")

#: (b) An axis showing fewer than two tick labels (no scale to read).
TICK_LABELS_JS = _check(f"""
  const bad = [];
  for (const gd of figures) for (const ax of axes(gd)) {{
    if (!ax.visible || ax.showticklabels === false || !axisTraces(gd, ax).length) continue;
    if ((ax.type === 'category' || ax.type === 'multicategory') && (ax._categories || []).length < 2) continue;
    const n = tickLabels(gd, ax).length;
    if (n < {MIN_TICK_LABELS}) bad.push(`${{figName(gd)}}: ${{ax._id}} axis ` +
      `(${{(ax.title && ax.title.text || '').slice(0, 40) || 'untitled'}}, ${{ax.type}}) shows ${{n}} tick label(s)`);
  }}
  return bad;
""")

#: (c) Text inside one figure printed over other text: annotations (guide labels), text marks of scatter traces, legend
#: items and the legend's box, the titles, colorbar labels, menus, and tick labels (against each other on one axis, and
#: against everything else); and any of them running past the figure's edge, where it is cut.
LABELS_JS = _check(f"""
  const bad = [];
  for (const gd of figures) {{
    const legend = gd.querySelector('.infolayer .legend');
    const inLegend = el => legend && legend.contains(el);
    const legendBox = legend && shown(legend.querySelector('rect.bg')) ? [legend.querySelector('rect.bg')] : [];
    const others = [...gd.querySelectorAll('.annotation-text, .legendtext, .gtitle, .colorbar text, ' +
                                           '.updatemenu-header-group text, .slider-group text, ' +
                                           '.scatterlayer .textpoint text')]
      .concat(axisTitles(gd)).filter(shown).concat(legendBox);
    const groups = axes(gd).map(ax => tickLabels(gd, ax));
    const pairs = [];
    for (const ticks of groups) for (let i = 0; i < ticks.length; i++) {{
      for (let j = i + 1; j < ticks.length; j++) pairs.push([ticks[i], ticks[j]]);
      for (const o of others) pairs.push([ticks[i], o]);
    }}
    for (let i = 0; i < others.length; i++) for (let j = i + 1; j < others.length; j++) pairs.push([others[i], others[j]]);
    const edge = gd.querySelector('.main-svg').getBoundingClientRect();     // text past the figure's edge is cut
    for (const el of others.concat(...groups)) {{
      const Q = el.matches('rect') ? null : quad(el);
      if (!Q) continue;
      const out = Math.max(edge.left - Math.min(...Q.map(q => q[0])), Math.max(...Q.map(q => q[0])) - edge.right,
                           edge.top - Math.min(...Q.map(q => q[1])), Math.max(...Q.map(q => q[1])) - edge.bottom);
      if (out > {OVERLAP_PX}) bad.push(`${{figName(gd)}}: ${{label(el)}} is cut by the figure's edge (${{out.toFixed(0)}} px)`);
    }}
    for (const [a, b] of pairs) {{
      if (inLegend(a) && inLegend(b)) continue;        // the legend's own items sit inside its box
      if (a.matches('.slider-group text') && b.matches('.slider-group text')) continue;
      const P = quad(a), Q = quad(b);
      const o = P && Q ? overlap(P, Q) : 0;
      if (o > {OVERLAP_PX}) bad.push(`${{figName(gd)}}: ${{label(a)}} overlaps ${{label(b)}} by ${{o.toFixed(0)}} px`);
    }}
  }}
  return bad;
""")

#: (d) An axis whose data fill less than a quarter of its span: the extent of the drawn data along the axis (every
#: point and error bar of the scatter traces, WebGL ones included, from plotly's calculated data; the SVG boxes of bars,
#: heat maps, boxes and text marks) against the axis length in px.
DATA_SPAN_JS = _check(f"""
  const bad = [];
  const MARKS = '.trace path.point, .trace .textpoint text, .trace image, .trace path.box, .trace g.point > path';
  for (const gd of figures) {{
    const fixed = ((gd._fullLayout.meta || {{}}).fixed_range) || {{}};
    const svg = gd.querySelector('.main-svg').getBoundingClientRect();
    for (const [id, plot] of Object.entries(gd._fullLayout._plots || {{}})) {{
      const node = plot.plot && plot.plot.node();
      if (!node) continue;
      const boxes = [...node.querySelectorAll(MARKS)].filter(shown).map(el => el.getBoundingClientRect());
      for (const ax of [plot.xaxis, plot.yaxis]) {{
        if (!ax || ax._mainSubplot !== id || fixed[ax._name]) continue;
        const x = ax._id.charAt(0) === 'x', other = x ? plot.yaxis : plot.xaxis;
        const traces = axisTraces(gd, ax).filter(t => axisTraces(gd, other).includes(t));
        const values = new Set(traces.flatMap(t => {{
          const v = t[ax._id.charAt(0)];
          return v && v.length !== undefined ? [...v].filter(u => u !== null && u !== undefined).map(String) : [];
        }}));
        if (values.size <= 1) continue;                  // one value: nothing to spread over the axis
        const px = [];                                   // data positions along the axis, px from its start
        for (const t of traces) {{
          const cd = (gd.calcdata || []).find(c => c[0] && c[0].trace && c[0].trace.index === t.index);
          const L = x ? 'x' : 'y';
          if (t.type === 'scatter' && cd) for (const p of cd) {{
            for (const v of [p[L], p[L + 'h'], p[L + 's']]) if (typeof v === 'number' && isFinite(v)) px.push(ax.c2p(v));
          }} else if (t.type === 'scattergl') for (const v of t[L] || []) {{
            const p = ax.d2p(v);
            if (typeof p === 'number' && isFinite(p)) px.push(p);
          }}
        }}
        const start = x ? svg.left + ax._offset : svg.top + ax._offset;
        for (const r of boxes) px.push((x ? r.left : r.top) - start, (x ? r.right : r.bottom) - start);
        const inside = px.map(p => Math.min(Math.max(p, 0), ax._length));
        if (!inside.length) continue;
        const share = (Math.max(...inside) - Math.min(...inside)) / ax._length;
        if (share < {MIN_DATA_SPAN}) bad.push(`${{figName(gd)}}: the data fill ${{(100 * share).toFixed(0)}} % of the ` +
          `${{ax._id}} axis (${{(ax.title && ax.title.text || '').slice(0, 40) || 'untitled'}}), range ` +
          `${{ax.range.map(v => typeof v === 'number' ? +v.toPrecision(3) : v).join(' to ')}}` +
          `${{ax.type === 'log' ? ' (log10)' : ''}}`);
      }}
    }}
  }}
  return bad;
""")

#: (e) Data marks of one plot (subplot) in two or more colours, some colour named by nothing: no legend swatch and no
#: text in that colour, and no colorbar; and a colour scale (heat map, contour) without a colorbar. Colours that each
#: fill a different subplot are named by the subplots' titles, so only colours sharing a plot must be named.
COLOURS_JS = _check(f"""
  const bad = [];
  const probe = document.createElement('span');
  document.body.appendChild(probe);
  const rgb = s => {{
    if (!s || s === 'none') return null;
    probe.style.color = '';
    probe.style.color = s;
    const m = getComputedStyle(probe).color.match(/rgba?\\(([^)]+)\\)/);
    if (!m) return null;
    const [r, g, b, a] = m[1].split(',').map(Number);
    return a === 0 ? null : [r, g, b];
  }};
  const key = c => c.join(',');
  const grey = c => Math.max(...c) - Math.min(...c) < {GREY_SPREAD};
  const paints = el => {{
    const cs = getComputedStyle(el), out = [];
    const fill = rgb(el.style.fill || cs.fill), stroke = rgb(el.style.stroke || cs.stroke);
    if (fill && parseFloat(cs.fillOpacity) !== 0) out.push(fill);
    if (stroke && parseFloat(cs.strokeOpacity) !== 0 && parseFloat(cs.strokeWidth) > 0) out.push(stroke);
    return out;
  }};
  for (const gd of figures) {{
    if (gd.querySelector('.infolayer .colorbar')) continue;
    const scaled = (gd._fullData || []).filter(t => t.visible === true &&
      ['heatmap', 'contour', 'histogram2d', 'histogram2dcontour'].includes(t.type));
    if (scaled.length) {{ bad.push(`${{figName(gd)}}: a colour scale (${{scaled[0].type}}) without a colorbar`); continue; }}
    const plots = new Map();                             // subplot -> colour key -> rgb
    const add = (where, c) => {{
      if (!c || grey(c)) return;
      if (!plots.has(where)) plots.set(where, new Map());
      plots.get(where).set(key(c), c);
    }};
    for (const el of gd.querySelectorAll('.cartesianlayer .trace path.point, .cartesianlayer .trace path.js-line, ' +
                                         '.cartesianlayer .trace .textpoint text, .cartesianlayer .trace g.point > path')) {{
      if (!shown(el)) continue;
      const sub = el.closest('.subplot');
      for (const c of paints(el)) add(sub ? sub.getAttribute('class') : '', c);
    }}
    for (const t of (gd._fullData || []).filter(t => t.visible === true && t.type === 'scattergl')) {{
      const colours = [].concat((t.marker || {{}}).color || [], (t.line || {{}}).color || []);
      for (const c of colours) if (typeof c === 'string') add('subplot ' + t.xaxis + t.yaxis, rgb(c));
    }}
    const named = new Set();
    for (const el of gd.querySelectorAll('.legend .legendpoints path, .legend .legendlines path, ' +
                                         '.legend .legendsymbols path, .legend .legendfill path, ' +
                                         '.annotation-text, .cartesianlayer .textpoint text, .legendtext'))
      for (const c of paints(el)) named.add(key(c));
    for (const [where, colours] of plots) {{
      if (colours.size < 2) continue;
      const unnamed = [...colours.keys()].filter(k => !named.has(k));
      if (unnamed.length) bad.push(`${{figName(gd)}}: ${{colours.size}} colours in the data ` +
        `(${{where.replace('subplot ', '') || 'plot'}}), ${{unnamed.length}} named by no legend entry, text or colorbar ` +
        `(rgb ${{unnamed.slice(0, 4).join(' / ')}})`);
    }}
  }}
  probe.remove();
  return bad;
""")

#: (f) Table cells whose text is cut: ending in an ellipsis (pandas truncates long strings and elides rows with
#: "..."), or hidden by CSS text-overflow: ellipsis.
TABLE_CELLS_JS = """() => {
  const bad = [];
  for (const cell of document.querySelectorAll('td, th')) {
    const text = cell.innerText.trim();
    const where = (cell.closest('table').querySelector('th') || {innerText: ''}).innerText.trim().slice(0, 30);
    if (/(\\u2026|\\.\\.\\.)$/.test(text)) { bad.push(`cell ${JSON.stringify(text.slice(-50))} (table starting ` +
                                                    `${JSON.stringify(where)}) ends in an ellipsis`); continue; }
    for (const el of [cell, ...cell.querySelectorAll('*')]) {
      const cs = getComputedStyle(el);
      if (cs.textOverflow === 'ellipsis' && el.scrollWidth > el.clientWidth + 1) {
        bad.push(`cell ${JSON.stringify(text.slice(0, 50))} (table starting ${JSON.stringify(where)}) is cut by ` +
                 `text-overflow: ellipsis (${el.scrollWidth} px of text in ${el.clientWidth} px)`);
        break;
      }
    }
  }
  return bad;
}"""

#: name -> JS, in the order of the defect classes (a)-(f)
CHECKS = {"axis_titles": AXIS_TITLES_JS, "tick_labels": TICK_LABELS_JS, "labels_overlap": LABELS_JS,
          "data_span": DATA_SPAN_JS, "colours_named": COLOURS_JS, "table_cells": TABLE_CELLS_JS}


def run_checks(page) -> dict[str, list[str]]:
    """Every check on an opened playwright ``page``: name -> problems."""
    return {name: page.evaluate(js) for name, js in CHECKS.items()}


def check_book(html, browser, pages=None) -> dict[str, dict[str, list[str]]]:
    """page -> check -> problems, for the built book in folder ``html`` (every .html under it, or ``pages``)."""
    from pathlib import Path
    html = Path(html).resolve()
    pages = pages or ["index"] + sorted(str(p.relative_to(html).with_suffix(""))
                                        for folder in ("book", "notebooks") for p in (html / folder).glob("*.html"))
    report = {}
    for name in pages:
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto((html / f"{name}.html").as_uri(), wait_until="load")
        page.wait_for_timeout(1500)
        report[name] = run_checks(page)
        page.close()
    return report
