"""The conformance certificate: a JSON record of one suite run (SPEC 4.4).

Schema ``gefen-conformance-certificate/1``: the implementation (name, version, capabilities),
the suite (version, git commit when known), the platform (python, torch, numpy, OS, CPU),
the execution target, per-test results with the clause each names, per-clause counts, the
stale expected-failure entries and a verdict. The verdict is ``conformant`` only when no test
failed or errored; expected failures are listed and keep the verdict at
``conformant-with-expected-failures``.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Optional

SCHEMA = "gefen-conformance-certificate/1"


@dataclass
class TestRecord:
    nodeid: str
    clauses: list
    outcome: str  # passed | failed | error | skipped | xfailed | xpassed
    duration: float = 0.0
    reason: str = ""


@dataclass
class Run:
    implementation: dict
    records: dict = field(default_factory=dict)
    stale_expected_failures: list = field(default_factory=list)
    started: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))

    def record(self, rec: TestRecord) -> None:
        # setup errors/skips and call outcomes of one test collapse into one record; the worst wins
        order = ["passed", "skipped", "xfailed", "xpassed", "failed", "error"]
        old = self.records.get(rec.nodeid)
        if old is None or order.index(rec.outcome) >= order.index(old.outcome):
            if old is not None:
                rec.duration += old.duration
            self.records[rec.nodeid] = rec


def _suite_commit() -> Optional[str]:
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _version_of(dist: str) -> Optional[str]:
    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def platform_facts() -> dict:
    import numpy
    import torch

    return {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "os": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "byteorder": sys.byteorder,
    }


def verdict(counts: Counter) -> str:
    if counts["failed"] or counts["error"]:
        return "not-conformant"
    if counts["passed"] == 0:
        return "inconclusive"
    if counts["xfailed"]:
        return "conformant-with-expected-failures"
    return "conformant"


def build(run: Run) -> dict:
    counts = Counter(r.outcome for r in run.records.values())
    clauses: dict = defaultdict(Counter)
    for r in run.records.values():
        for c in r.clauses or ["(none)"]:
            clauses[c][r.outcome] += 1
    return {
        "schema": SCHEMA,
        "implementation": run.implementation,
        "profile": "torch-exact" if "cpu-bit-exact" in run.implementation.get("capabilities", ()) else "tolerance",
        "suite": {"name": "gefen-conformance", "version": _version_of("gefen-conformance"), "commit": _suite_commit()},
        "platform": platform_facts(),
        "execution": {"device": "cpu", "distributed_backend": "gloo"},
        "started": run.started,
        "finished": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "summary": {k: counts.get(k, 0) for k in ("passed", "failed", "error", "skipped", "xfailed", "xpassed")},
        "verdict": verdict(counts),
        "clauses": {c: dict(v) for c, v in sorted(clauses.items())},
        "stale_expected_failures": list(run.stale_expected_failures),
        "tests": [
            {"id": r.nodeid, "clauses": r.clauses, "outcome": r.outcome, "duration_s": round(r.duration, 3), "reason": r.reason}
            for r in sorted(run.records.values(), key=lambda r: r.nodeid)
        ],
    }


def write(run: Run, path: os.PathLike) -> dict:
    cert = build(run)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(cert, indent=2, sort_keys=False) + "\n")
    tmp.replace(path)
    return cert
