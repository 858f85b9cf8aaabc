"""Verdicts and exit statuses (SPEC 4.4.2, 4.4.9): a scenario that did not run for lack of ranks or
devices makes the run ``partial``, never ``conformant``; the terminal summary and the report lead
with what did not run and why; each verdict has one exit status, the same from ``pytest --impl``
and ``gefen-conformance certify``.

A run of ``certify --launcher torchrun --nproc-per-node 1`` skips every scenario of more than one
rank: it must not read "conformant" with exit 0. The slow test here runs exactly that; the fast
ones run a launcher of one rank on a selection.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from gefen_conformance.certificate import build as certificate
from gefen_conformance.certificate import report
from gefen_conformance.certificate.build import EXIT_STATUS, RunFacts
from gefen_conformance.exit_codes import ExitCode

REPO = Path(__file__).resolve().parents[1]
REASON = "needs 2 ranks; the one-rank launcher runs at most 1 (1 node(s), world size 1)"


def _facts(**overrides) -> RunFacts:
    base = dict(
        started="s",
        finished="f",
        interrupted=None,
        narrowed_by=[],
        expected_tests=3,
        executed_tests=3,
        hypothesis=None,
        exit_status=0,
    )
    return RunFacts(**{**base, **overrides})


def test_a_scenario_that_did_not_run_here_makes_a_whole_run_partial():
    not_run = [
        {"id": "test_dcp_reshard.py::test_x[2->4]", "reason": REASON},
        {"id": "test_dcp_failures.py::test_y", "reason": REASON},
    ]
    facts = _facts(not_run=not_run)
    assert not facts.complete
    verdict, reason = certificate.verdict(Counter(passed=1, skipped=2), facts)
    assert verdict == "partial"
    assert reason == f"1 of 3 suite tests ran; 2 did not run here ({REASON}: 2)"
    assert facts.as_dict()["not_run"] == not_run
    # a capability skip is the implementation's claim: it leaves the run complete
    assert certificate.verdict(Counter(passed=1, skipped=2), _facts())[0] == "conformant"


def test_a_failure_still_outranks_what_did_not_run():
    facts = _facts(not_run=[{"id": "t", "reason": REASON}])
    assert certificate.verdict(Counter(passed=1, failed=1, skipped=1), facts)[0] == "not-conformant"


def test_one_exit_status_per_verdict():
    assert EXIT_STATUS == {
        "conformant": 0,
        "conformant-with-expected-failures": 0,
        "not-conformant": 1,
        "incomplete": 2,
        "partial": 6,
        "inconclusive": 7,
    }
    assert ExitCode.USAGE_ERROR == 4
    from gefen_conformance.certificate.read import VERDICTS

    assert set(EXIT_STATUS) == set(VERDICTS)  # every verdict a certificate can carry has its status


def test_the_report_leads_with_what_did_not_run():
    cert = json.loads((REPO / "tests" / "fixtures" / "certificates" / "reference-partial.json").read_text())
    cert["run"]["not_run"] = [{"id": "test_dcp_reshard.py::test_x[2->4]", "reason": REASON}]
    md = report.render(cert, "md")
    verdict_at, not_run_at, clauses_at = (
        md.index("**Verdict"),
        md.index("## Did not pass ("),
        md.index("## Clauses"),
    )
    assert "did not run" in md[not_run_at:clauses_at].lower() and REASON.splitlines()[0][:40] in md
    assert verdict_at < not_run_at < clauses_at
    assert "test\\_x\\[2->4\\]" in md or "test_x[2->4]" in md
    html = report.render(cert, "html")
    assert html.index("Did not pass (") < html.index("test_x[2-&gt;4]") < html.index("Clauses")


ONE_RANK = '''
from gefen_conformance.harness import launch

class OneRank(launch.PoolLauncher):
    """The pool, limited to worlds of one rank (as a torchrun job of one rank is)."""
    def execution(self):
        from dataclasses import replace
        return replace(super().execution(), launcher="one-rank", world_size=1, max_world_size=1)

def pytest_configure(config):
    launch.set_launcher(OneRank())
'''


# a whole suite run in a subprocess: .ci/run runs it (the default run stays under 5 minutes)
@pytest.mark.slow
def test_a_launcher_too_small_for_a_scenario_lists_it_as_not_run_and_exits_partial(pytester):
    pytester.makepyfile(one_rank=ONE_RANK)
    cert_path = pytester.path / "c.json"
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "-p",
        "one_rank",
        "--impl=reference",
        f"--certificate={cert_path}",
        "-k",
        "test_rank_killed_mid_save or test_global_step",
    )
    out = result.stdout.str()
    assert result.ret == EXIT_STATUS["partial"] == 6, out + result.stderr.str()
    cert = json.loads(cert_path.read_text())
    assert cert["verdict"] == "partial" and cert["run"]["exit_status"] == 6
    assert cert["run"]["not_run"] == [
        {
            "id": "test_dcp_failures.py::"
            "test_rank_killed_mid_save_commits_nothing_and_earlier_checkpoint_loads",
            "reason": REASON,
        }
    ]
    assert "1 did not run here (" + REASON in cert["verdict_reason"]
    lines = out[out.index("gefen conformance") :].splitlines()
    assert lines[2].startswith("verdict: partial") and lines[3] == f"rules: {cert['rules']['summary']}"
    assert lines[4].startswith("tier: default (SPEC 4.3.16)")
    assert "did not run here" in lines[5]
    assert lines[6] == f"  {REASON} (1):"  # grouped by reason (SPEC 4.4.12)
    assert lines[7].startswith(
        "    test_dcp_failures.py::test_rank_killed_mid_save_commits_nothing_and_earlier_checkpoint_loads"
    )
    assert "exit status 6 (partial" in out


@pytest.mark.slow
def test_certify_under_a_torchrun_job_of_one_rank_is_partial_and_names_every_scenario_it_skipped(tmp_path):
    """The whole suite on a torchrun job of one rank."""
    cert_path = tmp_path / "c.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gefen_conformance.cli",
            "certify",
            "--impl",
            "reference",
            "--launcher",
            "torchrun",
            "--nproc-per-node",
            "1",
            "--out",
            str(cert_path),
            "--",
            "-q",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert result.returncode == 6, result.stdout[-3000:] + result.stderr[-3000:]
    cert = json.loads(cert_path.read_text())
    assert cert["verdict"] == "partial" and not cert["run"]["complete"]
    assert "conformant" not in result.stdout.split("verdict:")[1].splitlines()[0]
    skipped = {t["id"] for t in cert["tests"] if t["outcome"] == "skipped"}
    not_run = {e["id"]: e["reason"] for e in cert["run"]["not_run"]}
    capability = {t["id"] for t in cert["tests"] if "lacks capability" in t["reason"]}
    # SPEC 2.3.6's examples bind classes that declare their state layout: the reference skips them
    declared_only = {t["id"] for t in cert["tests"] if "declares no state layout" in t["reason"]}
    assert len(declared_only) == 4, sorted(declared_only)
    assert set(not_run) == skipped - capability - declared_only and len(not_run) >= 40
    assert all("the torchrun launcher runs at most 1" in reason for reason in not_run.values())
    assert cert["summary"]["failed"] == 0 and cert["summary"]["error"] == 0
