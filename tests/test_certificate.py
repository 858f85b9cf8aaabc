"""The certificate's verdict rules, its per-clause margins, its rules section (SPEC 4.4.17: built,
verified and merged) and where an incomplete run is written (SPEC 4.4), without running the suite."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from gefen_conformance.certificate import build as certificate
from gefen_conformance.certificate import rules
from gefen_conformance.certificate.build import RunFacts, TestRecord


def facts(**overrides) -> RunFacts:
    base = dict(
        started="s",
        finished="f",
        interrupted=None,
        narrowed_by=[],
        expected_tests=4,
        executed_tests=4,
        hypothesis={"profile": "gefen-certify", "settings": {}},
        exit_status=0,
    )
    return RunFacts(**{**base, **overrides})


def run_of(*outcomes) -> certificate.RunRecord:
    run = certificate.RunRecord(implementation={"name": "x", "version": "1", "capabilities": []})
    for i, outcome in enumerate(outcomes):
        run.add(TestRecord(f"test_m.py::t{i}", ["1.8"], outcome))
    return run


@pytest.mark.parametrize(
    "counts,overrides,expected",
    [
        ({"passed": 4}, {}, "conformant"),
        ({"passed": 3, "xfailed": 1}, {}, "conformant-with-expected-failures"),
        ({"skipped": 4}, {}, "inconclusive"),
        ({"passed": 2}, {"executed_tests": 2, "narrowed_by": ["-k names"]}, "partial"),
        ({"passed": 3}, {"executed_tests": 3}, "partial"),  # one suite test never ran, whatever the reason
        ({"passed": 4}, {"expected_tests": None}, "partial"),  # the suite's size is unknown
        ({"passed": 4}, {"narrowed_by": ["hypothesis profile gefen-fuzz (max_examples=5000)"]}, "partial"),
        ({"passed": 2}, {"executed_tests": 2, "interrupted": "SIGINT"}, "incomplete"),
        (
            {"passed": 2},
            {"executed_tests": 2, "interrupted": "SIGINT", "narrowed_by": ["-k x"]},
            "incomplete",
        ),
        ({"passed": 1, "failed": 1}, {"executed_tests": 2, "interrupted": "SIGINT"}, "not-conformant"),
        ({"passed": 1, "error": 1}, {"executed_tests": 2, "narrowed_by": ["-k x"]}, "not-conformant"),
        ({"passed": 3, "xpassed": 1}, {}, "not-conformant"),
    ],
)
def test_verdict_precedence(counts, overrides, expected):
    verdict, reason = certificate.verdict(Counter(counts), facts(**overrides))
    assert verdict == expected, reason
    assert reason


def test_partial_reason_names_what_narrowed_the_run():
    verdict, reason = certificate.verdict(
        Counter(passed=2), facts(executed_tests=2, narrowed_by=["-k test_dcp_names"])
    )
    assert verdict == "partial" and "2 of 4" in reason and "-k test_dcp_names" in reason


def test_complete_needs_every_expected_test_and_no_narrowing():
    assert facts().complete
    assert not facts(executed_tests=3).complete
    assert not facts(interrupted="SIGTERM").complete
    assert not facts(narrowed_by=["--deselect x"]).complete
    assert not facts(expected_tests=None).complete


def test_build_keeps_schema_2_keys_in_order_with_margins_notes_and_skips(monkeypatch):
    # a rule the suite names that no mutant has been shown to fail for (the shipped list is empty)
    monkeypatch.setattr(rules, "unproven", lambda: frozenset({"3.8.1"}))
    run = certificate.RunRecord(implementation={"name": "x", "version": "1", "capabilities": []})
    tol = [
        {"what": "param", "kind": "tolerance", "error": 1e-6, "bound": 1e-4, "used": 0.01},
        {"what": "state", "kind": "tolerance", "error": 1.0, "bound": 0.0, "used": None},
    ]
    run.add(
        TestRecord(
            "test_a.py::t1", ["1.8", "1.4", "3.8.1"], "passed", 0.5, "", tol, ["golden md5s not compared"]
        )
    )
    run.add(
        TestRecord(
            "test_a.py::t2",
            ["1.8"],
            "passed",
            0.5,
            "",
            [
                {"what": "m", "kind": "tolerance", "error": 3e-5, "bound": 1e-4, "used": 0.3},
                {"what": "b", "kind": "bitwise", "differing": 0, "total": 8},
            ],
            ["golden md5s not compared"],
        )
    )
    run.add(
        TestRecord(
            "test_b.py::t3",
            ["1.9", "1.1.2#6"],
            "skipped",
            0.0,
            "x lacks capability factored-v",
            [],
            [],
            ["factored-v"],
        )
    )
    cert = certificate.build(
        run,
        facts(expected_tests=3, executed_tests=3),
        profile={"name": "tolerance"},
        suite={"name": "s"},
        platform_={},
        execution=certificate.execution_facts(),
    )
    assert list(cert) == [
        "schema",
        "implementation",
        "profile",
        "suite",
        "platform",
        "execution",
        "run",
        "summary",
        "verdict",
        "verdict_reason",
        "rules",
        "capability_skips",
        "clauses",
        "notes",
        "stale_expected_failures",
        "tests",
    ]
    assert cert["schema"] == "gefen-conformance-certificate/2"
    # what the verdict covers, by rule: a section (1.8) or a clause of several rules certifies none
    assert cert["rules"] == rules.section(cert["tests"], cert["profile"]["name"])
    # 3.8.1 is named and passed, but (as listed above) no mutant has been shown to fail for it alone
    assert cert["rules"]["ids"]["unproven"] == ["3.8.1"] and cert["rules"]["ids"]["certified"] == []
    assert cert["rules"]["ids"]["skipped"] == ["1.1.2#6"]
    assert cert["rules"]["counts"]["failed"] == 0 and cert["rules"]["ids"]["failed"] == []
    assert cert["rules"]["summary"].startswith(
        f"0 of {cert['rules']['total']} rules certified; 1 checked without a mutant proof; "
        "1 skipped for a missing capability; "
    )
    assert cert["clauses"]["1.8"]["worst_margin"] == {"test": "test_a.py::t2", "what": "m", "used": 0.3}
    assert (
        cert["clauses"]["1.4"]["worst_margin"]["used"] == 0.01
    )  # an outright failure (None) is not a margin
    assert cert["clauses"]["1.9"]["worst_margin"] is None
    assert cert["capability_skips"] == {"factored-v": 1}
    assert cert["notes"] == ["golden md5s not compared"]
    assert cert["run"]["complete"] and cert["verdict"] == "conformant"
    assert cert["tests"][0]["margins"] == tol
    json.dumps(cert)  # JSON all the way down


def test_setup_and_call_reports_of_one_test_collapse_worst_first():
    run = certificate.RunRecord(implementation={})
    run.add(TestRecord("t", ["1"], "passed", 1.0, "", [{"what": "a"}], ["n1"]))
    run.add(TestRecord("t", ["1"], "error", 0.5, "RuntimeError: teardown", [], ["n1", "n2"]))
    rec = run.records["t"]
    assert (rec.outcome, rec.reason, rec.duration, rec.notes) == (
        "error",
        "RuntimeError: teardown",
        1.5,
        ["n1", "n2"],
    )


def test_cut_makes_one_line_of_bounded_length():
    text = certificate.cut("AssertionError: first\n\n  second\n" + "x" * 1000)
    assert (
        "\n" not in text
        and len(text) <= certificate.REASON_CHARS
        and text.startswith("AssertionError: first | ")
    )


def test_a_run_that_is_not_complete_never_replaces_a_complete_certificate(tmp_path):
    target = tmp_path / "gefen-certificate-x.json"
    partial = {"run": {"complete": False}}
    assert certificate.destination(target, partial) == target  # nothing there yet
    certificate.write({"schema": certificate.SCHEMA, "run": {"complete": True}}, target)
    assert certificate.destination(target, partial) == tmp_path / "gefen-certificate-x.partial.json"
    assert certificate.destination(target, {"run": {"complete": True}}) == target
    certificate.write({"schema": certificate.SCHEMA, "run": {"complete": False}}, target)
    assert certificate.destination(target, partial) == target  # a partial one may be replaced
    target.write_text(json.dumps({"schema": "gefen-conformance-certificate/1", "verdict": "conformant"}))
    assert certificate.destination(target, partial) != target  # schema 1 had no flag: kept


def test_profile_facts_merge_the_numeric_description_with_the_reason():
    exact = certificate.profile_facts({"cpu-bit-exact"})
    loose = certificate.profile_facts(set())
    assert exact["name"] == "torch-exact" and exact["reason"] == "cpu-bit-exact declared"
    assert loose["name"] == "tolerance" and loose["reason"] == "cpu-bit-exact not declared"
    # the numeric description of oracles.numeric, merged: the staged bounds of SPEC 5.6, not a flat rtol
    assert "SPEC 5.6.1" in loose["rule"] and "SPEC 5.6.10" in loose["free_running"]["momentum"]
    assert "pinned_step" in loose and "pinned_step" not in exact


def test_the_terminal_profile_line_names_the_tolerance_bounds():
    from gefen_conformance.plugin import terminal_summary

    line = terminal_summary.profile_line(certificate.profile_facts(set()))
    assert "SPEC 5.6" in line and "pinned_step" in line and "max-abs 0.005" in line
    assert "torch-exact" in terminal_summary.profile_line(certificate.profile_facts({"cpu-bit-exact"}))


# ------------------------------------------------------------------ the rules section: verify and merge

FIXTURES = Path(__file__).parent / "fixtures" / "certificates"


def _rebuilt(name: str, tests=None, **suite) -> dict:
    """A certificate as the current code builds it from a fixture's records (``tests``: ids kept)."""
    from gefen_conformance.certificate import verify

    cert = json.loads((FIXTURES / name).read_text())
    if tests is not None:
        cert["tests"] = [t for t in cert["tests"] if t["id"] in tests]
    recs = verify.records(cert)
    return certificate.build(
        verify._run_record(cert, recs),
        verify._facts(cert, len(recs)),
        profile=cert["profile"],
        suite={**cert["suite"], **suite},
        platform_=cert["platform"],
        execution=cert["execution"],
    )


