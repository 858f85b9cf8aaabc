"""A kernel team's CI loop (SPEC 4.4.14-4.4.16, 4.5.7): expectations with conditions, shards and
their merge, verification of a published certificate, JUnit XML and rerunning what failed."""

from __future__ import annotations

import contextlib
import copy
import io
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import torch

from gefen_conformance import cli
from gefen_conformance.certificate import expectations, junit, verify
from gefen_conformance.cli import certify

REPO = Path(__file__).resolve().parents[1]
GLOBAL_STEP = "test_optimizer.py::test_global_step_counts_every_step_call"
NARROW = "global_step or invalid"
RELEASE = torch.__version__.split("+", 1)[0]


def _env() -> dict:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    )
    env.pop("PYTEST_XDIST_WORKER", None)
    env.pop("PYTEST_ADDOPTS", None)
    return env


def gefen_conformance(*args, cwd=None) -> subprocess.CompletedProcess:
    """``gefen-conformance ARGS`` in a subprocess (a whole certification)."""
    return subprocess.run(
        [sys.executable, "-m", "gefen_conformance.cli", *map(str, args)],
        capture_output=True,
        text=True,
        env=_env(),
        cwd=cwd,
        timeout=900,
    )


def command(*args) -> subprocess.CompletedProcess:
    """``gefen-conformance ARGS`` of a command that runs no tests (merge, verify, expectations), in
    this process."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli.main([str(a) for a in args])
    return subprocess.CompletedProcess(args, status, out.getvalue(), err.getvalue())


def write_expectations(path: Path, *entries: dict) -> Path:
    lines = []
    for e in entries:
        lines.append("[[expectation]]")
        for key, value in e.items():
            if isinstance(value, dict):
                inner = ", ".join(f"{k} = {json.dumps(v)}" for k, v in value.items())
                lines.append(f"{key} = {{ {inner} }}")
            else:
                lines.append(f"{key} = {json.dumps(value)}")
    path.write_text("\n".join(lines) + "\n")
    return path


# ------------------------------------------------------------------------------ expectations


@pytest.mark.parametrize(
    "when,holds",
    [
        ({}, True),
        ({"torch": f"=={RELEASE}"}, True),  # a local build tag (+cpu) is not part of the release
        ({"torch": "<1.0"}, False),
        ({"device": "cuda"}, False),
        ({"device": "cpu", "launcher": "pool"}, True),
        ({"launcher": "torchrun", "world_size": 4}, False),
    ],
)
def test_an_entry_applies_only_where_all_its_conditions_hold(when, holds):
    env = expectations.Environment(device="cpu", torch=torch.__version__, launcher="pool", world_size=None)
    assert expectations.Expectation("t", "xfail", "r", when=when).holds(env) is holds


@pytest.mark.parametrize(
    "text,names",
    [
        ('[[expectation]]\ntest = "t"\nkind = "xfail"\n', "reason must be a non-empty string"),
        ('[[expectation]]\ntest = "t"\nkind = "flaky"\nreason = "r"\n', "kind 'flaky'"),
        (
            '[[expectation]]\ntest = "t"\nkind = "skip"\nreason = "r"\nwhen = { gpu = 1 }\n',
            "condition(s) gpu",
        ),
        (
            '[[expectation]]\ntest = "t"\nkind = "skip"\nreason = "r"\nwhen = { torch = "2.x" }\n',
            "not a version",
        ),
        ('[xfails]\ntest = "t"\n', "unknown top-level key(s) xfails"),
        ("test = [", "not TOML"),
    ],
)
def test_a_bad_expectations_file_is_one_error_naming_the_entry_and_the_problem(tmp_path, text, names):
    path = tmp_path / "e.toml"
    path.write_text(text)
    with pytest.raises(expectations.ExpectationsError) as error:
        expectations.load(path)
    assert names in str(error.value) and str(path) in str(error.value)


def test_certify_refuses_a_bad_expectations_file_before_anything_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(certify, "_wait_for", lambda command: pytest.fail("a run started"))
    bad = tmp_path / "e.toml"
    bad.write_text('[[expectation]]\ntest = "t"\nkind = "maybe"\nreason = "r"\n')
    assert cli.main(["certify", "--expectations", str(bad), "--out", str(tmp_path / "c.json")]) == 4
    err = capsys.readouterr().err
    assert "--expectations" in err and "kind 'maybe'" in err and not (tmp_path / "c.json").exists()


def test_an_expectation_that_holds_makes_a_failure_expected_and_unused_entries_are_reported(
    narrow_certification, tmp_path_factory
):
    where = tmp_path_factory.mktemp("expectations")
    path = write_expectations(
        where / "fast.toml",
        # first: the right test, but a torch this run does not have, so it does not apply
        {"test": GLOBAL_STEP, "kind": "xfail", "reason": "old torch", "when": {"torch": "<1.0"}},
        {
            "test": "test_optimizer.py::test_global_step*",
            "kind": "xfail",
            "reason": "counts twice",
            "link": "https://example.org/1",
            "when": {"device": "cpu", "torch": f"=={RELEASE}"},
        },
        {"test": "test_optimizer.py::test_gone", "kind": "xfail", "reason": "renamed long ago"},
    )
    xml = where / "junit.xml"
    status, cert_path = narrow_certification(
        "tests.mutants:global_step", "global_step", f"--expectations={path}", f"--gefen-junit={xml}"
    )
    cert = json.loads(cert_path.read_text())
    by_id = {t["id"]: t for t in cert["tests"]}
    assert by_id[GLOBAL_STEP]["outcome"] == "xfailed"
    assert "counts twice (https://example.org/1) [expectations entry 2]" in by_id[GLOBAL_STEP]["reason"]
    exp = cert["expectations"]
    assert exp["file"] == str(path) and len(exp["sha256"]) == 64 and len(exp["entries"]) == 3
    assert [e["test"] for e in exp["stale"]] == ["test_optimizer.py::test_gone"]
    assert [e["reason"] for e in exp["inactive"]] == ["old torch"]
    assert cert["verdict"] == "partial" and status == 6  # -k narrowed it; the failure was expected
    # the same mutant without the file fails (the run test_conformance_plugin also makes)
    failed = json.loads(narrow_certification("tests.mutants:global_step", "global_step")[1].read_text())
    assert {t["id"]: t["outcome"] for t in failed["tests"]}[GLOBAL_STEP] == "failed"
    # the JUnit XML the plugin wrote beside it: the expected failure as a skip, with its reason
    (case,) = ET.parse(xml).getroot().iter("testcase")
    assert "counts twice" in case.find("skipped").get("message")


def test_a_certificate_s_failures_become_a_starting_expectations_file(narrow_certification, tmp_path):
    _, cert_path = narrow_certification("tests.mutants:global_step", "global_step")
    run = command("expectations", cert_path, "--out", tmp_path / "e.toml")
    assert run.returncode == 0, run.stderr
    loaded = expectations.load(tmp_path / "e.toml")
    cert = json.loads(cert_path.read_text())
    failed = [t["id"] for t in cert["tests"] if t["outcome"] in ("failed", "error")]
    assert failed and [e.test for e in loaded.entries] == failed
    assert all(e.kind == "xfail" and e.when["torch"] == f"=={RELEASE}" for e in loaded.entries)


# ------------------------------------------------------------------------------ shards and merge


def _shards(narrow_certification, select: str, n: int = 2) -> list[Path]:
    return [narrow_certification("reference", select, f"--gefen-shard={i}/{n}")[1] for i in range(1, n + 1)]


def test_shards_partition_the_run_and_merge_into_what_one_run_gives(narrow_certification, tmp_path):
    whole = json.loads(narrow_certification("reference", NARROW)[1].read_text())
    shards = _shards(narrow_certification, NARROW)
    ids = [{t["id"] for t in json.loads(p.read_text())["tests"]} for p in shards]
    assert all(ids) and not ids[0] & ids[1]
    for p in shards:
        cert = json.loads(p.read_text())
        assert cert["verdict"] == "partial" and any("--shard" in n for n in cert["run"]["narrowed_by"])
    run = command("merge", *shards, "--out", tmp_path / "merged.json")
    merged = json.loads((tmp_path / "merged.json").read_text())
    assert run.returncode == 6, run.stdout + run.stderr  # partial: -k left most of the suite out
    assert {t["id"] for t in merged["tests"]} == ids[0] | ids[1] == {t["id"] for t in whole["tests"]}
    assert merged["summary"] == whole["summary"] and merged["verdict"] == whole["verdict"]
    assert merged["clauses"].keys() == whole["clauses"].keys()
    assert merged["run"]["merged_from"] == [str(p) for p in shards]
    assert verify.verify(merged, None)[0] == []


def test_merge_refuses_certificates_of_two_implementations(narrow_certification, tmp_path):
    a = narrow_certification("reference", NARROW)[1]  # both made for other tests of this module
    b = narrow_certification("tests.mutants:global_step", "global_step")[1]
    run = command("merge", a, b, "--out", tmp_path / "m.json")
    assert run.returncode == 4 and "implementation" in run.stderr and not (tmp_path / "m.json").exists()


# a whole suite run twice over in subprocesses: .ci/run runs it (the default run stays under 5 minutes)
@pytest.mark.slow
def test_two_shards_of_the_whole_suite_merge_into_a_conformant_certificate(tmp_path):
    paths = []
    for i in (1, 2):
        path = tmp_path / f"shard{i}.json"
        run = gefen_conformance("certify", "--shard", f"{i}/2", "--out", path, "-q", cwd=tmp_path)
        assert run.returncode == 6, run.stdout[-3000:] + run.stderr[-3000:]
        paths.append(path)
    run = command("merge", *paths, "--out", tmp_path / "merged.json")
    merged = json.loads((tmp_path / "merged.json").read_text())
    assert run.returncode == 0 and merged["verdict"] == "conformant", merged["verdict_reason"]
    assert (
        merged["run"]["executed_tests"]
        == merged["run"]["expected_tests"]
        == len(merged["run"]["suite_tests"])
    )
    assert command("verify", tmp_path / "merged.json").returncode == 0


# ------------------------------------------------------------------------------ verify


def test_a_certificate_as_written_verifies_and_reports_its_provenance(narrow_certification):
    _, path = narrow_certification("tests.mutants:global_step", "global_step")
    run = command("verify", path)
    assert run.returncode == 1, run.stdout + run.stderr  # verifies: its verdict's status
    assert "(verified: re-derived from its records)" in run.stdout
    assert "implementation global-step mutant (spec tests.mutants:global_step)" in run.stdout
    assert "expectations: none" in run.stdout and "launcher pool" in run.stdout


@pytest.mark.parametrize(
    "edit,names",
    [
        ("outcome", "its summary is not what its test records give"),
        ("verdict", "integrity digest does not match"),
        ("integrity", "no integrity digest"),
        ("margin", "passed, yet"),
    ],
)
def test_a_hand_edited_certificate_does_not_verify(narrow_certification, tmp_path, edit, names):
    impl = "tests.mutants:global_step" if edit == "outcome" else "reference"
    _, path = narrow_certification(impl, "global_step")
    edited = copy.deepcopy(json.loads(path.read_text()))
    if edit == "outcome":  # the failure hidden, the summary left as written
        for t in edited["tests"]:
            t["outcome"] = "passed" if t["outcome"] == "failed" else t["outcome"]
    elif edit == "verdict":
        edited["verdict"] = "conformant"
    elif edit == "integrity":
        edited.pop("integrity")
    else:  # a test marked passed whose own margin says its comparison fell outside its bound
        test = next(t for t in edited["tests"] if t["outcome"] == "passed")
        test["margins"] = [dict(kind="tolerance", what="state", error=3.5e-6, bound=1e-6, used=3.5)]
    (tmp_path / "c.json").write_text(json.dumps(edited))
    run = command("verify", tmp_path / "c.json")
    assert run.returncode == 3, run.stdout + run.stderr
    assert "does NOT verify" in run.stdout and names in run.stdout
    assert max(len(line) for line in run.stdout.splitlines()) < 400  # differences in brief


# ------------------------------------------------------------------------------ JUnit and rerun


def test_junit_xml_has_a_testcase_per_test_with_its_clauses_and_failure(narrow_certification):
    _, cert_path = narrow_certification("tests.mutants:global_step", "global_step")
    cert = json.loads(cert_path.read_text())
    suite = ET.fromstring(junit.xml(cert, str(cert_path)))
    cases = {f"{c.get('classname')}.py::{c.get('name')}": c for c in suite.iter("testcase")}
    assert set(cases) == {t["id"] for t in cert["tests"]}
    assert int(suite.get("tests")) == len(cases) and int(suite.get("failures")) == cert["summary"]["failed"]
    failing = cases[GLOBAL_STEP]
    assert failing.find("failure") is not None and failing.find("failure").get("message")
    props = {p.get("name"): p.get("value") for p in failing.iter("property")}
    clauses = next(t for t in cert["tests"] if t["id"] == GLOBAL_STEP)["clauses"]
    assert props["clauses"] == ", ".join(clauses) and props["outcome"] == "failed"


def test_rerun_failed_runs_exactly_the_failed_tests_of_the_certificate_s_implementation(
    narrow_certification, monkeypatch, tmp_path
):
    _, cert_path = narrow_certification("tests.mutants:global_step", "global_step")
    cert = json.loads(cert_path.read_text())
    failed = [t["id"] for t in cert["tests"] if t["outcome"] == "failed"]
    commands = []
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(certify, "_wait_for", lambda command: commands.append(command) or 0)
    assert cli.main(["certify", "--rerun-failed", str(cert_path), "--out", "again.json"]) == 0
    command = commands[0]
    assert "--impl=tests.mutants:global_step" in command
    assert [a for a in command if a.startswith("suite/") or "::" in a][-len(failed) :] == failed


def test_rerun_failed_of_a_certificate_without_failures_is_a_usage_error(narrow_certification, capsys):
    _, cert_path = narrow_certification("reference", "global_step")
    assert cli.main(["certify", "--rerun-failed", str(cert_path)]) == 4
    assert "no test failed there" in capsys.readouterr().err
