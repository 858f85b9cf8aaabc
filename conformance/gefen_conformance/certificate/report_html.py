"""A certificate as one self-contained HTML page, failures first, with a chart of margins per clause (SPEC
4.5).

:func:`html` returns a complete page in the order of :mod:`gefen_conformance.certificate.report`: the verdict,
what did not pass (each with its clauses, reason, rank locations and rerun command), the expected
failures (blue, apart from the failures' red), :func:`margin_chart`, then what was certified and
the per-clause table. The chart has one row per clause, or per group of clauses that share the
same worst comparison: a bar for the worst share of a tolerance bound used on a scale of 0 to
125 % (the bound dashed; a failed comparison runs past it), a marker for a failure without a
comparison, an expected failure, bitwise-only and exact-only clauses; the comparison and its test
are written under the bar, so nothing needs a hover. Everything is plain HTML with inline CSS that
reflows from a phone's width up, so the page never scrolls sideways (tests/test_report_browser.py
measures it in Chromium at 800 and 1400 px).

The page needs nothing outside itself: inline CSS only, no scripts, no external references, and a
Content-Security-Policy that forbids loading anything. All text taken from the certificate is
entity-escaped (C0 control characters are shown as ``\\xNN``), so user-controlled names and
reasons cannot inject markup.
"""

from __future__ import annotations

import html as _html
import re

from gefen_conformance.certificate.problems import PROBLEM_KINDS, not_passed
from gefen_conformance.certificate.read import BAD_OUTCOMES, OUTCOMES
from gefen_conformance.certificate.report_model import (
    OUTCOME_HEADINGS,
    ChartRow,
    chart_rows,
    clause_rows,
    facts,
    margin_text,
    percent,
    tolerance_lines,
)

SCALE_MAX = 1.25  # the chart's axis runs from 0 to 125 % of the bound
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
VERDICT_COLOURS = {
    "conformant": "#2b8a3e",
    "conformant-with-expected-failures": "#1971c2",
    "partial": "#e67700",
    "incomplete": "#e67700",
    "inconclusive": "#e67700",
    "not-conformant": "#c92a2a",
}
#: Failures red, expected failures blue, runs that did not happen amber: never the same colour.
KIND_COLOURS = {
    "failed": "#c92a2a",
    "error": "#c92a2a",
    "xpassed": "#c92a2a",
    "not-run": "#e67700",
    "xfailed": "#1971c2",
}
LEGEND = [
    ("#2f9e44", "under 50 % of the bound"),
    ("#f59f00", "50 to 90 %"),
    ("#e8590c", "90 to 100 %"),
    ("#c92a2a", "failed: outside the bound, elements differ, or no comparison"),
    ("#1971c2", "expected failure"),
    ("#868e96", "bitwise equal, or exact checks only"),
]

