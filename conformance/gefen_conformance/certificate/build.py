"""The conformance certificate: a JSON record of one suite run (SPEC 4.4).

Schema ``gefen-conformance-certificate/2``, keys in this order: ``schema``, ``implementation``,
``profile`` (the numeric profile and every tolerance applied), ``suite`` (name, version, content
hash, git state), ``platform``, ``execution`` (how ranks were launched), ``run`` (start, finish,
whether the whole suite ran, interruption, what narrowed it, expected and executed test counts, the
hypothesis profile, the exit status), ``summary``, ``verdict``, ``verdict_reason``, ``rules`` (which
of the SPEC's rules the tests certified, what the verdict covers:
:func:`gefen_conformance.certificate.rules.section`), ``capability_skips``, ``clauses`` (counts and
the worst tolerance margin per clause), ``notes``, ``stale_expected_failures`` and ``tests`` (id,
clauses, outcome, duration, reason, where, margins, notes). ``implementation`` holds ``spec``, the
``--impl`` value the run was given, so that a rerun command names the same implementation (SPEC
4.4.1, 4.5.5).

The verdict never claims more than was run; see :func:`verdict`.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from gefen_conformance.certificate import outputs, rules
from gefen_conformance.certificate.outcomes import OUTCOMES, SEVERITY, Outcome, Verdict
from gefen_conformance.exit_codes import ExitCode

SCHEMA = "gefen-conformance-certificate/2"
REASON_CHARS = 400
#: The exit status of a suite run by its verdict (SPEC 4.4.9): the one table ``pytest --impl``,
#: ``gefen-conformance certify`` and a CI job use. Only a conformant run exits 0 (expected failures
#: are declared, each with its reason, and each ran as a strict expected failure); 1, 2 and 4 mean
#: what they mean to pytest (tests failed, interrupted, usage error).
EXIT_STATUS = {
    Verdict.CONFORMANT: ExitCode.OK,
    Verdict.CONFORMANT_WITH_EXPECTED_FAILURES: ExitCode.OK,
    Verdict.NOT_CONFORMANT: ExitCode.FAILED,
    Verdict.INCOMPLETE: ExitCode.INTERRUPTED,
    Verdict.PARTIAL: ExitCode.PARTIAL,
    Verdict.INCONCLUSIVE: ExitCode.INCONCLUSIVE,
}
#: What each verdict's exit status tells a reader, beyond the verdict's name (SPEC 4.4.9).
VERDICT_MEANINGS = {
    "conformant": "",
    "conformant-with-expected-failures": "every expected failure is declared with its reason and ran "
    "as a strict "
    "xfail; read the verdict to refuse them",
    "not-conformant": "a test failed, errored or passed unexpectedly, also when the run was then interrupted",
    "incomplete": "interrupted (Ctrl-C, SIGTERM)",
    "partial": "narrowed (-k, -m, node ids, -x, another hypothesis profile), or scenarios did not run "
    "here for "
    "lack of ranks or devices",
    "inconclusive": "no test passed",
}
#: The statuses a suite run has without a verdict.
OTHER_EXIT_STATUSES = {
    ExitCode.USAGE_ERROR: "usage error: nothing ran, no certificate (an unknown option or test id, an "
    "unusable --impl or --gefen-device, options that do not fit, an output that cannot be written)",
    ExitCode.INTERNAL_ERROR: "pytest's internal error, no certificate",
    ExitCode.NO_TESTS_COLLECTED: "pytest collected no test, no certificate",
}


def exit_status_rows() -> list[tuple[int, list[str], str]]:
    """``(status, verdicts, meaning)`` for every exit status of a suite run, by status: the one
    table that ``gefen-conformance certify --help`` and docs/certificates.md show (SPEC 4.4.9)."""
    rows: dict = {}
    for name, status in EXIT_STATUS.items():
        verdicts, meanings = rows.setdefault(status, ([], []))
        verdicts.append(getattr(name, "value", name))
        if VERDICT_MEANINGS.get(name):
            meanings.append(VERDICT_MEANINGS[name])
    out = [(status, verdicts, "; ".join(meanings)) for status, (verdicts, meanings) in rows.items()]
    out += [(status, [], meaning) for status, meaning in OTHER_EXIT_STATUSES.items()]
    return sorted(out, key=lambda row: row[0])


def now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def cut(text: str, limit: int = REASON_CHARS) -> str:
    """``text`` on one line, at most ``limit`` characters."""
    flat = " | ".join(line.rstrip() for line in str(text).strip().splitlines() if line.strip())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


@dataclass
class TestRecord:
    __test__ = False  # not a pytest test class

    nodeid: str
    clauses: list
    outcome: Outcome
    duration: float = 0.0
    reason: str = ""
    margins: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    missing_capabilities: list = field(
        default_factory=list
    )  # capability tags, when a missing capability skipped it
    not_run: bool = False  # skipped because this run had too few ranks or devices (SPEC 4.4.2)
    where: list = field(
        default_factory=list
    )  # "rank N: file:line in function" of the ranks that failed or hung
    repro: bytes | None = (
        None  # a failed comparison's reproducer, written beside the certificate (SPEC 4.5.6)
    )
    input: str | None = None  # the failing input in words (the reproducer's case, described)

    def __post_init__(self):
        self.outcome = Outcome(self.outcome)
        self.missing_capabilities = [str(c) for c in self.missing_capabilities]


@dataclass
class RunRecord:
    """What the plugin gathered about one run; :func:`build` turns it into the certificate."""

    implementation: dict
    records: dict = field(default_factory=dict)
    stale_expected_failures: list = field(default_factory=list)
    expectations: dict | None = None  # the expectations file's record (SPEC 4.4.14)
    started: str = field(default_factory=now)
    world_sizes: set = field(default_factory=set)  # sizes of the multi-rank scenario calls that ran
    warm_up_s: float | None = None  # the slowest test process's warm-up (SPEC 4.2.11)
    notes: list = field(default_factory=list)  # run-level notes (the warm-up's), before the tests'

    def warmed_up(self, seconds: float, notes=()) -> None:
        """A test process's warm-up: the run records the slowest (xdist workers warm up at once)."""
        self.warm_up_s = max(self.warm_up_s or 0.0, float(seconds))
        self.notes += [n for n in notes if n not in self.notes]

    def add(self, rec: TestRecord) -> None:
        old = self.records.get(rec.nodeid)
        if old is None:
            self.records[rec.nodeid] = rec
            return
        worst = rec if SEVERITY.index(rec.outcome) >= SEVERITY.index(old.outcome) else old
        merged = TestRecord(
            rec.nodeid,
            old.clauses or rec.clauses,
            worst.outcome,
            old.duration + rec.duration,
            worst.reason or old.reason or rec.reason,
            old.margins + rec.margins,
            old.notes + [n for n in rec.notes if n not in old.notes],
            old.missing_capabilities or rec.missing_capabilities,
            (old.not_run or rec.not_run) and worst.outcome == Outcome.SKIPPED,
            old.where + [w for w in rec.where if w not in old.where],
            rec.repro or old.repro,
            rec.input or old.input,
        )
        self.records[rec.nodeid] = merged


