"""What a certificate's report shows, independent of its format (SPEC 4.5): the facts of what
was certified, the rules by status, the per-clause rows, the margins chart's rows; shared by the Markdown
(:mod:`gefen_conformance.certificate.report`) and HTML
(:mod:`gefen_conformance.certificate.report_html`) renderings."""

from __future__ import annotations

from dataclasses import dataclass, field

from gefen_conformance.certificate import rules
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


# --- content model -------------------------------------------------------------------------------

#: How the reports head each status of a rule (SPEC 4.4.17), in the order they list them.
RULE_HEADINGS = {
    "failed": "failed",
    "skipped": "skipped for a missing capability",
    "unchecked": "checked by no test of this run",
    "unproven": "checked without a mutant proof",
    "not-certified": "not certified by this suite",
    "certified": "certified",
}


def rule_rows(cert: dict) -> list:
    """``(heading, count, ids in brief)`` of each status of the certificate's ``rules`` section
    that holds a rule, what did not pass first; a rule the suite does not certify is listed under
    its reason (``not certified by this suite: reference-only``). Empty for a certificate without
    the section."""
    section = cert.get("rules")
    if not isinstance(section, dict):
        return []
    ids = section.get("ids") or {}
    rows = []
    for status, heading in RULE_HEADINGS.items():
        if status == "not-certified":
            reasons = rules.register()["reasons"]
            for reason, listed in (section.get("not_certified_reasons") or {}).items():
                why = f" \N{EM DASH} {reasons[reason]}" if reason in reasons else ""
                rows.append((f"{heading}: {reason}{why}", len(listed), rules.compact(listed)))
        elif ids.get(status):
            rows.append((heading, len(ids[status]), rules.compact(ids[status])))
    return rows


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
    ]
    if impl.get("extended_options"):
        rows.append(
            (
                "extended options",
                _join(impl["extended_options"]) + " (implemented, not certified: SPEC 1.1.5)",
            )
        )
    rows += [
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
                    f"tier {ex['tier']}" if ex.get("tier") else "",
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
