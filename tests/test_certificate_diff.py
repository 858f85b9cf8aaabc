"""``gefen-conformance diff OLD NEW``: what changed between two certificates, exit 1 on a regression (SPEC
4.5)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest

from gefen_conformance import cli
from gefen_conformance.certificate import diff as certificate_diff
from gefen_conformance.certificate import read as certificate_read

FIXTURES = Path(__file__).parent / "fixtures" / "certificates"


def load(name):
    return certificate_read.load(FIXTURES / name)


def diff_cli(capsys, old, new, *options):
    """The exit status, stdout with the text form's wrapped lines joined again (SPEC 4.5.3), stderr."""
    status = cli.main(["diff", str(old), str(new), *options])
    captured = capsys.readouterr()
    return status, re.sub(r"\n {4,6}(?=\S)", " ", captured.out), captured.err


def written(tmp_path, name, cert):
    path = tmp_path / name
    path.write_text(json.dumps(cert))
    return path


def test_reference_against_its_mutant_exits_1_and_lists_the_mutants_failures(capsys):
    mutant = load("mutant-beta-rounding.json")
    status, out, _ = diff_cli(
        capsys, FIXTURES / "reference-run1.json", FIXTURES / "mutant-beta-rounding.json"
    )
    assert status == 1
    assert "REGRESSED: 4 new failure(s); verdict got worse: conformant -> not-conformant" in out
    failures = [t for t in mutant["tests"] if t["outcome"] in ("failed", "error")]
    assert len(failures) == 4
    for t in failures:
        assert f"{t['id']}: passed -> {t['outcome']}" in out
        assert t["reason"].splitlines()[0] in out
    assert "implementation: reference -> tests.mutants:beta_rounding" in out
    assert "1.8: passed 2 -> 0, failed 0 -> 2" in out
    assert "parameters (float32) after 8 steps: 0 -> 311 differ" in out
    # the rule counts that changed, in one line, and each certificate's rules beside its verdict
    old_n, new_n = load("reference-run1.json")["rules"]["counts"], mutant["rules"]["counts"]
    changed = ", ".join(
        f"{status} {old_n[status]} -> {new_n[status]}"
        for status in ("certified", "unproven", "failed")
        if old_n[status] != new_n[status]
    )
    assert f"Rule counts changed (1):\n  {changed}\n" in out and new_n["failed"] > 0
    assert f"not-conformant ({new_n['certified']} of {mutant['rules']['total']} rules certified)" in out


def test_two_runs_of_the_reference_exit_0(capsys):
    status, out, _ = diff_cli(capsys, FIXTURES / "reference-run1.json", FIXTURES / "reference-run2.json")
    assert status == 0
    assert "No regression." in out
    assert (
        "Identity changed" not in out and "Margins" not in out
    )  # durations and tiny margin noise are not changes
    assert "Rule counts changed" not in out


def test_margin_growth_and_a_margin_near_the_bound_are_flagged(capsys):
    status, out, _ = diff_cli(capsys, FIXTURES / "fast-run1.json", FIXTURES / "fast-run2-drift.json")
    assert status == 1
    assert "implementation version: 0.3.0 -> 0.3.1" in out
    assert (
        "test_optimizer.py::test_block_step_matches_reference[torch.bfloat16-wd-tensor-lr] :: "
        "parameters (bfloat16) "
        "after 8 steps: 12 % -> 93 % (x7.75)"
    ) in out
    assert "continuation one step after restore (max abs): 5 % -> 21 % (x4.2)" in out
    assert "parameters (bfloat16) after 8 steps: 93 % of its bound (was 12 %)" in out
    # 28.8 % from 18 % is growth by 1.6: under the factor
    assert "state: block magnitudes" not in out


def test_margin_factor_and_threshold_are_options(capsys):
    old, new = FIXTURES / "fast-run1.json", FIXTURES / "fast-run2-drift.json"
    status, out, _ = diff_cli(capsys, old, new, "--margin-factor", "10", "--margin-threshold", "0.95")
    assert status == 0 and "No regression." in out
    status, out, _ = diff_cli(capsys, old, new, "--margin-factor", "1.5", "--margin-threshold", "0.95")
    assert status == 1 and "state: block magnitudes: 18 % -> 28.8 % (x1.6)" in out


def test_a_margin_already_over_the_threshold_in_old_is_listed_but_not_a_regression(capsys, tmp_path):
    old = _with_continuation(load("reference-run1.json"), 0.97)  # a kernel whose bound is tight by design
    status, out, _ = diff_cli(capsys, written(tmp_path, "old.json", old), written(tmp_path, "new.json", old))
    assert status == 0 and "No regression." in out
    assert "already at or over 90 % of their bound in OLD" in out and "97 % of its bound (was 97 %)" in out
    crossed = certificate_diff.compare(_with_continuation(old, 0.5), old)
    assert crossed.over_threshold and not crossed.still_over_threshold and crossed.regressions


