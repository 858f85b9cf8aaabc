"""The certificate's JSON Schema (``gefen_conformance/certificate/certificate.schema.json``, draft
2020-12, SPEC 4.4.1): every committed certificate and every certificate the current code writes
validates, its vocabularies are the code's, and ``gefen-conformance verify`` refuses a certificate
that breaks it, naming the JSON path and the rule."""

from __future__ import annotations

import contextlib
import copy
import io
import json
from pathlib import Path

import jsonschema
import pytest

from gefen_conformance import cli
from gefen_conformance.certificate import build, rules, verify
from gefen_conformance.certificate.outcomes import OUTCOMES, VERDICTS
from gefen_conformance.implementations.contract import Capability
from gefen_oracles.numeric import Profile

REPO = Path(__file__).resolve().parents[1]
COMMITTED = sorted(REPO.glob("certificates/*.json")) + sorted(REPO.glob("tests/fixtures/certificates/*.json"))
FIXTURES = REPO / "tests" / "fixtures" / "certificates"
FIXTURE = FIXTURES / "mutant-beta-rounding.json"


def _verify(path: Path) -> tuple[int, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = cli.main(["verify", str(path)])
    return status, out.getvalue() + err.getvalue()


def test_the_schema_is_a_valid_draft_2020_12_schema_shipped_in_the_package():
    schema = verify.schema()
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)
    assert "certificate/*.json" in (REPO / "pyproject.toml").read_text()  # package data: in the wheel


def test_the_schemas_vocabularies_are_the_codes():
    defs = verify.schema()["$defs"]
    assert defs["outcome"]["enum"] == [o.value for o in OUTCOMES]
    assert defs["verdict"]["enum"] == [v.value for v in VERDICTS]
    assert sorted(defs["capability"]["enum"]) == sorted(c.value for c in Capability)
    assert defs["profile"]["properties"]["name"]["enum"] == [p.value for p in Profile]
    assert verify.schema()["properties"]["schema"]["const"] == build.SCHEMA
    assert defs["rule_status"]["enum"] == list(rules.STATUSES)
    reasons = defs["rules"]["properties"]["not_certified_reasons"]["propertyNames"]["enum"]
    assert reasons == list(rules.register()["reasons"])
    assert "rules" in verify.schema()["required"]  # every certificate says what its verdict covers