@dataclass
class RunFacts:
    """The certificate's ``run`` entry."""

    started: str
    finished: str
    interrupted: str | None  # the signal's name, None when the run was not interrupted
    narrowed_by: list
    expected_tests: int | None
    executed_tests: int
    hypothesis: dict | None
    exit_status: int
    not_run: list = field(default_factory=list)  # [{"id", "reason"}]: skipped for too few ranks or devices

    @property
    def complete(self) -> bool:
        return (
            self.interrupted is None
            and not self.narrowed_by
            and not self.not_run
            and self.expected_tests is not None
            and self.executed_tests >= self.expected_tests
        )

    def as_dict(self) -> dict:
        return {
            "started": self.started,
            "finished": self.finished,
            "complete": self.complete,
            "interrupted": self.interrupted is not None,
            "narrowed_by": list(self.narrowed_by),
            "not_run": [dict(entry) for entry in self.not_run],
            "expected_tests": self.expected_tests,
            "executed_tests": self.executed_tests,
            "hypothesis": self.hypothesis,
            "exit_status": int(self.exit_status),
        }


def _version_of(dist: str) -> str | None:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def _loaded_version(module: str, dist: str) -> str | None:
    """The version of ``module`` as imported, else its distribution's (never imports it: a run
    interrupted before torch was loaded writes its certificate at once)."""
    loaded = sys.modules.get(module)
    return getattr(loaded, "__version__", None) if loaded is not None else _version_of(dist)


def platform_facts() -> dict:
    return {
        "python": sys.version.split()[0],
        "torch": _loaded_version("torch", "torch"),
        "numpy": _loaded_version("numpy", "numpy"),
        "os": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "byteorder": sys.byteorder,
    }


