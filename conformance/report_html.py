"""A certificate as one self-contained HTML page with a chart of margins per clause (SPEC 4.5).

:func:`html` returns a complete page holding the content of the Markdown report
(:mod:`conformance.report`) plus :func:`margin_chart`, an inline SVG with one row per clause that
recorded a comparison, closest to its bound first: a bar for the worst share of a tolerance bound
used (0 to 125 %, a dashed line at the bound, colour by closeness, clipped bars marked), a dot for a
clause compared bitwise only. Clauses that recorded no comparison are named under the chart.

The page needs nothing outside itself: inline CSS and inline SVG only, no scripts, no external
references, and a Content-Security-Policy that forbids loading anything. All text taken from
the certificate is entity-escaped (C0 control characters are shown as ``\\xNN``), so user-controlled
names and reasons cannot inject markup; the SVG is well-formed XML.
"""

from __future__ import annotations

import html as _html
import re

from .certificate_read import BAD_OUTCOMES, OUTCOMES, clause_key
from .report import OUTCOME_HEADINGS, ClauseRow, clause_rows, facts, margin_text, not_run, percent, tests_with

SCALE_MAX = 1.25  # the chart's x axis runs from 0 to 125 % of the bound
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
VERDICT_COLOURS = {"conformant": "#2b8a3e", "conformant-with-expected-failures": "#1971c2", "partial": "#e67700",
                   "incomplete": "#e67700", "inconclusive": "#e67700", "not-conformant": "#c92a2a"}
LEGEND = [("#2f9e44", "under 50 % of the bound"), ("#f59f00", "50 to 90 %"), ("#e8590c", "90 to 100 %"),
          ("#c92a2a", "outside the bound, or elements differ"), ("#868e96", "compared bitwise only, no element differs")]

CSS = """
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:#212529;margin:24px auto;max-width:1100px;padding:0 16px}
h1{font-size:22px;margin:0 0 6px}h2{font-size:17px;margin:28px 0 8px;border-bottom:1px solid #dee2e6;padding-bottom:4px}
.verdict{display:inline-block;color:#fff;border-radius:4px;padding:3px 10px;font-weight:600}
.reason{margin:6px 0 14px;color:#495057}
table{border-collapse:collapse;margin:6px 0}th,td{border:1px solid #dee2e6;padding:3px 8px;vertical-align:top;text-align:left}
th{background:#f1f3f5}table.facts th{background:none;border:none;color:#868e96;font-weight:500;padding-right:14px;white-space:nowrap}
table.facts td{border:none}td.n{text-align:right;font-variant-numeric:tabular-nums}td.zero{color:#ced4da}
td.bad{color:#c92a2a;font-weight:700}code{font:12px ui-monospace,"DejaVu Sans Mono",monospace;word-break:break-all}
.legend span{display:inline-block;margin-right:16px;font-size:12px}.sw{display:inline-block;width:11px;height:11px;margin-right:5px;vertical-align:-1px;border-radius:2px}
.m-green{color:#2b8a3e}.m-amber{color:#c77700}.m-orange{color:#d9480f}.m-red{color:#c92a2a;font-weight:700}.m-grey{color:#868e96}
.nowrap{white-space:nowrap}.small{font-size:12px;color:#868e96}svg{display:block;margin:8px 0}
"""


def esc(value) -> str:
    """``value`` as HTML/XML text: entities escaped, control characters made visible."""
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))
    return _html.escape(text, quote=True)


def colour(used) -> str:
    """Fill colour for a share of a bound used (None: outside the bound)."""
    if used is None or used > 1:
        return "#c92a2a"
    return "#2f9e44" if used < 0.5 else "#f59f00" if used < 0.9 else "#e8590c"


def _css_class(row: ClauseRow) -> str:
    c = row.closeness
    if c is None:
        return "m-red" if row.bitwise_differing else "m-grey"
    return {"#2f9e44": "m-green", "#f59f00": "m-amber", "#e8590c": "m-orange"}.get(colour(c if c <= 1 else None), "m-red")


