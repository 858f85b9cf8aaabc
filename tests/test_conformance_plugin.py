"""The plugin's mechanics: --impl resolution, capability skips, expected failures, certificates,
and a broken implementation failing the clause it breaks (SPEC 4.1-4.4)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def repo_importable(monkeypatch):
    """The mutants live in tests/, which is not installed: the child pytest must find it."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))


def run_suite(pytester, impl, *extra, select=None):
    cert = pytester.path / "cert.json"
    args = [
        "--pyargs",
        "gefen_conformance",
        f"--impl={impl}",
        f"--certificate={cert}",
        "-p",
        "no:cacheprovider",
        "-q",
    ]
    if select:
        args += ["-k", select]
    result = pytester.runpytest_subprocess(*args, *extra)
    data = json.loads(cert.read_text()) if cert.exists() else None
    return result, data


def outcomes_by_clause(cert):
    failed = {}
    for t in cert["tests"]:
        if t["outcome"] in ("failed", "error"):
            for c in t["clauses"]:
                failed.setdefault(c, []).append(t["id"])
    return failed


def test_reference_selection_is_partial_and_its_certificate_says_what_ran(pytester):
    result, cert = run_suite(pytester, "reference", select="invalid or names or global_step")
    assert result.ret == 6  # partial (SPEC 4.4.9)
    assert cert["schema"] == "gefen-conformance-certificate/2"
    assert cert["implementation"]["name"] == "reference"
    assert cert["verdict"] == "partial"  # -k: never conformant, however many passed
    assert cert["summary"]["passed"] == len(cert["tests"]) == cert["run"]["executed_tests"] > 0
    assert cert["run"]["expected_tests"] > cert["run"]["executed_tests"]
    assert cert["run"]["narrowed_by"] == ["-k 'invalid or names or global_step'"]
    assert cert["run"]["hypothesis"]["profile"] == "gefen-certify"
    assert all(t["clauses"] for t in cert["tests"])
    assert {"python", "torch", "numpy", "byteorder"} <= set(cert["platform"])
    assert cert["profile"]["name"] == "torch-exact" and cert["profile"]["reason"] == "cpu-bit-exact declared"
    assert cert["execution"]["launcher"] == "pool"
    assert len(cert["suite"]["content_sha256"]) == 64
    assert set(cert["clauses"]["1.1.3"]) >= {"passed", "worst_margin"}
    # what the run certified, by rule: the rules its passing tests name, and no rule they do not
    from gefen_conformance.certificate import rules, verify

    assert (
        cert["rules"] == rules.section(cert["tests"], cert["profile"]["name"])
        and verify.schema_problems(cert) == []
    )
    named = {c for t in cert["tests"] for c in t["clauses"]} & rules.rule_ids()
    proven = named - set(cert["rules"]["ids"]["not-certified"]) - rules.unproven()
    assert set(cert["rules"]["ids"]["certified"]) == proven != set()
    assert set(cert["rules"]["ids"]["unproven"]) == named & rules.unproven()
    assert f"rules: {cert['rules']['summary']}" in result.stdout.str()


@pytest.mark.parametrize(
    "mutant,clause,select",
    [
        # the whole block-step module against a mutant: .ci/run runs it (the default run stays
        # under 5 minutes)
        pytest.param("tests.mutants:beta_rounding", "1.8", "block_step", marks=pytest.mark.slow),
        ("tests.mutants:global_step", "1.10.6", "global_step"),
        ("tests.mutants:zero_eps", "1.1.3", "invalid"),
    ],
)
def test_broken_implementation_fails_its_clause(narrow_certification, mutant, clause, select):
    status, path = narrow_certification(
        mutant, select
    )  # the global_step run is shared with test_certificate_diff
    cert = json.loads(path.read_text())
    assert status == 1
    assert cert["verdict"] == "not-conformant"  # a failure outranks the narrowed selection
    assert clause in outcomes_by_clause(cert), outcomes_by_clause(cert)
    for test in cert["tests"]:
        if test["outcome"] == "failed":
            # the failure's own message, on one line, not pytest's "file.py:123: Error" crash line
            assert test["reason"] and "\n" not in test["reason"] and len(test["reason"]) <= 400
            assert not re.search(r"\.py:\d+: \w+$", test["reason"]), test["reason"]


def test_capabilities_skip_and_expected_failures_are_strict_and_stale_ones_reported(pytester):
    result, cert = run_suite(
        pytester, "tests.mutants:partial", select="global_step or state_matches or factored"
    )
    by_id = {t["id"]: t for t in cert["tests"]}
    skipped = [t for t in cert["tests"] if t["outcome"] == "skipped"]
    assert skipped and all("lacks capability" in t["reason"] for t in skipped)
    assert sum(cert["capability_skips"].values()) >= len(skipped) and "factored-v" in cert["capability_skips"]
    assert "skipped for missing capabilities: " in result.stdout.str()
    # the listed test passes, so its strict xfail turns into a failure the certificate records
    assert by_id["test_optimizer.py::test_global_step_counts_every_step_call"]["outcome"] == "failed"
    assert cert["stale_expected_failures"] == ["test_optimizer.py::test_no_such_test"]
    assert "stale expected failures" in result.stdout.str()


def test_unknown_implementation_is_a_usage_error(pytester):
    result = pytester.runpytest_subprocess(
        "--pyargs", "gefen_conformance", "--impl=does-not-exist", "-p", "no:cacheprovider"
    )
    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert "does-not-exist" in result.stderr.str()


def test_a_rank_failure_reason_names_the_ranks_and_their_exception():
    from types import SimpleNamespace

    from gefen_conformance.harness.pool import RankFailure, RankOutcome
    from gefen_conformance.plugin.hooks import _reason

    failure = RankFailure(
        [
            RankOutcome(0, "ok"),
            RankOutcome(
                1,
                "raised",
                exc_type="ValueError",
                message="Gefen DCP checkpoint slot 3 has the wrong shape\nmore",
            ),
            RankOutcome(
                2, "hung", message="did not finish within the 60 s deadline; stacks dumped, process killed"
            ),
        ],
        "world_size=3, save_trained, timeout 60 s",
    )
    report = SimpleNamespace(
        failed=True, skipped=False, longrepr=None, longreprtext="ranks.py:860: RankFailure"
    )
    call = SimpleNamespace(excinfo=SimpleNamespace(value=failure))
    reason = _reason(report, call)
    assert reason.startswith("RankFailure: 2 of 3 ranks failed")
    assert "rank 1: raised ValueError: Gefen DCP checkpoint slot 3 has the wrong shape" in reason
    assert "rank 2: hung" in reason and "more" not in reason and "ranks.py" not in reason
