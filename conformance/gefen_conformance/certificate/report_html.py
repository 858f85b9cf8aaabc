"""A certificate as one self-contained HTML page, failures first, with a chart of margins per clause (SPEC
4.5).

:func:`html` returns a complete page in the order of :mod:`gefen_conformance.certificate.report`:
the verdict and the rules line under it, what did not pass (each with its clauses, reason, rank
locations and rerun command), the expected failures (blue, apart from the failures' red),
:func:`margin_chart`, then what was certified, the rules by status and the per-clause table. The
chart has one row per clause, or per group of clauses that share the same worst comparison: a bar
for the worst share of a tolerance bound used on a scale of 0 to 125 % (the bound dashed; a failed
comparison runs past it), a marker for a failure without a comparison, an expected failure,
bitwise-only and exact-only clauses; the comparison and its test are written under the bar, so
nothing needs a hover. Everything is plain HTML with inline CSS that reflows from a phone's width
up, so the page never scrolls sideways (tests/test_report_browser.py measures it in Chromium at 800
and 1400 px).

The markup is Jinja2 templates shipped in the package: ``templates/report.html.j2`` (the page),
``templates/report_parts.html.j2`` (its parts, as macros) and ``templates/report.css``. This module
decides what the page shows (colours, widths, labels); the templates lay it out.

The page needs nothing outside itself: inline CSS only, no scripts, no external references, and a
Content-Security-Policy that forbids loading anything. The templates autoescape every value, and
every string taken from the certificate first has its C0 control characters shown as ``\\xNN``,
so user-controlled names and reasons cannot inject markup.
"""

from __future__ import annotations

import functools
import re

import jinja2

from gefen_conformance.certificate import rules
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
    rule_rows,
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
#: The clause table's column heading per outcome, the outcome's name its tooltip.
SHORT_OUTCOMES = {
    "passed": "pass",
    "failed": "fail",
    "error": "err",
    "skipped": "skip",
    "xfailed": "xfail",
    "xpassed": "xpass",
}
#: A chart row that is a marker, not a bar: its colour and what it says.
MARKERS = {
    "outside": ("#c92a2a", "failed: outside its bound"),
    "failed": ("#c92a2a", "failed without a numeric comparison"),
    "xfailed": ("#1971c2", "expected failure"),
    "checked": ("#868e96", "passed: exact checks, no numeric comparison"),
    "skipped": ("#e67700", "no test of these clauses ran"),
}


def visible(value):
    """``value`` as text with its control characters shown as ``\\xNN`` (markup the templates made
    themselves passes unchanged); the templates' autoescaping then escapes it."""
    if hasattr(value, "__html__"):
        return value
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))


@functools.cache
def _templates() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.PackageLoader("gefen_conformance.certificate", "templates"),
        autoescape=True,
        finalize=visible,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )


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


def _chart_row(row: ChartRow) -> dict:
    """What one chart row shows: clause labels, a bar or a marker, and the comparison written out."""
    label = (
        ", ".join(row.clauses)
        if len(row.clauses) <= 6
        else f"{', '.join(row.clauses[:5])} +{len(row.clauses) - 5}"
    )
    shown = {"label": label, "title": ", ".join(row.clauses), "bar": row.kind == "margin"}
    if row.kind == "margin":
        used = row.used or 0.0
        fill = colour(None if used > 1 else used)
        width = 100.0 * min(used, SCALE_MAX) / SCALE_MAX
        value = percent(used) + (" of the bound: outside it" if used > 1 else " of the bound")
        shown.update(width=f"{max(width, 0.6):.2f}", clipped=used > SCALE_MAX, value=value)
    elif row.kind == "bitwise":
        fill = "#c92a2a" if row.bitwise_differing else "#868e96"
        marker = f"bitwise: {row.bitwise_differing:,} of {row.bitwise_total:,} elements differ"
        shown.update(marker=marker)
    else:
        fill, marker = MARKERS[row.kind]
        shown.update(marker=marker)
    what = row.what if row.what and row.kind not in ("xfailed", "checked", "skipped", "failed") else ""
    return {**shown, "fill": fill, "what": what, "test": row.test}


def _problem(p) -> dict:
    return {
        "kind": p.kind,
        "colour": KIND_COLOURS[p.kind],
        "heading": PROBLEM_KINDS[p.kind],
        "test": p.test,
        "clauses": ", ".join(p.clauses) or "none named",
        "reason": p.reason,
        "where": p.where,
        "input": p.input,
        "replay": p.replay() if p.replayable else "",
        "rerun": p.rerun,
    }


def _count_class(outcome: str, n: int) -> str:
    return "n zero" if n == 0 else "n bad" if outcome in BAD_OUTCOMES else "n"


def _clause_row(r) -> dict:
    how, test, what = margin_text(r)
    counts = [(r.counts[o], _count_class(o, r.counts[o])) for o in OUTCOMES]
    return dict(clause=r.clause, counts=counts, margin_class=_css_class(r), how=how, test=test, what=what)


def margin_chart(rows: list) -> str:
    """Every clause in one chart (rows from :func:`gefen_conformance.certificate.report_model.chart_rows`)."""
    parts = _templates().get_template("report_parts.html.j2").module
    return str(parts.margin_chart([_chart_row(r) for r in rows]))


def html(cert: dict, source: str = "") -> str:
    impl, verdict = cert["implementation"], cert["verdict"]
    stale = list(cert.get("stale_expected_failures") or []) + [
        f"expectation {e.get('test')}: {e.get('reason')}"
        for e in (cert.get("expectations") or {}).get("stale") or []
    ]
    page = _templates().get_template("report.html.j2")
    return page.render(
        title=f"Gefen conformance: {impl['name']} {impl.get('version') or ''}".strip(),
        verdict=verdict,
        verdict_colour=VERDICT_COLOURS[verdict],
        reason=cert.get("verdict_reason") or "",
        rules_line=rules.line(cert),
        rules=rule_rows(cert),
        problems=[_problem(p) for p in not_passed(cert)],
        expected=[_problem(p) for p in not_passed(cert, expected=True)],
        legend=LEGEND,
        chart=[_chart_row(r) for r in chart_rows(cert)],
        facts=facts(cert, tolerances=False)[1:],
        bounds=tolerance_lines(cert.get("profile")),
        outcomes=[(OUTCOME_HEADINGS[o], SHORT_OUTCOMES[o]) for o in OUTCOMES],
        clauses=[_clause_row(r) for r in clause_rows(cert)],
        skips=sorted((cert.get("capability_skips") or {}).items()),
        lists=[("Stale expected-failure entries", stale), ("Notes", cert.get("notes") or [])],
        schema=cert["schema"],
        source=source,
    )
