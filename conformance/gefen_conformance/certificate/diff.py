"""What changed between two certificates, and whether the newer run regressed (SPEC 4.5).

:func:`compare` takes two checked schema-2 certificates (SPEC 4.4,
:mod:`gefen_conformance.certificate.read`), OLD and NEW, and returns a :class:`Diff` holding:

* identity changes: implementation name, version and capabilities; numeric profile and its
  tolerances (each bound that changed within one profile; between two profiles, only that they
  differ: the report lists each profile's); suite version, content hash and git commit; torch,
  python, numpy and machine; execution target; hypothesis profile; how complete the run was;
* the verdict change, and whether it got worse (verdicts ordered as
  :data:`gefen_conformance.certificate.read.VERDICTS`);
* the change of the rule counts (SPEC 4.4.17), one line: each status whose count changed; reported,
  not judged (a rule that newly failed is a new failure of a test already);
* tests by outcome change: new failures (NEW failed, errored or passed unexpectedly where OLD did
  not, or the test is new), fixed tests, other outcome changes, added and removed tests; clauses
  whose outcome counts changed;
* margins (tolerance comparisons matched by test id and ``what``) of tests that passed in NEW:
  those that grew by more than ``margin_factor`` (a margin under ``margin_floor`` of its bound
  counts as ``margin_floor``, so noise near zero does not flag) or that went outside their bound,
  and those at or over ``margin_threshold`` of their bound (a regression only where OLD's same
  comparison was under it or absent; those already over it are listed apart); bitwise comparisons whose count
  of
  differing elements changed.

NEW regressed (:attr:`Diff.regressions` non-empty, exit status 1 of ``gefen-conformance diff``)
when it has a new failure, a worse verdict, a margin grown past the factor, or a margin that
reached the threshold. Identity changes are reported, never judged: comparing across profiles or torch
versions is allowed, and said. The text form wraps every line at :data:`WIDTH` characters.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field

from gefen_conformance.certificate.read import (
    BAD_OUTCOMES,
    OUTCOMES,
    clause_key,
    finite_used,
    tolerance_margins,
    verdict_rank,
)
from gefen_conformance.certificate.rules import STATUSES

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")  # never echo terminal escapes from a certificate
DEFAULT_MARGIN_FACTOR = 2.0
DEFAULT_MARGIN_FLOOR = 0.01
DEFAULT_MARGIN_THRESHOLD = 0.9
WIDTH = 100  # the text form's lines, wrapped
NOT_RUN_SHOWN = 10  # tests listed as not run in a run that is not complete; the rest are counted


@dataclass
class MarginChange:
    test: str
    what: str
    old: float | None  # share of the bound used; None: no such margin in OLD (threshold) or outside its bound
    new: float | None  # None: outside its bound (failed outright)
    old_present: bool = True


@dataclass
class Diff:
    identity: list = field(default_factory=list)  # (what, old text, new text)
    verdict: tuple | None = None  # (old, new) when it changed
    verdict_worse: bool = False
    rules: str = ""  # the rule counts that changed, one line ("" when none did)
    new_failures: list = field(default_factory=list)  # (test id, old outcome or None, new outcome, reason)
    fixed: list = field(default_factory=list)  # (test id, old outcome, new outcome)
    other_changes: list = field(default_factory=list)  # (test id, old outcome, new outcome)
    added: list = field(default_factory=list)  # (test id, outcome)
    removed: list = field(default_factory=list)  # (test id, outcome)
    not_run_in_new: list = field(default_factory=list)  # (test id, outcome in OLD): NEW is not complete
    not_run_in_old: list = field(default_factory=list)  # (test id, outcome in NEW): OLD is not complete
    why_not_run: tuple = ("", "")  # why OLD, NEW are not complete runs ("" when complete)
    notes_added: list = field(default_factory=list)  # notes of NEW that OLD had not
    notes_removed: list = field(default_factory=list)  # notes of OLD that NEW has not
    clauses: list = field(default_factory=list)  # (clause, old counts, new counts)
    margin_growth: list = field(default_factory=list)  # MarginChange
    over_threshold: list = field(default_factory=list)  # MarginChange: reached the threshold in NEW
    still_over_threshold: list = field(default_factory=list)  # MarginChange: already at or over it in OLD
    bitwise: list = field(default_factory=list)  # (test id, what, old differing, new differing)
    margin_factor: float = DEFAULT_MARGIN_FACTOR
    margin_floor: float = DEFAULT_MARGIN_FLOOR
    margin_threshold: float = DEFAULT_MARGIN_THRESHOLD

    @property
    def regressions(self) -> list:
        """Why NEW regressed, one phrase each; empty when it did not."""
        reasons = []
        if self.new_failures:
            reasons.append(f"{len(self.new_failures)} new failure(s)")
        if self.verdict_worse:
            reasons.append(f"verdict got worse: {self.verdict[0]} -> {self.verdict[1]}")
        if self.margin_growth:
            reasons.append(
                f"{len(self.margin_growth)} margin(s) grew more than {self.margin_factor:g}x or left "
                "their bound"
            )
        if self.over_threshold:
            reasons.append(
                f"{len(self.over_threshold)} margin(s) reached {self.margin_threshold:.0%} of their bound"
            )
        return reasons


def _text(value) -> str:
    if value is None or value == "":
        return "(none)"
    if isinstance(value, (list, tuple)):
        return ", ".join(map(str, value)) or "(none)"
    if isinstance(value, dict):
        return ", ".join(f"{k} {_text(v)}" for k, v in value.items()) or "(none)"
    return str(value)


def _identity(cert: dict) -> dict:
    impl, suite = cert["implementation"], cert.get("suite") or {}
    profile = cert.get("profile") or {}
    profile = profile if isinstance(profile, dict) else {"name": profile}
    plat, ex, run = cert.get("platform") or {}, cert.get("execution") or {}, cert.get("run") or {}
    git = suite.get("git") if isinstance(suite.get("git"), dict) else {}
    return {
        "implementation": impl.get("name"),
        "implementation version": impl.get("version"),
        "profile": profile.get("name"),
        "profile tolerances": {k: v for k, v in profile.items() if k not in ("name", "reason")},
        "suite version": suite.get("version"),
        "suite content sha256": suite.get("content_sha256"),
        "suite git commit": (git.get("commit") or "") + (" (dirty)" if git.get("dirty") else "")
        if git
        else None,
        "torch": plat.get("torch"),
        "python": plat.get("python"),
        "numpy": plat.get("numpy"),
        "machine": plat.get("machine"),
        "execution": {
            k: ex.get(k)
            for k in (
                "device_type",
                "device_names",
                "backend",
                "distributed_backend",
                "world_size",
                "world_sizes",
                "nodes",
                "launcher",
            )
            if k in ex
        },
        "hypothesis profile": (run.get("hypothesis") or {}).get("profile"),
        "run": _run_text(run) if run else None,
    }


def _run_text(run: dict) -> str:
    text = f"{run.get('executed_tests', '?')} of {run.get('expected_tests', '?')} expected tests executed"
    if run.get("narrowed_by"):
        text += ", narrowed by " + "; ".join(map(str, run["narrowed_by"]))
    return text + (", interrupted" if run.get("interrupted") else "")


def _capabilities(old: dict, new: dict) -> tuple | None:
    a, b = (
        set(old["implementation"].get("capabilities") or []),
        set(new["implementation"].get("capabilities") or []),
    )
    if a == b:
        return None
    change = [f"+{c}" for c in sorted(b - a)] + [f"-{c}" for c in sorted(a - b)]
    return ("capabilities", _text(sorted(a)), _text(sorted(b)) + f" ({' '.join(change)})")


def compare(
    old: dict,
    new: dict,
    *,
    margin_factor: float = DEFAULT_MARGIN_FACTOR,
    margin_floor: float = DEFAULT_MARGIN_FLOOR,
    margin_threshold: float = DEFAULT_MARGIN_THRESHOLD,
) -> Diff:
    """The :class:`Diff` from ``old`` to ``new`` (see the module docstring)."""
    diff = Diff(margin_factor=margin_factor, margin_floor=margin_floor, margin_threshold=margin_threshold)
    a, b = _identity(old), _identity(new)
    for k in a:
        if a[k] == b[k]:
            continue
        if k == "profile tolerances":
            diff.identity += _tolerance_changes(a["profile"], b["profile"], a[k], b[k])
        else:
            diff.identity.append((k, _text(a[k]), _text(b[k])))
    diff.why_not_run = (_incomplete(old), _incomplete(new))
    old_notes, new_notes = [str(n) for n in old.get("notes") or []], [str(n) for n in new.get("notes") or []]
    diff.notes_added = [n for n in new_notes if n not in old_notes]
    diff.notes_removed = [n for n in old_notes if n not in new_notes]
    caps = _capabilities(old, new)
    if caps:
        diff.identity.insert(2, caps)
    if old["verdict"] != new["verdict"]:
        diff.verdict = (old["verdict"], new["verdict"])
        diff.verdict_worse = verdict_rank(new["verdict"]) > verdict_rank(old["verdict"])
    diff.rules = _rules_change(old.get("rules"), new.get("rules"))
    old_tests, new_tests = {t["id"]: t for t in old["tests"]}, {t["id"]: t for t in new["tests"]}
    for tid in sorted(old_tests.keys() | new_tests.keys()):
        was, now = old_tests.get(tid), new_tests.get(tid)
        was_o, now_o = was and was["outcome"], now and now["outcome"]
        if now is None:
            (diff.not_run_in_new if diff.why_not_run[1] else diff.removed).append((tid, was_o))
            continue
        if was is None:
            (diff.not_run_in_old if diff.why_not_run[0] else diff.added).append((tid, now_o))
        if now_o in BAD_OUTCOMES and was_o not in BAD_OUTCOMES:
            diff.new_failures.append((tid, was_o, now_o, str(now.get("reason") or "")))
        elif was is not None and was_o != now_o:
            (diff.fixed if was_o in BAD_OUTCOMES else diff.other_changes).append((tid, was_o, now_o))
        if was is not None:
            _compare_margins(diff, tid, was, now)
        if now_o == "passed":
            _check_threshold(diff, tid, was, now)
    for clause in sorted(old["clauses"].keys() | new["clauses"].keys(), key=clause_key):
        counts = [
            {o: int((cert["clauses"].get(clause) or {}).get(o, 0) or 0) for o in OUTCOMES}
            for cert in (old, new)
        ]
        if counts[0] != counts[1]:
            diff.clauses.append((clause, counts[0], counts[1]))
    return diff


def _rules_change(old, new) -> str:
    """The rule counts that changed from ``old`` to ``new`` (``rules`` sections), in one line."""
    if not isinstance(old, dict) and not isinstance(new, dict):
        return ""
    if not (isinstance(old, dict) and isinstance(new, dict)):
        shown = [
            f"rules: {s['summary']}" if isinstance(s, dict) else "rules not recorded" for s in (old, new)
        ]
        return f"{shown[0]} -> {shown[1]}"
    a, b = old.get("counts") or {}, new.get("counts") or {}
    changed = [f"{s} {a.get(s, 0)} -> {b.get(s, 0)}" for s in STATUSES if a.get(s, 0) != b.get(s, 0)]
    if old.get("total") != new.get("total"):
        changed.append(f"rules in the register {old.get('total')} -> {new.get('total')}")
    return ", ".join(changed)


def _incomplete(cert: dict) -> str:
    """Why ``cert`` is not a complete run (interrupted, narrowed, scenarios not run here), or ""."""
    run = cert.get("run") or {}
    if not run or run.get("complete", True):
        return ""
    parts = []
    if run.get("interrupted"):
        parts.append("interrupted")
    if run.get("narrowed_by"):
        parts.append("narrowed by " + "; ".join(map(str, run["narrowed_by"])))
    if run.get("not_run"):
        parts.append(f"{len(run['not_run'])} did not run here")
    parts.append(
        f"{run.get('executed_tests', '?')} of {run.get('expected_tests', '?')} expected tests executed"
    )
    return ", ".join(parts)


def _flat(value, prefix: str = "") -> dict:
    """A nested profile as ``{"a.b": leaf}``."""
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: value}


def _tolerance_changes(old_name, new_name, old: dict, new: dict) -> list:
    """The identity lines of a tolerance change: one per bound that changed within one profile;
    between two profiles one line (every bound differs; the report lists each profile's)."""
    if old_name != new_name:
        return [
            (
                "profile tolerances",
                f"those of {_text(old_name)}",
                f"those of {_text(new_name)} (`gefen-conformance report` lists each profile's bounds)",
            )
        ]
    a, b = _flat(old), _flat(new)
    return [
        (f"profile tolerance {key}", _text(a.get(key)), _text(b.get(key)))
        for key in sorted(a.keys() | b.keys())
        if a.get(key) != b.get(key)
    ]


def _margins_by_what(test: dict) -> dict:
    return {str(m.get("what", "")): m for m in test.get("margins") or []}


def _compare_margins(diff: Diff, tid: str, was: dict, now: dict) -> None:
    before = _margins_by_what(was)
    for what, m in _margins_by_what(now).items():
        old_m = before.get(what)
        if old_m is None or old_m.get("kind") != m.get("kind"):
            continue
        if m["kind"] == "bitwise":
            if int(old_m.get("differing") or 0) != int(m.get("differing") or 0):
                diff.bitwise.append(
                    (tid, what, int(old_m.get("differing") or 0), int(m.get("differing") or 0))
                )
            continue
        if now["outcome"] != "passed":
            continue  # a failing comparison is judged by the test's outcome
        old_u, new_u = finite_used(old_m), finite_used(m)
        if old_u is None:
            continue  # it was outside its bound before: anything now is no growth
        if new_u is None or (
            new_u >= diff.margin_floor and new_u > diff.margin_factor * max(old_u, diff.margin_floor)
        ):
            diff.margin_growth.append(MarginChange(tid, what, old_u, new_u))


def _check_threshold(diff: Diff, tid: str, was: dict | None, now: dict) -> None:
    before = _margins_by_what(was) if was else {}
    for m in tolerance_margins(now):
        used = finite_used(m)
        if used is None or used >= diff.margin_threshold:
            what = str(m.get("what", ""))
            old_m = before.get(what)
            if old_m is not None and old_m.get("kind") != "tolerance":
                old_m = None  # OLD compared it bitwise (another profile): no share of a bound to compare with
            old_used = finite_used(old_m) if old_m else None
            change = MarginChange(tid, what, old_used, used, old_m is not None)
            # a bound a correct kernel already came this close to is no news: only a crossing regresses
            already = used is not None and old_used is not None and old_used >= diff.margin_threshold
            (diff.still_over_threshold if already else diff.over_threshold).append(change)


# --- rendering ---------------------------------------------------------------------------------


def _pct(used: float | None) -> str:
    from gefen_conformance.certificate.report_model import percent

    return "outside its bound" if used is None else percent(used)


def _growth_item(c: MarginChange) -> str:
    if c.new is None:
        return f"{c.test} :: {c.what}: {_pct(c.old)} -> outside its bound"
    return (
        f"{c.test} :: {c.what}: {_pct(c.old)} -> {_pct(c.new)} (x{c.new / max(c.old, 1e-300):.3g})"
        if c.old
        else f"{c.test} :: {c.what}: {_pct(c.old)} -> {_pct(c.new)}"
    )


def _threshold_item(c: MarginChange) -> str:
    was = f" (was {_pct(c.old)})" if c.old_present else " (no such tolerance comparison in OLD)"
    return f"{c.test} :: {c.what}: {_pct(c.new)} of its bound{was}"


def _not_run(tests: list, other: str) -> tuple:
    shown = [f"{tid} ({other}: {o})" for tid, o in tests[:NOT_RUN_SHOWN]]
    if len(tests) > NOT_RUN_SHOWN:
        shown.append(f"... and {len(tests) - NOT_RUN_SHOWN} more")
    return shown, len(tests)


def sections(diff: Diff) -> list:
    """``(title, items, count)`` for every non-empty part of the diff, in reading order; items are
    plain text; ``count`` is how many things the part holds (a long list of tests that a run that
    is not complete did not run is cut to :data:`NOT_RUN_SHOWN` items)."""

    def outcome(o):
        return o if o is not None else "(new test)"

    not_run_new, count_new = _not_run(diff.not_run_in_new, "OLD")
    not_run_old, count_old = _not_run(diff.not_run_in_old, "NEW")

    parts = [
        ("Identity changed", [f"{what}: {a} -> {b}" for what, a, b in diff.identity]),
        (
            "Verdict changed",
            [f"{diff.verdict[0]} -> {diff.verdict[1]}" + (" (worse)" if diff.verdict_worse else " (better)")]
            if diff.verdict
            else [],
        ),
        ("Rule counts changed", [diff.rules] if diff.rules else []),
        (
            "New failures",
            [
                f"{tid}: {outcome(a)} -> {b}" + (f"\n{reason.splitlines()[0]}" if reason.strip() else "")
                for tid, a, b, reason in diff.new_failures
            ],
        ),
        ("Fixed", [f"{tid}: {a} -> {b}" for tid, a, b in diff.fixed]),
        ("Other outcome changes", [f"{tid}: {a} -> {b}" for tid, a, b in diff.other_changes]),
        ("Tests added", [f"{tid} ({o})" for tid, o in diff.added]),
        ("Tests removed", [f"{tid} (was {o})" for tid, o in diff.removed]),
        (f"Not run in NEW, which is not a complete run ({diff.why_not_run[1]})", not_run_new, count_new),
        (f"Not run in OLD, which is not a complete run ({diff.why_not_run[0]})", not_run_old, count_old),
        (
            "Clauses whose outcomes changed",
            [
                f"{c}: " + ", ".join(f"{o} {a[o]} -> {b[o]}" for o in OUTCOMES if a[o] != b[o])
                for c, a, b in diff.clauses
            ],
        ),
        (
            f"Margins that grew more than {diff.margin_factor:g}x (margins under "
            f"{_pct(diff.margin_floor)} count as "
            f"{_pct(diff.margin_floor)}) or left their bound",
            [_growth_item(c) for c in diff.margin_growth],
        ),
        (
            f"Margins that reached {_pct(diff.margin_threshold)} of their bound (passing tests)",
            [_threshold_item(c) for c in diff.over_threshold],
        ),
        (
            f"Margins already at or over {_pct(diff.margin_threshold)} of their bound in OLD (not a "
            "regression)",
            [_threshold_item(c) for c in diff.still_over_threshold],
        ),
        (
            "Bitwise comparisons whose differing elements changed",
            [f"{tid} :: {what}: {a:,} -> {b:,} differ" for tid, what, a, b in diff.bitwise],
        ),
        ("Notes new in NEW", list(diff.notes_added)),
        ("Notes of OLD that NEW no longer has", list(diff.notes_removed)),
    ]
    parts = [part if len(part) == 3 else (part[0], part[1], len(part[1])) for part in parts]
    return [(title, items, count) for title, items, count in parts if items]


def _wrap(text: str, first: str, rest: str) -> list:
    """``text`` in lines of at most :data:`WIDTH` characters (a word longer than that, a test id,
    stays whole on its own line)."""
    return textwrap.wrap(
        text,
        WIDTH,
        initial_indent=first,
        subsequent_indent=rest,
        break_long_words=False,
        break_on_hyphens=False,
    ) or [first.rstrip()]


def _describe(cert: dict) -> str:
    impl, run = cert["implementation"], cert.get("run") or {}
    started = f", started {run['started']}" if run.get("started") else ""
    rules = cert.get("rules")
    counts = (rules.get("counts") or {}) if isinstance(rules, dict) else {}
    covered = f" ({counts.get('certified', 0)} of {rules.get('total')} rules certified)" if counts else ""
    return f"{impl['name']} {impl.get('version') or ''}".strip() + f", {cert['verdict']}{covered}{started}"


def render(
    diff: Diff, old: dict, new: dict, fmt: str = "text", old_name: str = "OLD", new_name: str = "NEW"
) -> str:
    """The diff as plain text (``"text"``) or as Markdown for a pull-request comment (``"md"``)."""
    verdict = ("REGRESSED: " + "; ".join(diff.regressions)) if diff.regressions else "No regression."
    if fmt == "text":
        out = [f"OLD {old_name}: {_describe(old)}", f"NEW {new_name}: {_describe(new)}", verdict]
        out = [wrapped for line in out for wrapped in _wrap(_CONTROL.sub("?", line), "", "    ")]
        for title, items, count in sections(diff):
            out += [""] + _wrap(f"{title} ({count}):", "", "    ")
            for item in items:
                first, *rest = _CONTROL.sub("?", item).split("\n")
                out += _wrap(first, "  ", "      ")
                for line in rest:
                    out += _wrap(line, "      ", "      ")
        return "\n".join(out) + "\n"
    if fmt == "md":
        from gefen_conformance.certificate.report import md_text

        out = [
            "### Gefen conformance diff",
            "",
            f"**{md_text(verdict)}**",
            "",
            "| | certificate | implementation, verdict, start |",
            "|---|---|---|",
            f"| OLD | {md_text(old_name)} | {md_text(_describe(old))} |",
            f"| NEW | {md_text(new_name)} | {md_text(_describe(new))} |",
        ]
        for title, items, count in sections(diff):
            out += ["", f"#### {md_text(title)} ({count})", ""] + [f"- {md_text(item)}" for item in items]
        return "\n".join(out) + "\n"
    raise ValueError(f"unknown diff format {fmt!r} (known: text, md)")