CSS = """
*{box-sizing:border-box}
body{font:14px/1.45 system-ui,-apple-system,"Segoe UI",Roboto,"DejaVu Sans",sans-serif;color:#212529;
margin:20px auto;max-width:1100px;padding:0 14px;overflow-wrap:anywhere}
h1{font-size:21px;margin:0 0 6px}
h2{font-size:17px;margin:24px 0 8px;border-bottom:1px solid #dee2e6;padding-bottom:4px}
.verdict{display:inline-block;color:#fff;border-radius:4px;padding:3px 10px;font-weight:600}
.reason{margin:6px 0 12px;color:#495057}
code,pre{font:12px/1.4 ui-monospace,"DejaVu Sans Mono",monospace;overflow-wrap:anywhere;word-break:break-all}
pre{white-space:pre-wrap;background:#f1f3f5;border-radius:3px;padding:4px 8px;margin:4px 0 0}
ol.problems{list-style:none;padding:0;margin:0}
ol.problems li{border-left:5px solid;padding:6px 10px;margin:0 0 8px;background:#fff5f5}
ol.problems li.k-xfailed{background:#e7f5ff}ol.problems li.k-not-run{background:#fff9db}
.kind{font-weight:700;text-transform:uppercase;font-size:12px;letter-spacing:.03em;margin-right:6px}
.clauses{color:#495057;font-size:12px}.where{font-size:12px;color:#495057}
.chart{margin:8px 0}
.crow{display:grid;grid-template-columns:minmax(4.5em,9em) minmax(0,1fr);gap:2px 10px;padding:4px 0;
border-bottom:1px solid #f1f3f5}
.clab{font-weight:600;text-align:right}
.track{position:relative;height:14px;background:#f1f3f5;border-radius:2px}
.bar{position:absolute;left:0;top:1px;height:12px;border-radius:2px}
.bound{position:absolute;top:-3px;bottom:-3px;left:80%;border-left:2px dashed #c92a2a}
.clipped{position:absolute;right:-2px;top:-1px;font-weight:700;font-size:12px;line-height:16px}
.marker{display:inline-block;width:11px;height:11px;border-radius:50%;vertical-align:-1px;margin-right:5px}
.cdesc{grid-column:2;font-size:12px;color:#495057}
.axis{display:flex;justify-content:space-between;font-size:11px;color:#868e96;width:100%}
.legend span{display:inline-block;margin-right:14px;font-size:12px}
.sw{display:inline-block;width:11px;height:11px;margin-right:5px;vertical-align:-1px;border-radius:2px}
table{border-collapse:collapse;margin:6px 0;width:100%}
th,td{border:1px solid #dee2e6;padding:3px 6px;vertical-align:top;text-align:left}
th{background:#f1f3f5}
table.facts th{background:none;border:none;color:#868e96;font-weight:500;padding-right:14px;width:1%;
white-space:nowrap}
table.facts td{border:none}td.n{text-align:right;font-variant-numeric:tabular-nums;width:1%}
td.zero{color:#ced4da}
td.bad{color:#c92a2a;font-weight:700}
.m-green{color:#2b8a3e}.m-amber{color:#c77700}.m-orange{color:#d9480f}.m-red{color:#c92a2a;font-weight:700}
.m-grey{color:#868e96}
details{margin:6px 0}summary{cursor:pointer;color:#495057}.small{font-size:12px;color:#868e96}
@media (max-width:700px){.crow{grid-template-columns:minmax(0,1fr)}.clab{text-align:left}.cdesc{grid-column:1}
}
"""


def esc(value) -> str:
    """``value`` as HTML text: entities escaped, control characters made visible."""
    text = _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))
    return _html.escape(text, quote=True)


def colour(used) -> str:
    """Fill colour for a share of a bound used (None: outside the bound)."""
    if used is None or used > 1:
        return "#c92a2a"
    return "#2f9e44" if used < 0.5 else "#f59f00" if used < 0.9 else "#e8590c"


def _css_class(row) -> str:
    c = row.closeness
    if c is None:
        return "m-red" if row.bitwise_differing else "m-grey"
    return {"#2f9e44": "m-green", "#f59f00": "m-amber", "#e8590c": "m-orange"}.get(
        colour(c if c <= 1 else None), "m-red"
    )


