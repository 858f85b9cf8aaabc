"""``report`` refuses an output it would not write as asked, and ``diff`` reads
(SPEC 4.5.1, 4.5.3): ``report x.json --out r.pdf`` wrote Markdown into r.pdf; ``diff`` reference ->
fast printed one profile line of about 3,500 characters; an interrupted run listed "Tests removed
(127)"; a change in the notes (goldens not compared) was not shown; a fast comparison that the
reference made bitwise read "was outside its bound".
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from gefen_conformance import cli
from gefen_conformance.certificate import diff as certificate_diff
from gefen_conformance.certificate import read as certificate_read

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "certificates"
REFERENCE, FAST = REPO / "certificates" / "reference-0.1.0.json", REPO / "certificates" / "fast-0.1.0.json"


@pytest.mark.parametrize(
    "out,fmt,problem",
    [
        ("r.pdf", None, "unknown extension '.pdf'; report writes .md, .markdown, .html, .htm"),
        ("r.txt", "md", "unknown extension '.txt'"),
        ("report", None, "unknown extension '(none)'"),
        ("r.md", "html", "holds md, not --format html; name the file r.html"),
        ("r.html", "md", "holds html, not --format md; name the file r.md"),
    ],
)
def test_report_refuses_an_out_whose_extension_is_unknown_or_disagrees(tmp_path, capsys, out, fmt, problem):
    target = tmp_path / out
    status = cli.main(
        ["report", str(FIXTURES / "fast-run1.json"), "--out", str(target)]
        + (["--format", fmt] if fmt else [])
    )
    err = capsys.readouterr().err.strip()
    assert status == 4 and len(err.splitlines()) == 1 and problem in err, err
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("out,start", [("r.markdown", "# Gefen"), ("r.HTM", "<!DOCTYPE html>")])
def test_report_writes_the_format_its_extension_names(tmp_path, capsys, out, start):
    assert cli.main(["report", str(FIXTURES / "fast-run1.json"), "--out", str(tmp_path / out)]) == 0
    assert (tmp_path / out).read_text().startswith(start)


def _diff(capsys, old, new, *options):
    status = cli.main(["diff", str(old), str(new), *options])
    return status, capsys.readouterr().out


def test_diff_between_two_profiles_says_so_in_one_line_and_wraps_every_line(capsys):
    status, out = _diff(capsys, REFERENCE, FAST)
    lines = out.splitlines()
    assert max(map(len, lines)) <= certificate_diff.WIDTH, max(lines, key=len)
    assert "profile tolerances: those of torch-exact -> those of tolerance" in out
    # the capabilities line (over 200 characters) is wrapped, its continuation indented
    at = next(i for i, line in enumerate(lines) if line.startswith("  capabilities: "))
    assert lines[at + 1].startswith("      ") and "(-cpu-bit-exact)" in out.replace("\n      ", " ")
    # fast's fp16 comparison was made bitwise by the reference: no share of a bound "was" there
    assert "was outside its bound" not in out and "(no such tolerance comparison in OLD)" in out


def test_a_change_of_the_rule_counts_is_one_line_and_no_regression(capsys, tmp_path):
    old = certificate_read.load(FIXTURES / "reference-run1.json")
    new = copy.deepcopy(old)
    n = old["rules"]["counts"]
    new["rules"]["counts"].update(certified=0, unchecked=n["unchecked"] + n["certified"])
    paths = [tmp_path / "old.json", tmp_path / "new.json"]
    for path, cert in zip(paths, (old, new)):
        path.write_text(json.dumps(cert))
    status, out = _diff(capsys, *paths)
    assert status == 0, out  # reported, not judged: a failing test is what regresses
    lines = out.splitlines()
    at = lines.index("Rule counts changed (1):")
    moved = (
        f"certified {n['certified']} -> 0, unchecked {n['unchecked']} -> {n['unchecked'] + n['certified']}"
    )
    assert lines[at + 1] == f"  {moved}" and lines[at + 2 : at + 3] in ([], [""])  # one line
    new.pop("rules")  # a certificate written before SPEC 0.2.4
    paths[1].write_text(json.dumps(new))
    status, out = _diff(capsys, *paths)
    assert f"  rules: {old['rules']['summary']} -> rules not recorded" in out.replace("\n      ", " ")


def test_a_changed_bound_within_one_profile_is_one_line_per_bound(capsys, tmp_path):
    old = certificate_read.load(FAST)
    new = copy.deepcopy(old)
    new["profile"]["continuation_after_reshard"]["max_abs"] = 0.01
    path = tmp_path / "new.json"
    path.write_text(json.dumps(new))
    status, out = _diff(capsys, FAST, path)
    assert "  profile tolerance continuation_after_reshard.max_abs: 0.005 -> 0.01" in out
    assert "profile tolerances:" not in out


def test_notes_that_appear_or_go_away_are_shown(capsys, tmp_path):
    old = certificate_read.load(FIXTURES / "reference-run1.json")
    new = copy.deepcopy(old)
    old["notes"] = ["warm-up: starting 4 rank workers failed: OSError"]
    new["notes"] = ["goldens: file md5s not compared (generated under torch 2.12.0, running 2.13.0)"]
    paths = []
    for name, cert in (("old.json", old), ("new.json", new)):
        paths.append(tmp_path / name)
        paths[-1].write_text(json.dumps(cert))
    status, out = _diff(capsys, *paths)
    assert status == 0  # notes are shown, not judged
    assert "Notes new in NEW (1):\n  goldens: file md5s not compared" in out
    assert "Notes of OLD that NEW no longer has (1):\n  warm-up: starting 4 rank workers failed" in out


def test_an_interrupted_run_lists_tests_it_did_not_run_with_the_reason_not_as_removed(capsys, tmp_path):
    old = certificate_read.load(REFERENCE)
    new = copy.deepcopy(old)
    new["tests"] = new["tests"][:5]
    new["run"].update(complete=False, interrupted=True, executed_tests=5)
    new["verdict"] = "incomplete"
    path = tmp_path / "new.json"
    path.write_text(json.dumps(new))
    status, out = _diff(capsys, REFERENCE, path)
    missing = len(old["tests"]) - 5
    assert status == 1 and "Tests removed" not in out
    title = (
        f"Not run in NEW, which is not a complete run (interrupted, 5 of {old['run']['expected_tests']} "
        f"expected tests executed) ({missing}):"
    )
    assert title in out.replace("\n    ", " "), out
    section = out[out.index("Not run in NEW") :].split("\n\n")[0].splitlines()
    assert len([line for line in section if line.startswith("  test_")]) == certificate_diff.NOT_RUN_SHOWN
    assert section[-1] == f"  ... and {missing - certificate_diff.NOT_RUN_SHOWN} more"
    md = cli.main(["diff", str(REFERENCE), str(path), "--format", "md"])
    assert md == 1 and "Not run in NEW, which is not a complete run" in capsys.readouterr().out


def test_a_complete_run_without_a_test_lists_it_as_removed(capsys, tmp_path):
    old = certificate_read.load(REFERENCE)
    new = copy.deepcopy(old)
    gone = new["tests"].pop()
    path = tmp_path / "new.json"
    path.write_text(json.dumps(new))
    status, out = _diff(capsys, REFERENCE, path)
    # the text form wraps at its width: a long test id continues on the next line
    assert "Tests removed (1):\n  " in out
    assert f"Tests removed (1): {gone['id']} (was {gone['outcome']})" in " ".join(out.split())
