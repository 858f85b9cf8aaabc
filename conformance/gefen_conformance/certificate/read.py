"""Reading a conformance certificate back, for reports and diffs (SPEC 4.4, 4.5).

:func:`load` returns the parsed certificate of schema ``gefen-conformance-certificate/2``
(SPEC 4.4) after checking every key the report and the diff rely on, or raises
:class:`CertificateError` with one line naming the file and the problem: unreadable file, not
JSON, not an object, schema 1 ("not supported, re-run the suite"), an unknown schema, a missing
or mistyped key. A certificate without a ``rules`` section (written before SPEC 0.2.4) is read; the
readers say it counts no rules. Keys the readers only display (platform, execution, run, ...) may be absent;
the readers show what is there.

The rest are small shared helpers: the outcome and verdict vocabularies
(:mod:`gefen_conformance.certificate.outcomes`, verdicts ordered from best to worst), numeric clause ordering
(1.10 after 1.9), and the
tolerance and bitwise margins of a test.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

from gefen_conformance.certificate.outcomes import BAD_OUTCOMES, OUTCOMES, VERDICTS  # noqa: F401 - the readers' vocabulary

SCHEMA = "gefen-conformance-certificate/2"


# displayed when present; the wrong type would garble the report, so it is refused
_OPTIONAL = {
    "profile": (dict, str),
    "suite": dict,
    "platform": dict,
    "execution": dict,
    "run": dict,
    "capability_skips": dict,
    "notes": list,
    "stale_expected_failures": list,
    "expectations": dict,
    "integrity": dict,
}


class CertificateError(ValueError):
    """A file the readers cannot use; the message is one line naming the file."""


def load(path: os.PathLike) -> dict:
    """The certificate at ``path``, checked (see the module docstring)."""
    name = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise CertificateError(f"{name}: cannot read: {exc}") from None
    try:
        cert = json.loads(text)
    except json.JSONDecodeError as exc:
        raise CertificateError(f"{name}: not JSON ({exc})") from None
    problem = check(cert)
    if problem:
        raise CertificateError(f"{name}: {problem}")
    return cert


def check(cert) -> str:
    """The first reason ``cert`` is not a usable schema-2 certificate, or ``""``."""
    if not isinstance(cert, dict):
        return "not a certificate (the JSON is not an object)"
    schema = cert.get("schema")
    if schema == "gefen-conformance-certificate/1":
        return (
            "schema gefen-conformance-certificate/1 is not supported, re-run the suite to get a "
            f"{SCHEMA} certificate"
        )
    if schema != SCHEMA:
        return f"unknown certificate schema {schema!r} (this gefen-conformance reads {SCHEMA})"
    impl = cert.get("implementation")
    if not isinstance(impl, dict) or not isinstance(impl.get("name"), str):
        return "'implementation' must be an object with a string 'name'"
    if cert.get("verdict") not in VERDICTS:
        return f"unknown verdict {cert.get('verdict')!r} (known: {', '.join(VERDICTS)})"
    if not isinstance(impl.get("capabilities", []), list):
        return "'implementation.capabilities' must be a list"
    for key in ("summary", "clauses"):
        if not isinstance(cert.get(key), dict):
            return f"{key!r} must be an object"
    for key, kind in _OPTIONAL.items():
        if cert.get(key) is not None and not isinstance(cert[key], kind):
            return (
                f"{key!r} must be "
                f"{'a list' if kind is list else 'an object' if kind is dict else 'an object or a string'}"
            )
    for clause, counts in cert["clauses"].items():
        if not isinstance(counts, dict) or not isinstance(counts.get("worst_margin") or {}, dict):
            return f"clause {clause!r} must map to an object of counts and a worst_margin object or null"
        if not all(_is_int(counts.get(o, 0)) for o in OUTCOMES):
            return f"clause {clause!r}: outcome counts must be integers"
    problem = _check_rules(cert.get("rules"))
    if problem:
        return problem
    tests = cert.get("tests")
    if not isinstance(tests, list):
        return "'tests' must be a list"
    for i, test in enumerate(tests):
        problem = _check_test(test)
        if problem:
            return f"tests[{i}]: {problem}"
    return ""


def _check_rules(section) -> str:
    """The ``rules`` section as the readers show it: absent (a certificate before SPEC 0.2.4), or a
    summary line with lists of rule ids by status and by reason."""
    if section is None:
        return ""
    if not isinstance(section, dict) or not isinstance(section.get("summary"), str):
        return "'rules' must be an object with a string 'summary'"
    for key in ("ids", "not_certified_reasons"):
        listed = section.get(key, {})
        if not isinstance(listed, dict) or not all(
            isinstance(ids, list) and all(isinstance(i, str) for i in ids) for ids in listed.values()
        ):
            return f"'rules.{key}' must map to lists of rule ids"
    return ""


def _check_test(test) -> str:
    if not isinstance(test, dict) or not isinstance(test.get("id"), str):
        return "must be an object with a string 'id'"
    if test.get("outcome") not in OUTCOMES:
        return f"{test['id']}: unknown outcome {test.get('outcome')!r}"
    if not isinstance(test.get("clauses", []), list):
        return f"{test['id']}: 'clauses' must be a list"
    margins = test.get("margins", [])
    if not isinstance(margins, list) or not all(
        isinstance(m, dict) and m.get("kind") in ("tolerance", "bitwise") for m in margins
    ):
        return f"{test['id']}: 'margins' must be a list of tolerance or bitwise entries"
    for m in margins:
        if m["kind"] == "bitwise" and not (_is_int(m.get("differing")) and _is_int(m.get("total"))):
            return f"{test['id']}: bitwise margin {m.get('what')!r} needs integer 'differing' and 'total'"
        used = m.get("used")
        if (
            m["kind"] == "tolerance"
            and used is not None
            and (isinstance(used, bool) or not isinstance(used, (int, float)))
        ):
            return (
                f"{test['id']}: tolerance margin {m.get('what')!r} has a 'used' that is neither a "
                "number nor null"
            )
    return ""


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def verdict_rank(verdict: str) -> int:
    """0 for ``conformant`` up to the worst verdict, ``not-conformant``."""
    return VERDICTS.index(verdict)


def clause_key(clause: str) -> tuple:
    """Sort key: numeric parts compare as numbers (1.9 < 1.10), anything else after them."""
    return tuple((0, int(p), "") if p.isdigit() else (1, 0, p) for p in str(clause).split("."))


def finite_used(margin: dict):
    """A tolerance margin's ``used`` as a float, or None when the comparison failed outright."""
    used = margin.get("used")
    if isinstance(used, bool) or not isinstance(used, (int, float)) or not math.isfinite(used):
        return None
    return float(used)


def tolerance_margins(test: dict) -> list:
    return [m for m in test.get("margins") or [] if m.get("kind") == "tolerance"]


def bitwise_margins(test: dict) -> list:
    return [m for m in test.get("margins") or [] if m.get("kind") == "bitwise"]


def short_hash(value, length: int = 12) -> str:
    return str(value)[:length] if value else ""