def tier_line(cert: dict) -> str:
    """The line a reader prints beside a certificate's verdict saying which tier ran (SPEC 4.3.16):
    a certificate of the default tier claims nothing of scale."""
    tier = (cert.get("execution") or {}).get("tier") or "default"
    if tier == "scale":
        return "tier: scale (SPEC 4.3.16): the default tier and parameters and runs the size of real models"
    return (
        "tier: default (SPEC 4.3.16): the scale tier did not run, so this certificate claims nothing "
        "of scale (gefen-conformance certify --tier scale)"
    )


def execution_facts(world_sizes=(), warm_up_s: float | None = None, *, tier: str = "default") -> dict:
    """How the suite's ranks ran (SPEC 4.4.1, 4.6.5): the active launcher's description
    (:func:`gefen_conformance.harness.launch.execution`: launcher, nodes, world size, largest scenario,
    backend,
    device type and device names), ``world_sizes``, the scenario sizes this run actually ran
    (sorted, each once; empty when no multi-rank scenario ran), ``warm_up_s``, the seconds the
    warm-up took before the first test (null when none ran, SPEC 4.2.11), and
    ``deadline_scale``, the factor every deadline was scaled by (SPEC 4.2.10), and ``tier``, the
    suite's tier the run ran (SPEC 4.3.16: ``scale`` holds the default tier and more)."""
    from gefen_conformance.harness import deadlines, launch

    return {
        **launch.execution().as_dict(),
        "world_sizes": sorted({int(size) for size in world_sizes}),
        "warm_up_s": None if warm_up_s is None else round(float(warm_up_s), 2),
        "deadline_scale": deadlines.scale(),
        "tier": tier,
    }


def profile_facts(capabilities, device=None) -> dict:
    """The numeric profile applied (SPEC 0.4.3, 4.1.3, 4.6.4), with every bound it applies: the
    bitwise ``torch-exact`` profile only for a ``cpu-bit-exact`` implementation on CPU, the
    ``tolerance`` profile otherwise; ``device`` defaults to the run's (``--gefen-device``)."""
    from gefen_conformance.certificate import numeric_profile
    from gefen_conformance.harness import devices

    return numeric_profile.choose(capabilities, devices.selected() if device is None else device).described()


def suite_facts(git: bool = True) -> dict:
    from gefen_conformance.certificate import provenance

    described = provenance.describe() if git else {"content_sha256": provenance.content_sha256()}
    return {"name": "gefen-conformance", "version": _version_of("gefen-conformance"), **described}


def not_run_summary(not_run) -> str:
    """``"50 did not run here (needs 2 ranks; ...: 50)"``: the scenarios a run could not hold,
    grouped by reason (SPEC 4.4.2)."""
    reasons = Counter(entry["reason"] for entry in not_run)
    listed = "; ".join(f"{reason}: {count}" for reason, count in reasons.most_common())
    return f"{len(not_run)} did not run here ({listed})"


def verdict(counts: Counter, facts: RunFacts) -> tuple[Verdict, str]:
    """``(verdict, reason)``. Precedence: a failed, erroring or unexpectedly passing test makes the
    run ``not-conformant``; else an interrupted run is ``incomplete``; else a narrowed one, or one
    where scenarios did not run for lack of ranks or devices, ``partial``; else one where no test
    passed ``inconclusive``; else expected failures make it ``conformant-with-expected-failures``;
    else ``conformant``."""
    ran = facts.executed_tests - len(facts.not_run)
    of = f"{ran} of {facts.expected_tests if facts.expected_tests is not None else '?'} suite tests ran"
    bad = [
        f"{counts[k]} {label}"
        for k, label in (
            (Outcome.FAILED, "failed"),
            (Outcome.ERROR, "errors"),
            (Outcome.XPASSED, "unexpectedly passed"),
        )
        if counts[k]
    ]
    if bad:
        extra = f" (run interrupted by {facts.interrupted})" if facts.interrupted else ""
        return Verdict.NOT_CONFORMANT, f"{of}; " + ", ".join(bad) + extra
    if facts.interrupted:
        return Verdict.INCOMPLETE, f"interrupted by {facts.interrupted}: {of}"
    if not facts.complete:
        parts = [not_run_summary(facts.not_run)] if facts.not_run else []
        if facts.narrowed_by:
            parts.append("narrowed by " + "; ".join(facts.narrowed_by))
        return Verdict.PARTIAL, f"{of}; " + ("; ".join(parts) or "the whole suite's size is unknown")
    if counts[Outcome.PASSED] == 0:
        return Verdict.INCONCLUSIVE, f"{of}; none passed ({counts[Outcome.SKIPPED]} skipped)"
    if counts[Outcome.XFAILED]:
        return (
            Verdict.CONFORMANT_WITH_EXPECTED_FAILURES,
            f"{of}; {counts[Outcome.XFAILED]} expected failures, none failed",
        )
    return Verdict.CONFORMANT, f"{of}; none failed"