def test_verify_rederives_the_rules_section_and_names_what_differs(tmp_path):
    from gefen_conformance.certificate import verify

    cert = _rebuilt("mutant-beta-rounding.json")
    assert cert["rules"]["ids"]["failed"] and cert["rules"]["counts"]["failed"] == len(
        cert["rules"]["ids"]["failed"]
    )
    certificate.write(cert, tmp_path / "c.json")
    assert verify.verify(json.loads((tmp_path / "c.json").read_text()), None)[0] == []
    # a failed rule claimed certified, the digest recomputed: only the re-derivation shows it
    edited = json.loads((tmp_path / "c.json").read_text())
    moved = edited["rules"]["ids"]["failed"].pop(0)
    edited["rules"]["ids"]["certified"].append(moved)
    edited["rules"]["counts"]["failed"] -= 1
    edited["rules"]["counts"]["certified"] += 1
    edited["integrity"] = {"sha256": certificate.integrity(edited)}
    problems, _ = verify.verify(edited, None)
    assert len(problems) == 1 and problems[0].startswith("its rules is not what its test records give: ")
    n = cert["rules"]["counts"]["certified"]
    assert f"counts.certified: stored {n + 1}, derived {n}" in problems[0] and "ids.certified" in problems[0]
    assert len(problems[0]) < 1000  # ids in brief, never the whole list