def _chart_row(row: ChartRow) -> str:
    """One chart row: clause labels, a bar or a marker, and the comparison written out."""
    label = (
        ", ".join(row.clauses)
        if len(row.clauses) <= 6
        else f"{', '.join(row.clauses[:5])} +{len(row.clauses) - 5}"
    )
    title = ", ".join(row.clauses)
    if row.kind == "margin":
        used = row.used or 0.0
        fill = colour(None if used > 1 else used)
        width = 100.0 * min(used, SCALE_MAX) / SCALE_MAX
        clipped = f'<span class="clipped" style="color:{fill}">&#9654;</span>' if used > SCALE_MAX else ""
        graphic = (
            '<div class="track"><div class="bar" '
            f'style="width:{max(width, 0.6):.2f}%;background:{fill}"></div>'
            f'<div class="bound"></div>{clipped}</div>'
        )
        value = percent(used) + (" of the bound: outside it" if used > 1 else " of the bound")
    else:
        fill, value = {
            "outside": ("#c92a2a", "failed: outside its bound"),
            "failed": ("#c92a2a", "failed without a numeric comparison"),
            "xfailed": ("#1971c2", "expected failure"),
            "bitwise": (
                "#c92a2a" if row.bitwise_differing else "#868e96",
                f"bitwise: {row.bitwise_differing:,} of {row.bitwise_total:,} elements differ",
            ),
            "checked": ("#868e96", "passed: exact checks, no numeric comparison"),
            "skipped": ("#e67700", "no test of these clauses ran"),
        }[row.kind]
        graphic = (
            f'<div><i class="marker" style="background:{fill}"></i><b '
            f'style="color:{fill}">{esc(value)}</b></div>'
        )
        value = ""
    described = [f'<b style="color:{fill}">{esc(value)}</b>'] if value else []
    if row.what and row.kind not in ("xfailed", "checked", "skipped", "failed"):
        described.append(esc(row.what))
    if row.test:
        described.append(f"<code>{esc(row.test)}</code>")
    desc = f'<div class="cdesc">{" &middot; ".join(described)}</div>' if described else ""
    return f'<div class="crow"><div class="clab" title="{esc(title)}">{esc(label)}</div>{graphic}{desc}</div>'


def margin_chart(rows: list) -> str:
    """Every clause in one chart (rows from :func:`gefen_conformance.certificate.report.chart_rows`)."""
    axis = "".join(f"<span>{i * 25} %</span>" for i in range(6))
    head = f'<div class="crow"><div class="clab small">clauses</div><div class="axis">{axis}</div></div>'
    return (
        f'<div class="chart" role="figure" aria-label="worst share of its bound used, per clause">{head}'
        + "".join(_chart_row(r) for r in rows)
        + "</div>"
    )


def _problem(p) -> str:
    colour_ = KIND_COLOURS[p.kind]
    where = "".join(f'<div class="where">{esc(w)}</div>' for w in p.where)
    if p.input:
        where += f'<div class="where">input: {esc(p.input)}</div>'
    if p.replayable:
        where += f"<pre>{esc(p.replay())}</pre>"
    return (
        f'<li class="k-{p.kind}" style="border-color:{colour_}"><span class="kind" style="color:{colour_}">'
        f"{esc(PROBLEM_KINDS[p.kind])}</span><code>{esc(p.test)}</code>"
        f'<div class="clauses">clauses {esc(", ".join(p.clauses) or "none named")}</div>'
        f"<div>{esc(p.reason)}</div>{where}<pre>{esc(p.rerun)}</pre></li>"
    )


def _table(header, rows, cls="") -> str:
    head = "".join(f"<th>{h}</th>" for h in header)
    body = "".join("<tr>" + "".join(r) + "</tr>" for r in rows)
    opening = f'<table class="{cls}">' if cls else "<table>"
    return f"{opening}<thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _count_cell(outcome: str, n: int) -> str:
    cls = "n zero" if n == 0 else "n bad" if outcome in BAD_OUTCOMES else "n"
    return f'<td class="{cls}">{n}</td>'


