"""A certificate as JUnit XML, for the CI systems that read test results that way (SPEC 4.5.7).

One ``<testcase>`` per suite test of the certificate, in a ``<testsuite>`` named after the
implementation, its classname the suite module; a failed or errored test carries its reason (and
the failing input and ``gefen-conformance repro`` command when it left a reproducer), an expected
failure or a skip its reason as ``<skipped>``. Every test's properties: its SPEC clauses, its worst
tolerance margin (the share of its bound used, and which comparison), and its outcome; the suite
carries the verdict, its reason, the numeric profile and the certificate's path.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from pathlib import Path


def _worst(test: dict) -> tuple[float | None, str]:
    worst, what = None, ""
    for margin in test.get("margins") or []:
        if margin.get("kind") != "tolerance":
            continue
        used = margin.get("used")
        used = math.inf if used is None else float(used)
        if worst is None or used > worst:
            worst, what = used, str(margin.get("what", ""))
    return worst, what


def _properties(parent, values: dict) -> None:
    props = ET.SubElement(parent, "properties")
    for name, value in values.items():
        ET.SubElement(props, "property", name=name, value=str(value))


def xml(cert: dict, certificate_path: str = "") -> str:
    """The JUnit XML text of ``cert``."""
    implementation = cert.get("implementation") or {}
    summary = cert.get("summary") or {}
    tests = cert.get("tests") or []
    suite = ET.Element(
        "testsuite",
        name=f"gefen-conformance {implementation.get('name', '?')} {implementation.get('version', '?')}",
        tests=str(len(tests)),
        failures=str(summary.get("failed", 0) + summary.get("xpassed", 0)),
        errors=str(summary.get("error", 0)),
        skipped=str(summary.get("skipped", 0) + summary.get("xfailed", 0)),
        time=f"{sum(float(t.get('duration_s') or 0.0) for t in tests):.3f}",
        timestamp=str((cert.get("run") or {}).get("started", "")),
    )
    profile = cert.get("profile") or {}
    _properties(
        suite,
        {
            "verdict": cert.get("verdict", ""),
            "verdict_reason": cert.get("verdict_reason", ""),
            "profile": profile.get("name", "") if isinstance(profile, dict) else profile,
            "certificate": certificate_path,
        },
    )
    for test in tests:
        module, _, name = test["id"].partition("::")
        case = ET.SubElement(
            suite,
            "testcase",
            classname=module.removesuffix(".py"),
            name=name or test["id"],
            time=f"{float(test.get('duration_s') or 0.0):.3f}",
        )
        worst, what = _worst(test)
        values = {
            "clauses": ", ".join(map(str, test.get("clauses") or [])),
            "outcome": test.get("outcome", ""),
        }
        if worst is not None:
            values["worst_margin"] = "inf" if math.isinf(worst) else f"{worst:.6g}"
            values["worst_margin_comparison"] = what
        _properties(case, values)
        outcome, reason = test.get("outcome"), str(test.get("reason") or "")
        detail = [reason]
        if test.get("input"):
            detail.append(f"input: {test['input']}")
        if test.get("repro"):
            detail.append(f"replay: gefen-conformance repro {certificate_path or 'CERT'} '{test['id']}'")
        if outcome in ("failed", "xpassed"):
            ET.SubElement(case, "failure", message=reason[:500]).text = "\n".join(detail)
        elif outcome == "error":
            ET.SubElement(case, "error", message=reason[:500]).text = "\n".join(detail)
        elif outcome in ("skipped", "xfailed"):
            ET.SubElement(case, "skipped", message=reason[:500])
    ET.indent(suite)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"


def write(cert: dict, path, certificate_path: str = "") -> None:
    Path(path).write_text(xml(cert, certificate_path), encoding="utf-8")