def test_verify_prints_the_rules_line_with_the_verdict(tmp_path, capsys):
    from gefen_conformance import cli
    from gefen_conformance.certificate import provenance

    cert = _rebuilt("fast-run1.json", content_sha256=provenance.content_sha256())
    certificate.write(cert, tmp_path / "c.json")
    assert cli.main(["verify", str(tmp_path / "c.json")]) == 0
    out = capsys.readouterr().out.splitlines()
    verdict = next(i for i, line in enumerate(out) if line.startswith("verdict: "))
    assert out[verdict + 1] == f"rules: {cert['rules']['summary']}"
    assert "rules certified" in out[verdict + 1] and "failed" in out[verdict + 1]  # expected failures


def test_a_merge_recomputes_the_rules_section_from_the_merged_tests(tmp_path, capsys):
    from gefen_conformance.certificate import verify

    whole = json.loads((FIXTURES / "mutant-beta-rounding.json").read_text())
    ids = [t["id"] for t in whole["tests"]]
    halves = [_rebuilt("mutant-beta-rounding.json", ids[:6]), _rebuilt("mutant-beta-rounding.json", ids[6:])]
    assert halves[0]["rules"] != halves[1]["rules"]
    merged = verify.merge(halves, ["a.json", "b.json"])
    assert (
        merged["rules"]
        == rules.section(merged["tests"], merged["profile"]["name"])
        == _rebuilt("mutant-beta-rounding.json")["rules"]
    )
    certified = set(merged["rules"]["ids"]["certified"])
    assert certified == set(halves[0]["rules"]["ids"]["certified"]) | set(
        halves[1]["rules"]["ids"]["certified"]
    )
    # the merge command prints the merged rules line with the merged verdict
    from gefen_conformance import cli

    paths = [certificate.write(half, tmp_path / f"{i}.json") for i, half in enumerate(halves)]
    cli.main(["merge", *map(str, paths), "--out", str(tmp_path / "m.json")])
    out = capsys.readouterr().out.splitlines()
    assert (
        out[0].startswith("merged 2 certificates into ") and out[1] == f"rules: {merged['rules']['summary']}"
    )