def html(cert: dict, source: str = "") -> str:
    impl, verdict = cert["implementation"], cert["verdict"]
    title = f"Gefen conformance: {impl['name']} {impl.get('version') or ''}".strip()
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        '<meta http-equiv="Content-Security-Policy" content="default-src \'none\'; style-src '
        "'unsafe-inline'\">",
        '<meta name="viewport" content="width=device-width, initial-scale=1">',
        f"<title>{esc(title)}</title><style>{CSS}</style></head><body>",
        f"<h1>{esc(title)}</h1>",
        f'<span class="verdict" style="background:{VERDICT_COLOURS[verdict]}">{esc(verdict)}</span>',
        f'<div class="reason">{esc(cert.get("verdict_reason") or "")}</div>',
    ]
    problems, expected = not_passed(cert), not_passed(cert, expected=True)
    if problems:
        parts += [
            f'<h2 id="not-passed">Did not pass ({len(problems)})</h2>',
            '<ol class="problems">' + "".join(_problem(p) for p in problems) + "</ol>",
        ]
    if expected:
        parts += [
            f'<h2 id="expected">Expected failures ({len(expected)})</h2>',
            '<ol class="problems">' + "".join(_problem(p) for p in expected) + "</ol>",
        ]
    parts += [
        "<h2>Margins per clause</h2>",
        '<p class="small">Per clause, the worst share of its bound any tolerance comparison used (100 '
        "% = at the "
        "bound, dashed), closest to failing first; clauses that share a comparison share a row.</p>",
        '<div class="legend">'
        + "".join(f'<span><i class="sw" style="background:{c}"></i>{esc(t)}</span>' for c, t in LEGEND)
        + "</div>",
        margin_chart(chart_rows(cert)),
        "<h2>What was certified</h2>",
    ]
    parts.append(
        _table(
            ["", ""],
            [[f"<th>{esc(k)}</th>", f"<td>{esc(v)}</td>"] for k, v in facts(cert, tolerances=False)[1:]],
            "facts",
        ).replace("<thead><tr><th></th><th></th></tr></thead>", "")
    )
    bounds = tolerance_lines(cert.get("profile"))
    if bounds:
        parts.append(
            f"<details><summary>Every bound the profile applies ({len(bounds)})</summary><ul>"
            + "".join(f"<li>{esc(line)}</li>" for line in bounds)
            + "</ul></details>"
        )
    parts.append("<h2>Clauses</h2>")
    table_rows = []
    for r in clause_rows(cert):
        how, test, what = margin_text(r)
        table_rows.append(
            [f"<td>{esc(r.clause)}</td>"]
            + [_count_cell(o, r.counts[o]) for o in OUTCOMES]
            + [
                f'<td class="{_css_class(r)}">{esc(how)}</td>',
                f"<td><code>{esc(test)}</code> {esc(what)}</td>" if test else "<td></td>",
            ]
        )
    short = {
        "passed": "pass",
        "failed": "fail",
        "error": "err",
        "skipped": "skip",
        "xfailed": "xfail",
        "xpassed": "xpass",
    }
    parts.append(
        _table(
            ["clause"]
            + [f'<abbr title="{OUTCOME_HEADINGS[o]}">{short[o]}</abbr>' for o in OUTCOMES]
            + ["worst margin used", "in test"],
            table_rows,
        )
    )
    skips = cert.get("capability_skips") or {}
    if skips:
        parts += [
            "<h2>Skipped for a missing capability</h2>",
            _table(
                ["capability", "tests skipped"],
                [[f"<td>{esc(k)}</td>", f'<td class="n">{esc(v)}</td>'] for k, v in sorted(skips.items())],
            ),
        ]
    for heading, items in (
        (
            "Stale expected-failure entries",
            list(cert.get("stale_expected_failures") or [])
            + [
                f"expectation {e.get('test')}: {e.get('reason')}"
                for e in (cert.get("expectations") or {}).get("stale") or []
            ],
        ),
        ("Notes", cert.get("notes") or []),
    ):
        if items:
            parts += [f"<h2>{heading}</h2>", "<ul>" + "".join(f"<li>{esc(i)}</li>" for i in items) + "</ul>"]
    parts.append(
        f'<p class="small">{esc(cert["schema"])}'
        + (f", from {esc(source)}" if source else "")
        + "</p></body></html>"
    )
    return "\n".join(parts) + "\n"