def _with_continuation(cert, used):
    cert = copy.deepcopy(cert)
    test = next(t for t in cert["tests"] if t["id"].endswith("continues_within_bound[2->4]"))
    test["margins"][0].update(used=used, error=None if used is None else used * test["margins"][0]["bound"])
    return cert


@pytest.mark.parametrize("used,flagged", [(0.009, False), (0.0199, False), (0.05, True), (None, True)])
def test_margins_under_the_floor_are_noise(used, flagged):
    old = load("reference-run1.json")  # continuation margin 4.2e-5 of the bound
    diff = certificate_diff.compare(old, _with_continuation(old, used))
    assert bool(diff.margin_growth) is flagged
    assert bool(diff.regressions) is flagged


def test_margins_of_failing_or_expected_failing_tests_are_judged_by_their_outcome():
    old = load("fast-run1.json")
    new = copy.deepcopy(old)
    xfailed = next(t for t in new["tests"] if t["outcome"] == "xfailed" and t["margins"])
    xfailed["margins"][0]["used"] = 0.99
    diff = certificate_diff.compare(old, new)
    assert not diff.over_threshold and not diff.margin_growth and not diff.regressions


def test_identity_changes_are_reported_without_judging(capsys, tmp_path):
    old = load("reference-run1.json")
    new = copy.deepcopy(old)
    new["platform"]["torch"] = "2.14.1+cpu"
    new["suite"]["content_sha256"] = "0" * 64
    new["suite"]["git"] = {"commit": "abc123", "dirty": True}
    new["profile"] = {
        "name": "tolerance",
        "reason": "cpu-bit-exact not declared",
        "comparison": "within bounds",
    }
    new["implementation"]["capabilities"] = [
        c for c in new["implementation"]["capabilities"] if c != "factored-v"
    ] + ["x-new"]
    new["run"]["hypothesis"]["profile"] = "gefen-fuzz"
    status, out, _ = diff_cli(capsys, FIXTURES / "reference-run1.json", written(tmp_path, "new.json", new))
    assert status == 0
    for line in (
        "torch: 2.13.0+cpu -> 2.14.1+cpu",
        "suite content sha256: 3f1c9a0be27d45c8a1d06e5f9b7c2a4410e8d3b6c5f7a9e1d2b4c6a8e0f13579 -> "
        + "0" * 64,
        "suite git commit: 17ca9a6b2e0c4d1f8a3b5c7d9e1f2a4b6c8d0e2f -> abc123 (dirty)",
        "profile: torch-exact -> tolerance",
        "(+x-new -factored-v)",
        "hypothesis profile: gefen-certify -> gefen-fuzz",
    ):
        assert line in out, line


def test_fixed_tests_and_a_better_verdict_exit_0(capsys):
    status, out, _ = diff_cli(
        capsys, FIXTURES / "mutant-beta-rounding.json", FIXTURES / "reference-run1.json"
    )
    assert status == 0
    assert "Fixed (4):" in out and "conformant (better)" in out


def test_a_partial_run_against_a_full_one_is_a_worse_verdict_and_lists_the_tests_not_run(capsys):
    status, out, _ = diff_cli(capsys, FIXTURES / "reference-run1.json", FIXTURES / "reference-partial.json")
    assert status == 1
    assert "verdict got worse: conformant -> partial" in out
    assert "Tests removed" not in out  # a narrowed run did not run them; the suite still has them
    assert (
        "Not run in NEW, which is not a complete run (narrowed by -k optimizer, 7 of 13 expected tests" in out
    )
    assert "test_goldens.py::test_saves_match_the_goldens (OLD: passed)" in out
    assert (
        "run: 13 of 13 expected tests executed -> 7 of 13 expected tests executed, narrowed by -k optimizer"
        in out
    )


def test_an_added_failing_test_and_an_unexpected_pass_are_new_failures():
    old = load("fast-run1.json")
    new = copy.deepcopy(old)
    new["tests"].append(
        {"id": "test_new.py::test_x", "clauses": ["1.8"], "outcome": "failed", "reason": "boom"}
    )
    next(t for t in new["tests"] if t["outcome"] == "xfailed")["outcome"] = "xpassed"
    new["verdict"] = "not-conformant"
    diff = certificate_diff.compare(old, new)
    assert [(f[0], f[1], f[2]) for f in diff.new_failures] == [
        (
            "test_dcp_reshard.py::test_reshard_restores_model_and_continues_within_bound[4->2-empty-source-shards]",
            "xfailed",
            "xpassed",
        ),
        ("test_new.py::test_x", None, "failed"),
    ]
    assert diff.added == [("test_new.py::test_x", "failed")]
    assert diff.verdict_worse