def _worst_margin(records) -> dict | None:
    worst = None
    for rec in records:
        for m in rec.margins:
            used = m.get("used")
            if m.get("kind") == "tolerance" and used is not None and (worst is None or used > worst["used"]):
                worst = {"test": rec.nodeid, "what": m.get("what"), "used": used}
    return worst


def build(
    run: RunRecord, facts: RunFacts, *, profile: dict, suite: dict, platform_: dict, execution: dict
) -> dict:
    records = sorted(run.records.values(), key=lambda r: r.nodeid)
    counts = Counter(r.outcome for r in records)
    by_clause: dict = defaultdict(list)
    for r in records:
        for c in r.clauses or ["(none)"]:
            by_clause[c].append(r)
    clauses = {}
    for c, recs in sorted(by_clause.items()):
        tally = Counter(r.outcome for r in recs)
        clauses[c] = {**{k.value: tally.get(k, 0) for k in OUTCOMES}, "worst_margin": _worst_margin(recs)}
    skips = Counter(cap for r in records if r.outcome == Outcome.SKIPPED for cap in r.missing_capabilities)
    notes = list(run.notes)
    for r in records:
        notes += [n for n in r.notes if n not in notes]
    name, reason = verdict(counts, facts)
    tests = [
        {
            "id": r.nodeid,
            "clauses": r.clauses,
            "outcome": r.outcome.value,
            "duration_s": round(r.duration, 3),
            "reason": r.reason,
            "where": list(r.where),
            **({"input": r.input} if r.input else {}),
            **({"missing_capabilities": list(r.missing_capabilities)} if r.missing_capabilities else {}),
            "margins": r.margins,
            "notes": r.notes,
        }
        for r in records
    ]
    return {
        "schema": SCHEMA,
        "implementation": run.implementation,
        "profile": profile,
        "suite": suite,
        "platform": platform_,
        "execution": execution,
        "run": facts.as_dict(),
        "summary": {k.value: counts.get(k, 0) for k in OUTCOMES},
        "verdict": name.value,
        "verdict_reason": reason,
        "rules": rules.section(tests, profile.get("name") or "torch-exact"),
        "capability_skips": dict(sorted(skips.items())),
        "clauses": clauses,
        "notes": notes,
        "stale_expected_failures": list(run.stale_expected_failures),
        **({"expectations": run.expectations} if run.expectations is not None else {}),
        "tests": tests,
    }


def partial_path(path: Path) -> Path:
    """Where a run that is not complete goes when ``path`` holds a complete certificate."""
    stem = path.name[: -len(".json")] if path.name.endswith(".json") else path.name
    return path.with_name(f"{stem}.partial.json")


def holds_complete_certificate(path: Path) -> bool:
    """True when ``path`` is a certificate of a complete run (schema 1 had no such flag: kept too)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError):
        return False
    if not isinstance(data, dict) or not str(data.get("schema", "")).startswith(
        "gefen-conformance-certificate/"
    ):
        return False
    if data["schema"].endswith("/1"):
        return True
    return bool(isinstance(data.get("run"), dict) and data["run"].get("complete"))


def destination(requested: Path, cert: dict) -> Path:
    """``requested``, unless this run is not complete and ``requested`` holds a complete certificate:
    a partial or interrupted run never replaces a complete one (SPEC 4.4.5)."""
    if not cert["run"]["complete"] and holds_complete_certificate(requested):
        return partial_path(requested)
    return requested


def integrity(cert: dict) -> str:
    """SHA-256 of the certificate's canonical JSON (sorted keys, no whitespace) without its own
    ``integrity`` entry: ``gefen-conformance verify`` recomputes it, so an edit by hand that leaves
    it behind shows (SPEC 4.4.15)."""
    body = {k: v for k, v in cert.items() if k != "integrity"}
    return hashlib.sha256(json.dumps(body, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def write(cert: dict, path: os.PathLike) -> Path:
    """Write ``cert`` to ``path`` with its integrity digest."""
    cert["integrity"] = {"sha256": integrity(cert)}
    return outputs.write_text(path, json.dumps(cert, indent=2) + "\n")