def _chart_order(row: ClauseRow) -> tuple:
    c = row.closeness
    if c is not None:
        return (0 if c > 1 else 1, -c, clause_key(row.clause))
    return (0 if row.bitwise_differing else 2, -row.bitwise_differing, clause_key(row.clause))


def margin_chart(rows: list) -> str:
    """Inline SVG: one row per clause with a recorded comparison, closest to its bound first."""
    shown = sorted((r for r in rows if r.closeness is not None or r.bitwise_total), key=_chart_order)
    label_w, bar_x, bar_w, row_h, top = 64, 72, 520, 20, 26
    value_x = bar_x + bar_w + 24
    width, height = value_x + 420, top + row_h * max(len(shown), 1) + 8

    def x_of(used):
        return bar_x + bar_w * min(used, SCALE_MAX) / SCALE_MAX

    out = [f'<svg width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
           f'aria-label="worst share of its bound used, per clause" font-family="DejaVu Sans, Arial, sans-serif" font-size="12">']
    out += [f'<rect x="0" y="{top + k * row_h}" width="{width}" height="{row_h}" fill="#f8f9fa"/>' for k in range(0, len(shown), 2)]
    for i in range(6):  # 0, 25, ..., 125 %
        x = x_of(i * 0.25)
        out.append(f'<line x1="{x:.1f}" y1="{top - 4}" x2="{x:.1f}" y2="{height - 6}" stroke="#dee2e6"/>')
        out.append(f'<text x="{x:.1f}" y="{top - 9}" text-anchor="middle" fill="#868e96">{i * 25} %</text>')
    bound = x_of(1.0)
    out.append(f'<line x1="{bound:.1f}" y1="{top - 4}" x2="{bound:.1f}" y2="{height - 6}" stroke="#c92a2a" '
               f'stroke-width="1.5" stroke-dasharray="5 3"/>')
    out.append(f'<text x="{value_x}" y="{top - 9}" fill="#868e96">worst margin used, comparison</text>')
    for k, row in enumerate(shown):
        y = top + k * row_h
        how, test, what = margin_text(row)
        tip = f"clause {row.clause}: {how}" + (f" in {test} ({what})" if test else "")
        out.append(f"<g><title>{esc(tip)}</title>")
        out.append(f'<text x="{label_w}" y="{y + 14}" text-anchor="end" font-weight="600">{esc(_shorten(row.clause, 10))}</text>')
        used = row.closeness
        if used is not None:
            fill = colour(None if used > 1 else used)
            end = x_of(used)
            out.append(f'<rect x="{bar_x}" y="{y + 4}" width="{max(end - bar_x, 1.5):.1f}" height="12" rx="2" fill="{fill}"/>')
            if used > SCALE_MAX:  # clipped: an arrow head says the bar goes on
                out.append(f'<path d="M{end:.1f} {y + 2} l8 8 l-8 8 z" fill="{fill}"/>')
        else:
            fill = "#c92a2a" if row.bitwise_differing else "#868e96"
            out.append(f'<circle cx="{bar_x + 5}" cy="{y + 10}" r="4.5" fill="{fill}"/>')
        value = how if used is None else "outside its bound" if used == float("inf") else percent(used)
        detail = _shorten(what, 52 - len(value))
        out.append(f'<text x="{value_x}" y="{y + 14}"><tspan fill="{fill if fill != "#2f9e44" else "#2b8a3e"}" font-weight="600">'
                   f'{esc(value)}</tspan>' + (f'<tspan fill="#868e96"> {esc(detail)}</tspan>' if detail else "") + "</text></g>")
    out.append("</svg>")
    return "\n".join(out)


