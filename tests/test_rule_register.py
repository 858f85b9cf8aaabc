"""The register of SPEC's rules (SPEC 0.2.4): generated from SPEC.md, current, and counted honestly.

``tools/rule_register.py`` reads the ids SPEC.md states; the installed suite carries the result
(``gefen_conformance/certificate/rules.json``), and a certificate counts rules against it
(``gefen_conformance.certificate.rules``)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

from gefen_conformance.certificate import rules

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tool():
    spec = importlib.util.spec_from_file_location("rule_register", REPO / "tools" / "rule_register.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while a class is built
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def test_the_shipped_register_is_generated_from_the_spec(tool):
    shipped = (REPO / "conformance" / "gefen_conformance" / "certificate" / "rules.json").read_text()
    assert shipped == tool.rendered(), f"the register is not current: run {tool.COMMAND}"


def test_the_register_covers_parts_1_to_3_by_the_spec_structure(tool):
    ids = [r["id"] for r in rules.register()["rules"]]
    assert len(ids) == len(set(ids))
    assert {i.split(".")[0] for i in ids} == {"1", "2", "3"}
    # a '#' table, a numbered list and a clause that is one rule
    assert {"1.1.2#1", "1.1.2#11", "1.1.6#8", "1.12.2#8", "1.12.4#6", "1.12.9"} <= set(ids)
    assert "1.1.2" not in ids and "1.12.4" not in ids  # a clause of several rules is not one itself
    assert not any(i.startswith(("1.14", "2.7", "3.9")) for i in ids)  # documented differences
    marked = {r["id"]: r["not_certified"] for r in rules.register()["rules"] if r.get("not_certified")}
    assert marked == {
        "1.3.7": "out-of-scope",
        "1.5.8": "out-of-scope",
        "1.6.5": "omission",
        "1.6.9": "out-of-scope",
        "1.6.10": "reference-only",
        "1.6.7#3": "out-of-scope",
        "1.6.11": "device",
        "2.4.1#1": "out-of-scope",
        "2.4.1#9": "out-of-scope",
    }


@pytest.mark.parametrize(
    "spec, problem",
    [
        ("| # | a |\n|---|---|\n| 1 | x |\n| 1 | y |\n", "1.1.1#1 is defined twice"),
        (
            "| # | a |\n|---|---|\n| 1 | x |\n\n*Not certified:* #1 (because: no)\n",
            "unknown reason 'because'",
        ),
        ("| # | a |\n|---|---|\n| 1 | x |\n\n*Not certified:* #2 (device: no)\n", "1.1.1#2 is marked"),
        ("Text [#1] and [#1] again.\n", "1.1.1#1 is defined twice"),
    ],
    ids=["row-twice", "unknown-reason", "stray-mark", "marker-twice"],
)
def test_an_inconsistent_rule_structure_is_refused(tool, spec, problem):
    text = f"## Part 1 — X\n\n### 1.1 Y\n\n1.1.1 Z\n\n{spec}"
    with pytest.raises(tool.RegisterError, match=problem.replace("(", r"\(").replace(")", r"\)")):
        tool.parse(text)


def test_a_clause_that_calls_itself_informative_holds_no_rule(tool):
    text = (
        "## Part 1 — X\n\n### 1.1 Y\n\n1.1.1 Informative summary: a formula\nthat goes on.\n\n1.1.2 A rule.\n"
    )
    assert [r.id for r in tool.parse(text)] == ["1.1.2"]


def test_a_rule_counts_only_where_a_test_names_it(monkeypatch):
    unproven = "3.7.2"  # listed below as a rule no mutant has been shown to fail for
    monkeypatch.setattr(rules, "unproven", lambda: frozenset({unproven}))
    tests = [
        {"clauses": ["1.1.2#1", "1.12.4", "1.8"], "outcome": "passed"},  # a row, a clause of rows, a section
        {"clauses": [unproven], "outcome": "passed"},
        {"clauses": ["1.1.2#2"], "outcome": "failed"},
        {"clauses": ["1.1.2#3"], "outcome": "skipped"},
        {"clauses": ["1.6.11"], "outcome": "passed"},  # marked not certified: it stays so
    ]
    status = rules.statuses(tests)
    assert status["1.1.2#1"] == "certified"  # killed by its mutant (tests/test_rule_mutants.py)
    assert status[unproven] == "unproven"  # named and passed, but no mutant shown to fail for it yet
    assert status["1.12.4#1"] == "unchecked" and status["1.8.2"] == "unchecked"
    assert (status["1.1.2#2"], status["1.1.2#3"], status["1.6.11"]) == ("failed", "skipped", "not-certified")
    section = rules.section(tests)
    assert (section["counts"]["certified"], section["counts"]["unproven"]) == (1, 1)
    assert section["summary"].startswith(
        f"1 of {section['total']} rules certified; 1 checked without a mutant proof; 1 failed; 1 skipped"
    )


def test_a_rule_bound_to_the_torch_exact_profile_is_not_certified_by_a_tolerance_run(tool, monkeypatch):
    text = (
        "## Part 1 — X\n\n### 1.1 Y\n\n1.1.1 Z\n\n| # | a |\n|---|---|\n| 1 | x |\n| 2 | y |\n\n"
        "*Torch-exact only:* #2 (a rounding)\n"
    )
    parsed = {r.id: r for r in tool.parse(text)}
    assert (parsed["1.1.1#1"].profile, parsed["1.1.1#2"].profile) == (None, "torch-exact")
    assert parsed["1.1.1#2"].profile_why == "a rounding" and parsed["1.1.1#2"].not_certified is None
    with pytest.raises(tool.RegisterError, match="1.1.1#3 is marked torch-exact only"):
        tool.parse(text.replace("only:* #2", "only:* #3"))
    register = {
        "reasons": {},
        "rules": [
            {"id": "1.1.1#1", "clause": "1.1.1"},
            {"id": "1.1.1#2", "clause": "1.1.1", "profile": "torch-exact"},
        ],
    }
    monkeypatch.setattr(rules, "register", lambda: register)
    monkeypatch.setattr(rules, "unproven", lambda: frozenset())
    tests = [{"clauses": ["1.1.1#1", "1.1.1#2"], "outcome": "passed"}]
    assert rules.statuses(tests, "torch-exact") == {"1.1.1#1": "certified", "1.1.1#2": "certified"}
    assert rules.statuses(tests, "tolerance") == {"1.1.1#1": "certified", "1.1.1#2": "not-certified"}
    section = rules.section(tests, "tolerance")
    assert section["not_certified_reasons"] == {"torch-exact-only": ["1.1.1#2"]}