def test_a_failure_already_in_old_is_not_a_new_one():
    mutant = load("mutant-beta-rounding.json")
    diff = certificate_diff.compare(mutant, copy.deepcopy(mutant))
    assert not diff.regressions and not diff.new_failures and diff.verdict is None


def test_markdown_diff_for_a_pull_request(capsys):
    status, out, _ = diff_cli(
        capsys, FIXTURES / "reference-run1.json", FIXTURES / "mutant-beta-rounding.json", "--format", "md"
    )
    assert status == 1
    assert out.startswith("### Gefen conformance diff")
    assert "#### New failures (4)" in out
    assert (
        "- test\\_optimizer.py::test\\_block\\_step\\_matches\\_reference\\[torch.float32-plain\\]: "
        "passed -> failed<br>" in out
    )


def test_schema_1_is_refused_with_one_clear_line(capsys, tmp_path):
    first = written(
        tmp_path,
        "schema-1.json",
        {
            "schema": "gefen-conformance-certificate/1",
            "implementation": {"name": "gefenx"},
            "verdict": "conformant-with-expected-failures",
            "tests": [],
        },
    )
    status, out, err = diff_cli(capsys, first, FIXTURES / "reference-run1.json")
    assert status == 2 and out == ""
    assert err.strip().endswith(
        "schema gefen-conformance-certificate/1 is not supported, re-run the suite to get a "
        "gefen-conformance-certificate/2 certificate"
    )
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "content", ["", '{"schema": "gefen-conformance-certificate/2"}', '{"schema": 3}', "\xff"]
)
def test_unreadable_input_exits_2(capsys, tmp_path, content):
    bad = tmp_path / "bad.json"
    bad.write_text(content, encoding="latin-1")
    status, out, err = diff_cli(capsys, FIXTURES / "reference-run1.json", bad)
    assert status == 2 and out == "" and str(bad) in err and len(err.strip().splitlines()) == 1


def test_missing_file_exits_2(capsys, tmp_path):
    status, _, err = diff_cli(capsys, tmp_path / "nope.json", FIXTURES / "reference-run1.json")
    assert status == 2 and "nope.json: cannot read" in err


@pytest.mark.parametrize(
    "option,value", [("--margin-factor", "0.5"), ("--margin-threshold", "0"), ("--margin-floor", "nan")]
)
def test_nonsense_options_are_refused(capsys, option, value):
    with pytest.raises(SystemExit) as stop:
        cli.main(
            [
                "diff",
                str(FIXTURES / "reference-run1.json"),
                str(FIXTURES / "reference-run2.json"),
                option,
                value,
            ]
        )
    assert stop.value.code == 4  # a usage error (SPEC 4.4.13)
    assert option in capsys.readouterr().err


def test_text_output_never_echoes_control_characters(capsys, tmp_path):
    new = copy.deepcopy(load("mutant-beta-rounding.json"))
    new["tests"][0]["reason"] = "\x1b[2Jcleared\x07"
    new["tests"][0]["outcome"] = "failed"
    status, out, _ = diff_cli(capsys, FIXTURES / "reference-run1.json", written(tmp_path, "new.json", new))
    assert status == 1 and "\x1b" not in out and "\x07" not in out and "?[2Jcleared?" in out


# a whole suite run in a subprocess: .ci/run runs it (the default run stays under 5 minutes)
@pytest.mark.slow
def test_report_and_diff_of_real_suite_runs(narrow_certification, tmp_path, capsys):
    """End to end: the reference and a mutant certified on a narrow selection, reported and compared
    (the mutant's run is shared with test_conformance_plugin.py)."""
    reference, mutant = (
        narrow_certification(impl, "global_step")[1] for impl in ("reference", "tests.mutants:global_step")
    )
    for fmt in ("md", "html"):
        assert cli.main(["report", str(reference), "--format", fmt, "--out", str(tmp_path / f"r.{fmt}")]) == 0
    assert "1.10.6" in (tmp_path / "r.html").read_text()
    status, out, _ = diff_cli(capsys, reference, reference)
    assert status == 0 and "No regression." in out
    status, out, _ = diff_cli(capsys, reference, mutant)
    assert (
        status == 1 and "test_optimizer.py::test_global_step_counts_every_step_call: passed -> failed" in out
    )