def _shorten(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "\u2026"


def _table(header, rows, cls="") -> str:
    head = "".join(f"<th>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(r) + "</tr>" for r in rows)
    opening = f'<table class="{cls}">' if cls else "<table>"
    return f"{opening}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _count_cell(outcome: str, n: int) -> str:
    cls = "n zero" if n == 0 else "n bad" if outcome in BAD_OUTCOMES else "n"
    return f'<td class="{cls}">{n}</td>'


def _tests_table(tests, with_outcome: bool) -> str:
    header = ["test"] + (["outcome"] if with_outcome else []) + ["clauses", "reason"]
    rows = [[f"<td><code>{esc(t['id'])}</code></td>"] + ([f"<td>{esc(t['outcome'])}</td>"] if with_outcome else [])
            + [f"<td>{esc(', '.join(map(str, t.get('clauses') or [])))}</td>",
               "<td>" + "<br>".join(esc(line) for line in str(t.get("reason") or "").splitlines()) + "</td>"] for t in tests]
    return _table(header, rows)


def _not_run_section(cert: dict) -> str:
    missing = not_run(cert)
    if not missing:
        return ""
    return (f"<h2>Did not run here ({len(missing)})</h2>"
            "<p>Too few ranks or devices for these scenarios, so the run cannot be conformant (SPEC 4.4.2):</p>"
            + _table(["test", "why"], [[f"<td><code>{esc(e['id'])}</code></td>", f"<td>{esc(e.get('reason') or '')}</td>"]
                                       for e in missing]))


def html(cert: dict, source: str = "") -> str:
    impl, verdict = cert["implementation"], cert["verdict"]
    title = f"Gefen conformance: {impl['name']} {impl.get('version') or ''}".strip()
    rows = clause_rows(cert)
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">',
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'\">",
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        f'<span class="verdict" style="background:{VERDICT_COLOURS[verdict]}">{esc(verdict)}</span>',
        f'<div class="reason">{esc(cert.get("verdict_reason") or "")}</div>',
        _not_run_section(cert),
        _table(["", ""], [[f"<th>{esc(k)}</th>", f"<td>{esc(v)}</td>"] for k, v in facts(cert)[1:]], "facts").replace(
            "<thead><tr><th></th><th></th></tr></thead>", ""),
        "<h2>Margins per clause</h2>",
        '<p class="small">The worst share of its bound any tolerance comparison of the clause used, closest to '
        "the bound first (100 % = at the bound, dashed line). Hover a row for the test.</p>",
        '<div class="legend">' + "".join(f'<span><i class="sw" style="background:{c}"></i>{esc(t)}</span>' for c, t in LEGEND) + "</div>",
        margin_chart(rows),
    ]
    silent = [r.clause for r in rows if r.closeness is None and not r.bitwise_total]
    if silent:
        parts.append(f'<p class="small">No comparison recorded (not shown): {esc(", ".join(silent))}</p>')
    parts.append("<h2>Clauses</h2>")
    table_rows = []
    for r in rows:
        how, test, what = margin_text(r)
        table_rows.append([f"<td>{esc(r.clause)}</td>"] + [_count_cell(o, r.counts[o]) for o in OUTCOMES]
                          + [f'<td class="nowrap {_css_class(r)}">{esc(how)}</td>',
                             f"<td><code>{esc(test)}</code> {esc(what)}</td>" if test else "<td></td>"])
    parts.append(_table(["clause"] + [OUTCOME_HEADINGS[o] for o in OUTCOMES] + ["worst margin used", "in test"], table_rows))
    for title_, tests, with_outcome in (("Failed tests", tests_with(cert, BAD_OUTCOMES), True),
                                        ("Expected failures", tests_with(cert, {"xfailed"}), False)):
        if tests:
            parts += [f"<h2>{title_} ({len(tests)})</h2>", _tests_table(tests, with_outcome)]
    skips = cert.get("capability_skips") or {}
    if skips:
        parts += ["<h2>Skipped for a missing capability</h2>",
                  _table(["capability", "tests skipped"], [[f"<td>{esc(k)}</td>", f'<td class="n">{esc(v)}</td>'] for k, v in sorted(skips.items())])]
    for heading, items in (("Stale expected-failure entries", cert.get("stale_expected_failures") or []), ("Notes", cert.get("notes") or [])):
        if items:
            parts += [f"<h2>{heading}</h2>", "<ul>" + "".join(f"<li>{esc(i)}</li>" for i in items) + "</ul>"]
    parts.append(f'<p class="small">{esc(cert["schema"])}' + (f", from {esc(source)}" if source else "") + "</p></body></html>")
    return "\n".join(parts) + "\n"