@pytest.mark.parametrize("path", COMMITTED, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_committed_certificate_validates(path):
    assert COMMITTED
    assert verify.schema_problems(json.loads(path.read_text())) == []


def test_a_certificate_the_code_writes_validates_with_every_optional_key(tmp_path):
    """Built by the current code from a committed certificate's records, with every key a run may
    add: rank locations, a failing input, missing capabilities, expectations, a reproducer's path,
    the suite's test ids and a merge's sources; then written (with its integrity digest)."""
    cert = json.loads((FIXTURES / "fast-run1.json").read_text())
    recs = verify.records(cert)
    recs[0].where = ["rank 1: worker.py:12 in step"]
    recs[0].input = "lr=0.1, a 3x5 parameter"
    skipped = next(r for r in recs if r.outcome == "skipped")
    skipped.missing_capabilities = ["factored-v"]
    run = verify._run_record(cert, recs)
    run.expectations = {
        "file": "expectations.toml",
        "sha256": "0" * 64,
        "entries": [{"test": "test_x.py::*", "kind": "xfail", "reason": "known", "when": {"world_size": 2}}],
        "stale": [],
        "inactive": [{"test": "t", "kind": "skip", "reason": "r", "link": "https://example.org/1"}],
    }
    written = build.build(
        run,
        verify._facts(cert, len(recs)),
        profile=cert["profile"],
        suite=cert["suite"],
        platform_=cert["platform"],
        execution={**cert["execution"], "world_size": None, "max_world_size": 4, "warm_up_s": 1.5},
    )
    written["tests"][0]["repro"] = "cert.repro/test_0.pt"
    written["run"].update(suite_tests=["test_x.py::t"], merged_from=["a.json", "b.json"])
    assert verify.schema_problems(written) == []  # built, not yet written: no integrity digest
    build.write(written, tmp_path / "cert.json")
    assert verify.schema_problems(json.loads((tmp_path / "cert.json").read_text())) == []


@pytest.mark.parametrize(
    "change,named",
    [
        (lambda c: c["tests"][3].update(duration_s="1.5"), "$.tests[3].duration_s: '1.5' is not of type"),
        (lambda c: c.pop("run"), "$: 'run' is a required property"),
        (lambda c: c["tests"][0].pop("outcome"), "$.tests[0]: 'outcome' is a required property"),
        (lambda c: c["tests"][0].update(outcome="passd"), "$.tests[0].outcome: 'passd' is not one of"),
        (lambda c: c["summary"].update(failed=-1), "$.summary.failed: -1 is less than the minimum of 0"),
        (lambda c: c["execution"].update(world_sizes="4"), "$.execution.world_sizes: '4' is not of type"),
        (lambda c: c.update(verdit="conformant"), "$: Additional properties are not allowed ('verdit'"),
        (lambda c: c.pop("rules"), "$: 'rules' is a required property"),
        (
            lambda c: c["rules"]["ids"].update(certified=["1.1.2 row 3"]),
            "$.rules.ids.certified[0]: '1.1.2 row 3' does not match",
        ),
        (lambda c: c["rules"]["counts"].update(proven=3), "$.rules.counts: 'proven' is not one of"),
        (
            lambda c: c["tests"][0]["margins"].append(dict(what="w", kind="tolerance", error=1, used=1)),
            "$.tests[0].margins[1]: 'bound' is a required property (schema rule 'required' at "
            "#/$defs/tolerance_margin/required)",
        ),
    ],
    ids=[
        "wrong-type",
        "missing",
        "missing-in-test",
        "enum",
        "minimum",
        "nested",
        "unknown-key",
        "no-rules",
        "rule-id",
        "rule-status",
        "margin",
    ],
)
def test_verify_refuses_a_certificate_that_breaks_the_schema_naming_path_and_rule(tmp_path, change, named):
    cert = json.loads(FIXTURE.read_text())
    change(cert)
    path = tmp_path / "c.json"
    path.write_text(json.dumps(cert))
    status, out = _verify(path)
    assert status == 3, out
    problems = [line for line in out.splitlines() if line.startswith("does not verify: ")]
    assert len(problems) == 1 and named in problems[0], out
    assert "(schema rule '" in problems[0] and " at #/" in problems[0]
    assert "does NOT verify (1 problem(s))" in out


def test_a_document_of_another_schema_is_refused_for_its_schema_alone():
    old = {"schema": "gefen-conformance-certificate/1", "tests": []}
    assert verify.schema_problems(old) == [
        "$.schema: 'gefen-conformance-certificate/2' was expected (schema rule 'const' at "
        "#/properties/schema/const)"
    ]
    assert verify.schema_problems([]) == ["$: [] is not of type 'object' (schema rule 'type' at #/type)"]


def test_a_schema_violation_shows_a_large_value_in_brief(tmp_path):
    cert = json.loads(FIXTURE.read_text())
    cert["tests"] = {t["id"]: t for t in cert["tests"]}  # an object where a list belongs
    (problem,) = verify.schema_problems(cert)
    assert problem.startswith("$.tests: {") and "is not of type 'array'" in problem
    assert len(problem) < 400


def test_verify_judges_a_schema_valid_certificate_past_the_schema(tmp_path):
    """A committed certificate is no schema problem: what verify says of it is about its content
    (here the installed suite's hash differs from the one that wrote it)."""
    cert = json.loads((REPO / "certificates" / "reference-0.1.0.json").read_text())
    problems, facts = verify.verify(copy.deepcopy(cert), "0" * 64)
    assert facts and problems and not any(p.startswith("$") for p in problems)
