"""A certificate as a document people read: Markdown for pull requests, HTML for publishing (SPEC 4.5).

:func:`render` turns a checked schema-2 certificate (SPEC 4.4, :mod:`gefen_conformance.certificate.read`)
into Markdown (``"md"``) or one self-contained HTML page (``"html"``,
:mod:`gefen_conformance.certificate.report_html`).
Both lead with what did not pass (:func:`gefen_conformance.certificate.problems.not_passed`: failed, errored
and unexpectedly passing
tests, and tests that did not run for lack of ranks or devices), each with its clauses, its one-line
reason, where a rank failed, and the command that reruns exactly that test;
then the expected failures, apart; then the margins per clause; then what was certified (identity,
profile and tolerances, execution, suite, platform, completeness), the per-clause table, capability
skips, stale expected-failure entries and notes.

Every string taken from the certificate is escaped for the target format (a Markdown table cell
keeps ``|`` and line breaks inside the cell; HTML gets entity-escaped text); nothing from the
certificate is ever emitted as markup.

The content model (:func:`facts`, :func:`clause_rows`, :func:`chart_rows`, :func:`margin_text`, and
:mod:`~gefen_conformance.certificate.problems`) is shared by both formats.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gefen_conformance.certificate.problems import PROBLEM_KINDS, not_passed
from gefen_conformance.certificate.read import (
    BAD_OUTCOMES,
    OUTCOMES,
    bitwise_margins,
    clause_key,
    finite_used,
    short_hash,
    tolerance_margins,
)

OUTCOME_HEADINGS = {
    "passed": "passed",
    "failed": "failed",
    "error": "errored",
    "skipped": "skipped",
    "xfailed": "expected failures",
    "xpassed": "unexpected passes",
}


@dataclass
class ClauseRow:
    """One clause: its outcome counts and the comparisons its tests recorded."""

    clause: str
    counts: dict
    worst: dict | None = None  # {"test", "what", "used"}: the largest finite share of a bound used
    outside: list = field(default_factory=list)  # (test, what) of tolerance comparisons that failed outright
    bitwise_total: int = 0  # elements compared bitwise by the clause's tests
    bitwise_differing: int = 0

    @property
    def closeness(self) -> float | None:
        """The share of its bound the clause came closest to (inf: outside it), None without tolerances."""
        if self.outside:
            return float("inf")
        return None if self.worst is None else self.worst["used"]


def render(cert: dict, fmt: str, source: str = "") -> str:
    """``cert`` as ``"md"`` or ``"html"``; ``source`` (the file it came from) is shown in a footer."""
    if fmt == "md":
        return markdown(cert, source)
    if fmt == "html":
        from gefen_conformance.certificate.report_html import html

        return html(cert, source)
    raise ValueError(f"unknown report format {fmt!r} (known: md, html)")


# --- content model -------------------------------------------------------------------------------


def _join(values) -> str:
    return ", ".join(str(v) for v in values)


def tolerance_lines(profile) -> list:
    """Every bound the profile applies, one ``path: value`` line each (nested objects flattened)."""
    if not isinstance(profile, dict):
        return []
    lines = []

    def walk(prefix, value):
        if isinstance(value, dict) and value and all(not isinstance(v, dict) for v in value.values()):
            lines.append(f"{prefix}: " + ", ".join(f"{k} {v}" for k, v in value.items()))
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(f"{prefix} {k}", v)
        else:
            lines.append(f"{prefix}: {value}")

    for key, value in profile.items():
        if key not in ("name", "reason"):
            walk(str(key), value)
    return lines


def facts(cert: dict, *, tolerances: bool = True) -> list:
    """``(label, text)`` pairs describing what was certified, where, with what, how completely
    (every bound of the profile too, unless ``tolerances`` is false)."""
    impl, profile = cert["implementation"], cert.get("profile") or {}
    suite, plat = cert.get("suite") or {}, cert.get("platform") or {}
    ex, run, summary = cert.get("execution") or {}, cert.get("run") or {}, cert["summary"]
    profile_name = profile.get("name", "?") if isinstance(profile, dict) else str(profile)
    rows = [
        (
            "verdict",
            f"{cert['verdict']}" + (f": {cert['verdict_reason']}" if cert.get("verdict_reason") else ""),
        ),
        ("implementation", f"{impl['name']} {impl.get('version') or '(no version)'}"),
        ("capabilities", _join(impl.get("capabilities") or []) or "none declared"),
        (
            "profile",
            profile_name
            + (f" ({profile['reason']})" if isinstance(profile, dict) and profile.get("reason") else ""),
        ),
    ]
    if tolerances:
        rows += [("tolerances" if i == 0 else "", line) for i, line in enumerate(tolerance_lines(profile))]
    devices = _join(ex.get("device_names") or [])
    rows.append(
        (
            "execution",
            ", ".join(
                p
                for p in (
                    f"{ex.get('device_type', '?')}" + (f" ({devices})" if devices else ""),
                    # schema 2 before SPEC 4.6 said distributed_backend
                    f"{ex.get('backend') or ex.get('distributed_backend')}"
                    if ex.get("backend") or ex.get("distributed_backend")
                    else "",
                    f"world size {ex['world_size']}" if ex.get("world_size") else "",
                    f"world sizes {_join(ex['world_sizes'])}" if ex.get("world_sizes") else "",
                    f"{ex['nodes']} node(s)" if ex.get("nodes") else "",
                    f"{ex['launcher']} launcher" if ex.get("launcher") else "",
                    f"warm-up {ex['warm_up_s']:g} s" if isinstance(ex.get("warm_up_s"), (int, float)) else "",
                    f"deadlines scaled {ex['deadline_scale']:g}x"
                    if isinstance(ex.get("deadline_scale"), (int, float)) and ex["deadline_scale"] != 1
                    else "",
                )
                if p
            ),
        )
    )
    git = suite.get("git")
    rows.append(
        (
            "suite",
            ", ".join(
                p
                for p in (
                    f"{suite.get('name', 'gefen-conformance')} {suite.get('version') or ''}".strip(),
                    f"content sha256 {short_hash(suite.get('content_sha256'))}"
                    if suite.get("content_sha256")
                    else "content hash unknown",
                    (f"git {short_hash(git.get('commit'))}" + (" (dirty)" if git.get("dirty") else ""))
                    if isinstance(git, dict)
                    else "not a git checkout",
                )
                if p
            ),
        )
    )
    rows.append(
        (
            "platform",
            ", ".join(f"{k} {plat[k]}" for k in ("torch", "python", "numpy", "os", "machine") if plat.get(k))
            + (f", {plat['cpu_count']} CPUs" if plat.get("cpu_count") else ""),
        )
    )
    rows.append(("run", _completeness(run)))
    if run.get("started"):
        rows.append(("", f"{run['started']} to {run.get('finished', '?')}"))
    hyp = run.get("hypothesis") or {}
    if hyp.get("profile"):
        rows.append(
            (
                "hypothesis",
                f"profile {hyp['profile']}"
                + (
                    f" ({', '.join(f'{k} {v}' for k, v in hyp['settings'].items())})"
                    if isinstance(hyp.get("settings"), dict)
                    else ""
                ),
            )
        )
    rows.append(("summary", ", ".join(f"{summary.get(o, 0)} {OUTCOME_HEADINGS[o]}" for o in OUTCOMES)))
    return rows


def _completeness(run: dict) -> str:
    if not run:
        return "completeness not recorded"
    parts = [f"{run.get('executed_tests', '?')} of {run.get('expected_tests', '?')} expected tests executed"]
    parts.append("complete" if run.get("complete") else "not complete")
    if run.get("interrupted"):
        parts.append("interrupted")
    if run.get("narrowed_by"):
        parts.append("narrowed by " + "; ".join(map(str, run["narrowed_by"])))
    if run.get("exit_status") is not None:
        parts.append(f"exit status {run['exit_status']}")
    return ", ".join(parts)


def clause_rows(cert: dict) -> list:
    """One :class:`ClauseRow` per clause, in numeric clause order."""
    rows = {c: ClauseRow(c, {o: int(v.get(o, 0) or 0) for o in OUTCOMES}) for c, v in cert["clauses"].items()}
    for c, v in cert["clauses"].items():
        worst = v.get("worst_margin")
        if isinstance(worst, dict) and finite_used(worst) is not None:
            rows[c].worst = {
                "test": str(worst.get("test", "")),
                "what": str(worst.get("what", "")),
                "used": finite_used(worst),
            }
    for test in cert["tests"]:
        for c in map(str, test.get("clauses") or []):
            row = rows.setdefault(c, ClauseRow(c, dict.fromkeys(OUTCOMES, 0)))
            for m in tolerance_margins(test):
                used = finite_used(m)
                if used is None:
                    row.outside.append((test["id"], str(m.get("what", ""))))
                elif "worst_margin" not in cert["clauses"].get(c, {}) and (
                    row.worst is None or used > row.worst["used"]
                ):
                    row.worst = {"test": test["id"], "what": str(m.get("what", "")), "used": used}
            for m in bitwise_margins(test):
                row.bitwise_total += int(m.get("total") or 0)
                row.bitwise_differing += int(m.get("differing") or 0)
    return [rows[c] for c in sorted(rows, key=clause_key)]


def percent(used: float) -> str:
    """A share of a bound as a percentage with three significant digits."""
    return "0 % (exact)" if used == 0 else f"{used * 100:.3g} %"


def margin_text(row: ClauseRow) -> tuple:
    """``(how close, test, what)`` for a clause: the worst share of a bound used, where it was used;
    the bitwise comparisons' differing elements when the clause has no tolerance comparison (or
    appended when they differ)."""
    bitwise = (
        f"bitwise: {row.bitwise_differing:,} of {row.bitwise_total:,} differ" if row.bitwise_total else ""
    )
    if row.outside:
        how, (test, what) = "outside its bound", row.outside[0]
    elif row.worst is not None:
        how, test, what = percent(row.worst["used"]), row.worst["test"], row.worst["what"]
        if row.worst["used"] > 1:
            how += " (outside its bound)"
    else:
        return bitwise, "", ""
    if row.bitwise_differing:
        how += f"; {bitwise}"
    return how, test, what


def tests_with(cert: dict, outcomes) -> list:
    return [t for t in cert["tests"] if t["outcome"] in outcomes]


# --- the chart's rows ----------------------------------------------------------------------------


@dataclass
class ChartRow:
    """One row of the margin chart: the clauses that share one worst comparison (or one state)."""

    clauses: list
    kind: str  # "outside", "failed" (no comparison), "margin", "xfailed", "bitwise", "checked", "skipped"
    used: float | None = None  # share of the bound, for "margin" (may exceed 1 when a test failed on it)
    test: str = ""
    what: str = ""
    bitwise_total: int = 0
    bitwise_differing: int = 0

    @property
    def order(self) -> tuple:
        rank = {
            "outside": 0,
            "failed": 1,
            "margin": 2,
            "xfailed": 3,
            "bitwise": 4,
            "checked": 5,
            "skipped": 6,
        }[self.kind]
        if self.kind == "margin" and self.used is not None and self.used > 1:
            rank = 0
        if self.kind == "bitwise" and self.bitwise_differing:
            rank = 1
        closeness = -(self.used or 0.0) if self.kind == "margin" else -self.bitwise_differing
        return (rank, closeness, clause_key(self.clauses[0]))


def chart_rows(cert: dict) -> list:
    """Every clause of the run in the chart (SPEC 4.5.2), closest to failing first: a clause whose
    tolerance comparison failed outright, a failed clause without a comparison, the worst share of
    a bound used, expected failures, clauses compared bitwise only. Clauses whose row would say the
    same thing (the same worst comparison, or the same state) share one row."""
    rows = clause_rows(cert)
    failing = {str(c) for t in tests_with(cert, BAD_OUTCOMES) for c in t.get("clauses") or []}
    expected = {str(c) for t in tests_with(cert, {"xfailed"}) for c in t.get("clauses") or []}
    merged: dict = {}
    for row in rows:
        bad = row.clause in failing or any(row.counts.get(o) for o in BAD_OUTCOMES)
        if row.outside:
            test, what = row.outside[0]
            key = ("outside", test, what)
            entry = ChartRow([], "outside", None, test, what)
        elif row.worst is not None and row.worst["used"] > 1:
            key = ("margin", row.worst["test"], row.worst["what"], row.worst["used"])
            entry = ChartRow([], "margin", row.worst["used"], row.worst["test"], row.worst["what"])
        elif row.bitwise_differing:
            key = ("bitwise", row.bitwise_total, row.bitwise_differing)
            entry = ChartRow(
                [], "bitwise", bitwise_total=row.bitwise_total, bitwise_differing=row.bitwise_differing
            )
        elif bad:
            test = next(
                (
                    t["id"]
                    for t in tests_with(cert, BAD_OUTCOMES)
                    if row.clause in map(str, t.get("clauses") or [])
                ),
                "",
            )
            key = ("failed", test)
            entry = ChartRow([], "failed", None, test, "no comparison recorded")
        elif row.worst is not None:
            key = ("margin", row.worst["test"], row.worst["what"], row.worst["used"])
            entry = ChartRow([], "margin", row.worst["used"], row.worst["test"], row.worst["what"])
        elif row.bitwise_total:
            key = ("bitwise", row.bitwise_total, 0)
            entry = ChartRow([], "bitwise", bitwise_total=row.bitwise_total)
        elif row.clause in expected or row.counts.get("xfailed"):
            key = ("xfailed",)
            entry = ChartRow([], "xfailed", None, "", "expected failure")
        elif row.counts.get("passed"):
            key = ("checked",)
            entry = ChartRow([], "checked", None, "", "passed; exact checks only, no numeric comparison")
        else:
            key = ("skipped",)
            entry = ChartRow([], "skipped", None, "", "no test of the clause ran")
        entry = merged.setdefault(key, entry)
        entry.clauses.append(row.clause)
    return sorted(merged.values(), key=lambda r: r.order)


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
    ]
    problems, expected = not_passed(cert), not_passed(cert, expected=True)
    if problems:
        out += [f"## Did not pass ({len(problems)})", ""] + _md_problems(problems) + [""]
    if expected:
        out += [f"## Expected failures ({len(expected)})", ""] + _md_problems(expected) + [""]
    out += ["## What was certified", ""]
    out += _md_table(["", ""], [[md_text(k), md_text(v)] for k, v in facts(cert)[1:]])
    out += ["", "## Clauses", ""]
    rows = []
    for row in clause_rows(cert):
        how, test, what = margin_text(row)
        where = f"{md_code(test)} {md_text(what)}" if test else ""
        rows.append([md_text(row.clause)] + [str(row.counts[o]) for o in OUTCOMES] + [md_text(how), where])
    out += _md_table(
        ["clause"] + [OUTCOME_HEADINGS[o] for o in OUTCOMES] + ["worst margin used", "in test"], rows
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
    stale = cert.get("stale_expected_failures") or []
    if stale:
        out += ["", "## Stale expected-failure entries", ""] + [f"- {md_text(s)}" for s in stale]
    notes = cert.get("notes") or []
    if notes:
        out += ["", "## Notes", ""] + [f"- {md_text(n)}" for n in notes]
    out += ["", f"<sub>{cert['schema']}" + (f", from {md_text(source)}" if source else "") + "</sub>", ""]
    return "\n".join(out)
