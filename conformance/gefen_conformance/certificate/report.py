"""A certificate as a document people read: Markdown for pull requests, HTML for publishing (SPEC 4.5).

:func:`render` turns a checked schema-2 certificate (SPEC 4.4, :mod:`gefen_conformance.certificate.read`)
into Markdown (``"md"``) or one self-contained HTML page (``"html"``,
:mod:`gefen_conformance.certificate.report_html`).
Both lead with what did not pass (:func:`gefen_conformance.certificate.problems.not_passed`: failed, errored
and unexpectedly passing
tests, and tests that did not run for lack of ranks or devices), each with its clauses, its one-line
reason, where a rank failed, and the command that reruns exactly that test;
then the expected failures, apart; then the margins per clause; then what was certified (identity,
profile and tolerances, execution, suite, platform, completeness), the SPEC's rules by status, the
per-clause table, capability skips, stale expected-failure entries and notes. The rules line
(:func:`gefen_conformance.certificate.rules.line`) stands under the verdict: the verdict says no
test failed, the rules line how much of the SPEC those tests check.

Every string taken from the certificate is escaped for the target format (a Markdown table cell
keeps ``|`` and line breaks inside the cell; HTML gets entity-escaped text); nothing from the
certificate is ever emitted as markup.

The content model (:func:`facts`, :func:`rule_rows`, :func:`clause_rows`, :func:`chart_rows`,
:func:`margin_text`, and
:mod:`~gefen_conformance.certificate.problems`) is shared by both formats.
"""

from __future__ import annotations

import re

from gefen_conformance.certificate import report_model as model
from gefen_conformance.certificate import rules
from gefen_conformance.certificate.problems import PROBLEM_KINDS, not_passed
from gefen_conformance.certificate.read import OUTCOMES
from gefen_conformance.certificate.report_html import html


def render(cert: dict, fmt: str, source: str = "") -> str:
    """``cert`` as ``"md"`` or ``"html"``; ``source`` (the file it came from) is shown in a footer."""
    if fmt == "md":
        return markdown(cert, source)
    if fmt == "html":
        return html(cert, source)
    raise ValueError(f"unknown report format {fmt!r} (known: md, html)")


# --- Markdown ------------------------------------------------------------------------------------

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# ">" stays: it only quotes at the start of a line, and cell or list text never starts one
_MD_SPECIAL = {c: "\\" + c for c in "\\`*_[]|#"} | {"<": "&lt;", "&": "&amp;"}


def md_text(value) -> str:
    """``value`` as inert Markdown text that stays inside one table cell."""
    text = "".join(
        _MD_SPECIAL.get(ch, ch) for ch in _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", str(value))
    )
    return "<br>".join(line.strip() for line in text.replace("\r\n", "\n").replace("\r", "\n").split("\n"))


def md_code(value) -> str:
    """``value`` as a code span inside a table cell (fenced past any backticks it holds)."""
    text = " ".join(_CONTROL.sub("?", str(value)).split()).replace("|", "\\|")
    fence = "`" * (_longest_backticks(text) + 1)
    return f"{fence} {text} {fence}" if text else ""


def _longest_backticks(text: str) -> int:
    longest = current = 0
    for ch in text:
        current = current + 1 if ch == "`" else 0
        longest = max(longest, current)
    return longest


def _md_table(header, rows) -> list:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)] + [
        "| " + " | ".join(r) + " |" for r in rows
    ]


def _md_problems(problems) -> list:
    rows = []
    for p in problems:
        reason = md_text(p.reason) + "".join(f"<br>{md_text(w)}" for w in p.where)
        if p.input:
            reason += f"<br>input: {md_text(p.input)}"
        rows.append(
            [
                md_text(PROBLEM_KINDS[p.kind]),
                md_code(p.test),
                md_text(", ".join(p.clauses)),
                reason,
                md_code(p.rerun),
            ]
        )
    return _md_table(["", "test", "clauses", "reason", "rerun"], rows)


def markdown(cert: dict, source: str = "") -> str:
    impl = cert["implementation"]
    out = [
        f"# Gefen conformance: {md_text(impl['name'])} {md_text(impl.get('version') or '')}".rstrip(),
        "",
        f"**Verdict: {md_text(cert['verdict'])}**"
        + (f": {md_text(cert['verdict_reason'])}" if cert.get("verdict_reason") else ""),
        "",
        # what the verdict covers, always beside it
        f"**{md_text(rules.line(cert))}**",
        "",
    ]
    problems, expected = not_passed(cert), not_passed(cert, expected=True)
    if problems:
        out += [f"## Did not pass ({len(problems)})", ""] + _md_problems(problems) + [""]
    if expected:
        out += [f"## Expected failures ({len(expected)})", ""] + _md_problems(expected) + [""]
    out += ["## What was certified", ""]
    out += _md_table(["", ""], [[md_text(k), md_text(v)] for k, v in model.facts(cert)[1:]])
    listed = model.rule_rows(cert)
    if listed:
        out += ["", "## Rules by status", ""]
        out += _md_table(
            ["status", "rules", "ids"], [[md_text(h), str(n), md_text(ids)] for h, n, ids in listed]
        )
        out += ["", "A rule is certified when a test that names its id passed and none failed (SPEC 4.4.17)."]
    out += ["", "## Clauses named by tests", ""]
    rows = []
    for row in model.clause_rows(cert):
        how, test, what = model.margin_text(row)
        where = f"{md_code(test)} {md_text(what)}" if test else ""
        rows.append([md_text(row.clause)] + [str(row.counts[o]) for o in OUTCOMES] + [md_text(how), where])
    out += _md_table(
        ["clause"] + [model.OUTCOME_HEADINGS[o] for o in OUTCOMES] + ["worst margin used", "in test"], rows
    )
    out.append("")
    out.append(
        "The worst margin is the largest share of its bound a tolerance comparison used (100 % = at "
        "the bound)."
    )
    skips = cert.get("capability_skips") or {}
    if skips:
        out += ["", "## Skipped for a missing capability", ""]
        out += _md_table(
            ["capability", "tests skipped"], [[md_text(k), str(v)] for k, v in sorted(skips.items())]
        )
    stale = list(cert.get("stale_expected_failures") or [])
    stale += [
        f"expectation {e.get('test')}: {e.get('reason')}"
        for e in (cert.get("expectations") or {}).get("stale") or []
    ]
    if stale:
        out += ["", "## Stale expected-failure entries", ""] + [f"- {md_text(s)}" for s in stale]
    notes = cert.get("notes") or []
    if notes:
        out += ["", "## Notes", ""] + [f"- {md_text(n)}" for n in notes]
    out += ["", f"<sub>{cert['schema']}" + (f", from {md_text(source)}" if source else "") + "</sub>", ""]
    return "\n".join(out)
