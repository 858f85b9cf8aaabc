"""Which of the SPEC's rules a run certified (SPEC 0.2.4).

The register (``rules.json`` beside this module, generated from SPEC.md by
``tools/rule_register.py``) lists every rule of Parts 1-3 by id, and the rules the suite does not
certify with their reason. A suite test certifies the rules it names in its ``gefen_clause`` marks
by id: ``1.1.2#3`` names row 3 of §1.1.2's table, and a clause number names the clause's rule only
where the clause is a single rule. A mark of a clause that holds several rules (``1.12.4``), or of
a section (``1.8``), certifies none of them: the word covers what a test checks, never more.

A rule's status in a run, from the certificate's tests:

* ``certified``: a test that names it passed, none that names it failed, and a mutant wrong in
  that rule alone has been shown to fail such a test (the project's proofs);
* ``unproven``: as ``certified``, but no mutant has shown yet that the tests naming the rule can
  fail for it alone (``unproven_rules.json``, kept equal to the proofs by the project's tests);
* ``failed``: a test that names it failed or errored (or failed as an expected failure);
* ``skipped``: every test that names it was skipped (a missing capability);
* ``unchecked``: no test of this run names it (never checked by the suite, or deselected);
* ``not-certified``: the register says the suite does not certify it, and why; or the rule binds
  the torch-exact profile only (the register's ``profile``) and the run's profile is another
  (reason ``torch-exact-only``).
"""

from __future__ import annotations

import json
from collections import Counter
from functools import cache
from importlib import resources

STATUSES = ("certified", "unproven", "failed", "skipped", "unchecked", "not-certified")
_FAILED = {"failed", "error", "xfailed"}


@cache
def register() -> dict:
    """The register shipped with the suite: ``{"reasons": {...}, "rules": [{id, clause, text, ...}]}``."""
    text = resources.files(__package__).joinpath("rules.json").read_text(encoding="utf-8")
    return json.loads(text)


@cache
def unproven() -> frozenset:
    """The rules the suite names that no mutant has been shown to fail for (see the docstring)."""
    text = resources.files(__package__).joinpath("unproven_rules.json").read_text(encoding="utf-8")
    return frozenset(json.loads(text)["rules"])


def rule_ids() -> frozenset:
    return frozenset(r["id"] for r in register()["rules"])


def named_rules(clauses) -> set:
    """The rule ids a test's ``gefen_clause`` marks name (see the module's docstring)."""
    ids = rule_ids()
    return {str(c) for c in clauses if str(c) in ids}


def _not_certified(rule: dict, profile: str) -> str | None:
    """Why a run under the numeric profile ``profile`` does not certify ``rule``, if it does not."""
    if rule.get("not_certified"):
        return rule["not_certified"]
    if rule.get("profile") and rule["profile"] != profile:
        return f"{rule['profile']}-only"
    return None


def statuses(tests: list, profile: str = "torch-exact") -> dict:
    """Each rule's status (``STATUSES``) in a run under the numeric profile ``profile`` whose
    certificate lists ``tests``."""
    outcomes: dict[str, set] = {}
    for test in tests:
        for rule in named_rules(test.get("clauses", ())):
            outcomes.setdefault(rule, set()).add(test.get("outcome"))
    status = {}
    for rule in register()["rules"]:
        seen = outcomes.get(rule["id"], set())
        if _not_certified(rule, profile):
            status[rule["id"]] = "not-certified"
        elif seen & _FAILED:
            status[rule["id"]] = "failed"
        elif "passed" in seen or "xpassed" in seen:
            status[rule["id"]] = "unproven" if rule["id"] in unproven() else "certified"
        elif seen:
            status[rule["id"]] = "skipped"
        else:
            status[rule["id"]] = "unchecked"
    return status


def section(tests: list, profile: str = "torch-exact") -> dict:
    """The certificate's ``rules`` section: how many rules the register holds (``total``), the count
    and the ids of each status, the ids the suite does not certify by reason
    (``not_certified_reasons``, a key of the register's ``reasons``), and :func:`summary`'s line."""
    status = statuses(tests, profile)
    counts = Counter(status.values())
    reasons: dict[str, list] = {}
    for rule in register()["rules"]:
        reason = _not_certified(rule, profile)
        if reason:
            reasons.setdefault(reason, []).append(rule["id"])
    by_status = {s: sorted((i for i, v in status.items() if v == s), key=_key) for s in STATUSES}
    return {
        "total": len(status),
        "counts": {s: counts.get(s, 0) for s in STATUSES},
        "not_certified_reasons": {r: sorted(ids, key=_key) for r, ids in sorted(reasons.items())},
        "ids": by_status,
        "summary": summary(counts, len(status)),
    }


def line(cert: dict) -> str:
    """The rules line a reader prints beside a certificate's verdict: what the verdict covers."""
    section_ = cert.get("rules")
    if not isinstance(section_, dict) or not isinstance(section_.get("summary"), str):
        return "rules: not recorded (a certificate written before SPEC 0.2.4 counts no rules)"
    return f"rules: {section_['summary']}"


def compact(ids) -> str:
    """``ids`` in brief, by clause, consecutive rows as a range: ``"1.1.2 #1-4, #6; 1.12.9"``."""
    by_clause: dict[str, list] = {}
    for rule_id in sorted(ids, key=_key):
        clause, _, row = rule_id.partition("#")
        by_clause.setdefault(clause, [])
        if row:
            by_clause[clause].append(row)
    parts = []
    for clause, rows in by_clause.items():
        numbers = [int(r) for r in rows if r.isdigit()]
        spans: list[list[int]] = []
        for n in numbers:
            if spans and n == spans[-1][1] + 1:
                spans[-1][1] = n
            else:
                spans.append([n, n])
        shown = [f"#{a}" if a == b else f"#{a}-{b}" for a, b in spans]
        shown += [f"#{r}" for r in rows if not r.isdigit()]
        parts.append(f"{clause} {', '.join(shown)}" if shown else clause)
    return "; ".join(parts)


def summary(counts, total: int) -> str:
    """One line: ``"12 of 258 rules certified; 3 not certified by this suite (SPEC 0.2.4); 240
    checked by no test of this run"``, with failed and skipped counts where any."""
    parts = [f"{counts.get('certified', 0)} of {total} rules certified"]
    if counts.get("unproven"):
        parts.append(f"{counts['unproven']} checked without a mutant proof")
    if counts.get("failed"):
        parts.append(f"{counts['failed']} failed")
    if counts.get("skipped"):
        parts.append(f"{counts['skipped']} skipped for a missing capability")
    if counts.get("not-certified"):
        parts.append(f"{counts['not-certified']} not certified by this suite (SPEC 0.2.4)")
    if counts.get("unchecked"):
        parts.append(f"{counts['unchecked']} checked by no test of this run")
    return "; ".join(parts)


def _key(rule_id: str) -> tuple:
    clause, _, row = rule_id.partition("#")
    return (*(int(p) if p.isdigit() else 0 for p in clause.split(".")), int(row) if row.isdigit() else 0)
