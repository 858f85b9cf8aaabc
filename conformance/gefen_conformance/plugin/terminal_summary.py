"""The "gefen conformance" section of pytest's terminal summary, failure first (SPEC 4.4.2, 4.5.5).

:func:`lines` turns a run's certificate into the section's lines, each with pytest terminal markup:
the verdict and its reason, and the rules line (what of the SPEC the tests certified, which is all
the verdict covers); every test that did not pass (failed, errored, passed unexpectedly), each with
its clauses, its one-line reason, where each failed rank was (the certificate's ``where``) and the
command that reruns exactly it; the tests that did not run here (too few ranks or devices), grouped
by reason; the expected failures; every tolerance comparison that used at least :data:`NEAR_BOUND`
of its bound, with its test and clauses; then the exit status, the numeric and hypothesis profiles,
capability skips, notes, the count of clauses named by tests and where the certificate went. Pure:
it reads the certificate only, so a test can render any certificate.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from gefen_conformance.certificate import build as certificate
from gefen_conformance.certificate import problems, report_model, rules
from gefen_conformance.certificate.diff import DEFAULT_MARGIN_THRESHOLD
from gefen_conformance.certificate.read import finite_used, tolerance_margins

#: a comparison at or above this share of its bound is repeated in the summary (the diff's threshold)
NEAR_BOUND = DEFAULT_MARGIN_THRESHOLD
_RED, _YELLOW = {"red": True}, {"yellow": True}
_INDENT = "      "


def headline(cert: dict) -> str:
    s = cert["summary"]
    return (
        f"{cert['implementation']['name']} {cert['implementation']['version']}: {cert['verdict']} "
        f"({s['passed']} passed, {s['failed']} failed, {s['error']} errors, {s['skipped']} skipped, "
        f"{s['xfailed']} expected failures)"
    )


def profile_line(profile: dict) -> str:
    if profile["name"] == "torch-exact":
        return f"numeric profile torch-exact ({profile['reason']}): {profile.get('comparison', 'bitwise')}"
    parts = [
        "the staged rounding bounds of SPEC 5.6 "
        f"({', '.join(k for k in ('pinned_step', 'free_running', 'checkpoints') if k in profile)}; "
        f"each bound in the certificate's profile)"
    ]
    extra = profile.get("continuation_after_reshard", {}).get("max_abs")
    if extra is not None:
        parts.append(f"continuation after reshard max-abs {extra:g}")
    return f"numeric profile tolerance ({profile['reason']}): " + "; ".join(parts)


def near_bound(cert: dict, threshold: float = NEAR_BOUND) -> list:
    """``(used, test id, what, clauses)`` of every tolerance comparison at or above ``threshold``
    of its bound (``used`` None: outside it outright), closest to failing first."""
    found = []
    for test in cert["tests"]:
        for margin in tolerance_margins(test):
            used = finite_used(margin)
            if used is None or used >= threshold:
                found.append(
                    (
                        used,
                        test["id"],
                        str(margin.get("what", "")),
                        [str(c) for c in test.get("clauses") or []],
                    )
                )
    return sorted(found, key=lambda f: (-(f[0] if f[0] is not None else float("inf")), f[1], f[2]))


def _clauses(clauses) -> str:
    return f"  (SPEC {', '.join(clauses)})" if clauses else ""


def _problems(cert: dict, path: Path | None = None) -> list:
    found = problems.not_passed(cert)
    bad = [p for p in found if p.kind != "not-run"]
    out = []
    if bad:
        out.append((f"did not pass ({len(bad)}):", _RED))
    for p in bad:
        out.append((f"  {problems.PROBLEM_KINDS[p.kind].upper()} {p.test}{_clauses(p.clauses)}", _RED))
        if p.reason:
            out.append((f"{_INDENT}{p.reason}", {}))
        out += [(f"{_INDENT}{w}", {}) for w in p.where]
        if p.input:
            out.append((f"{_INDENT}input: {p.input}", {}))
        out.append((f"{_INDENT}rerun: {p.rerun}", {}))
        if p.replayable:
            out.append((f"{_INDENT}replay: {p.replay(str(path) if path else 'CERT')}", {}))
    not_run = [p for p in found if p.kind == "not-run"]
    if not_run:
        out.append(
            (
                f"did not run here, so the run cannot be conformant (SPEC 4.4.2): {len(not_run)} suite tests",
                _YELLOW,
            )
        )
        by_reason = defaultdict(list)
        for p in not_run:
            by_reason[p.reason].append(p)
        for reason, group in by_reason.items():
            out.append((f"  {reason or '(no reason recorded)'} ({len(group)}):", _YELLOW))
            out += [(f"    {p.test}{_clauses(p.clauses)}", {}) for p in group]
    return out


def _expected(cert: dict) -> list:
    expected = problems.not_passed(cert, expected=True)
    if not expected:
        return []
    out = [(f"expected failures ({len(expected)}, declared by the implementation with their reasons):", {})]
    for p in expected:
        out.append((f"  {p.test}{_clauses(p.clauses)}", {}))
        if p.reason:
            out.append((f"{_INDENT}{p.reason}", {}))
    return out


def _near(cert: dict) -> list:
    near = near_bound(cert)
    if not near:
        return []
    out = [
        (
            f"near their bound (at least {report_model.percent(NEAR_BOUND)} of it): {len(near)} tolerance "
            "comparison(s)",
            _YELLOW,
        )
    ]
    for used, test, what, clauses in near:
        share = "outside" if used is None else report_model.percent(used)
        out.append((f"  {share:>8}  {test} :: {what}{_clauses(clauses)}", {}))
    return out


def lines(cert: dict, path: Path | None = None, instead_of: Path | None = None) -> list:
    """The section's ``(text, markup)`` lines for ``cert``, written to ``path`` (see the module docstring)."""
    verdict = cert["verdict"]
    out = [
        (
            headline(cert),
            {
                "bold": True,
                "green": verdict.startswith("conformant"),
                "red": verdict == "not-conformant",
                "yellow": verdict in ("partial", "incomplete", "inconclusive"),
            },
        ),
        (f"verdict: {verdict}: {cert['verdict_reason']}", {}),
        # what the verdict covers: the verdict says no test failed, this says which rules were checked
        (rules.line(cert), {}),
        (certificate.tier_line(cert), {}),
    ]
    out += _problems(cert, path)
    out += _expected(cert)
    out += _near(cert)
    out.append((f"exit status {cert['run']['exit_status']} ({verdict}; SPEC 4.4.9)", {}))
    out.append((profile_line(cert["profile"]), {}))
    hyp = cert["run"].get("hypothesis")
    if hyp:
        s = hyp["settings"]
        out.append(
            (
                f"hypothesis profile {hyp['profile']} (max_examples={s.get('max_examples')}, "
                f"derandomize={s.get('derandomize')})",
                {},
            )
        )
    if cert.get("capability_skips"):
        out.append(
            (
                "skipped for missing capabilities: "
                + ", ".join(f"{cap} {n}" for cap, n in cert["capability_skips"].items()),
                {},
            )
        )
    out += [(f"note: {note}", _YELLOW) for note in cert.get("notes") or ()]
    if cert.get("stale_expected_failures"):
        out.append(
            (
                "stale expected failures (match no test): " + ", ".join(cert["stale_expected_failures"]),
                _YELLOW,
            )
        )
    expectations = cert.get("expectations") or {}
    if expectations:
        out.append(
            (f"expectations {expectations.get('file')} (sha256 {str(expectations.get('sha256'))[:12]})", {})
        )
    for entry in expectations.get("stale") or ():
        out.append(
            (f"stale expectation (matches no test here): {entry.get('test')}: {entry.get('reason')}", _YELLOW)
        )
    passing = sum(
        1 for c in cert["clauses"].values() if not (c.get("failed") or c.get("error") or c.get("xpassed"))
    )
    out.append((f"clauses named by tests: {passing} of {len(cert['clauses'])} without failures", {}))
    if path is not None and instead_of is not None:
        out.append((f"certificate: {path} (not a complete run, so not written to {instead_of})", _YELLOW))
    elif path is not None:
        out.append((f"certificate: {path}", {}))
    return out
