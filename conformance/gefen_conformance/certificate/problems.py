"""What did not pass in a certificate, as every report leads with it (SPEC 4.5.2, 4.5.5).

:func:`not_passed` lists the failed, errored and unexpectedly passing tests, and those that did
not run here for lack of ranks or devices (:func:`not_run`), worst kind first, each with its
clauses, its one-line reason, where a rank failed, and :func:`rerun_command`, the command that runs
exactly that test again as the certified run ran it.
"""

from __future__ import annotations

from dataclasses import dataclass

from gefen_conformance.certificate.outcomes import Outcome


def not_run(cert: dict) -> list:
    """``[{"id", "reason"}]``: the suite tests this run could not hold (too few ranks or devices,
    SPEC 4.4.2), which a report shows right after the verdict."""
    entries = (cert.get("run") or {}).get("not_run") or []
    return [e for e in entries if isinstance(e, dict) and "id" in e]


#: How each kind of problem is named, worst first.
PROBLEM_KINDS = {
    "failed": "failed",
    "error": "errored",
    "xpassed": "unexpectedly passed",
    "not-run": "did not run",
    "xfailed": "expected failure",
}


@dataclass
class NotPassed:
    """One test that did not pass, as the reports lead with it."""

    test: str
    kind: str  # a key of PROBLEM_KINDS
    clauses: list
    reason: str  # its first line
    where: list  # "rank N: file:line in function" lines, when a rank failed or hung
    rerun: str
    input: str = ""  # the failing input in words, when the test left a reproducer
    replayable: bool = False  # whether ``gefen-conformance repro`` can replay it

    def replay(self, certificate: str = "CERT") -> str:
        """The command that replays the failed comparison from its reproducer (SPEC 4.5.6)."""
        return f"gefen-conformance repro {certificate} '{self.test}'"


def first_line(text, limit: int = 240) -> str:
    line = next((part.strip() for part in str(text or "").splitlines() if part.strip()), "")
    return line if len(line) <= limit else line[: limit - 1] + "\u2026"


def did_not_run(test: dict, not_run_ids) -> bool:
    """A skip that leaves a scenario unjudged: too few ranks or devices for it, as the run recorded
    in ``run.not_run`` (SPEC 4.4.2). A skip for a capability the implementation does not declare
    is its claim (SPEC 4.1.3), not a scenario left unjudged."""
    return test["outcome"] == Outcome.SKIPPED and test["id"] in not_run_ids


def not_passed(cert: dict, *, expected: bool = False) -> list:
    """What did not pass, worst kind first (failed, errored, unexpectedly passed, did not run); with
    ``expected``, the expected failures instead."""
    kinds = ("xfailed",) if expected else ("failed", "error", "xpassed", "not-run")
    not_run_ids = {e["id"] for e in not_run(cert)}
    out = []
    for test in cert["tests"]:
        kind = "not-run" if did_not_run(test, not_run_ids) else test["outcome"]
        if kind in kinds:
            out.append(
                NotPassed(
                    test["id"],
                    kind,
                    [str(c) for c in test.get("clauses") or []],
                    first_line(test.get("reason")),
                    [str(w) for w in test.get("where") or []],
                    rerun_command(cert, test["id"]),
                    str(test.get("input") or ""),
                    bool(test.get("repro")),
                )
            )
    if not expected:  # scenarios the run recorded as not run here without a test record of their own
        seen = {p.test for p in out}
        out += [
            NotPassed(e["id"], "not-run", [], first_line(e.get("reason")), [], rerun_command(cert, e["id"]))
            for e in not_run(cert)
            if e["id"] not in seen
        ]
    return sorted(out, key=lambda p: kinds.index(p.kind))


def _quote(word: str) -> str:
    import shlex

    return shlex.quote(word)


def rerun_command(cert: dict, test_id: str) -> str:
    """The command that runs exactly ``test_id`` again as this run ran it (SPEC 4.5.5): the same
    implementation spec, device, launcher and world, from any directory."""
    impl = cert.get("implementation") or {}
    spec = impl.get("spec") or impl.get("name") or "reference"
    ex = cert.get("execution") or {}
    device = ex.get("device_type") or "cpu"
    if ex.get("launcher") == "torchrun":
        words = ["gefen-conformance", "certify", "--impl", spec, "--launcher", "torchrun"]
        if ex.get("world_size"):
            words += ["--nproc-per-node", str(ex["world_size"] // max(int(ex.get("nodes") or 1), 1))]
        if device != "cpu":
            words += ["--device", device]
        return " ".join(map(_quote, words + [test_id]))
    words = (
        ["pytest", f"--impl={spec}"] + ([f"--gefen-device={device}"] if device != "cpu" else []) + [test_id]
    )
    return " ".join(map(_quote, words))
