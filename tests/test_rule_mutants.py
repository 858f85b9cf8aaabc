"""Certified means killed (SPEC 0.2.4): every rule the suite names by id has a mutant, an
implementation wrong in that rule alone, that a suite test naming the rule fails, in both
profiles; and the reference passes every example.

The constructor's, the native load's, the step's and a one-process DCP save's rules are proven here
in-process (their checks take milliseconds, tests/rule_mutants.py; the save examples run in a gloo
group of one made for this module and destroyed after it); rules that are single clauses are proven
by the catalogue of tests/mutants.py, through tests/test_suite_catches_mutants.py."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

import gefen_reference as reference
import gefen_reference.dcp as reference_dcp
from gefen_conformance.certificate import rules
from gefen_conformance.implementations import registry
from gefen_conformance.suite import rule_checks
from gefen_conformance.suite.rule_examples import CONSTRUCTOR, NATIVE_LOAD, Built, LoadAccepted, Stepped
from gefen_conformance.suite.save_rule_examples import DECLARED, SAVES, Saved
from gefen_conformance.suite.step_rule_examples import STEPPED

from . import rule_mutants
from .mutant_tools import failed_tests, failures, run_suite
from .mutants import CATALOGUE, PROFILES
from .support import world_of_one

SUITE = Path(rule_checks.__file__).parent
EXAMPLES = CONSTRUCTOR + NATIVE_LOAD + STEPPED + SAVES

#: Rules the suite names by id that no mutant kills yet (the package's unproven_rules.json): the
#: certificate counts them as checked without a mutant proof. An entry that gains a mutant must
#: leave; a rule newly named without one fails the test below.
WITHOUT_A_MUTANT = rules.unproven()  # fmt: skip


@pytest.fixture(scope="module")
def one_rank():
    """A gloo group of one for the save examples, destroyed when the module's tests are done."""
    with world_of_one() as world:
        yield world


def _check(example, request):
    if isinstance(example, Stepped):
        return rule_checks.check_stepped
    if example in SAVES:
        world = request.getfixturevalue("one_rank")
        return lambda impl, e: rule_checks.check_save(impl, e, world)
    return rule_checks.check_constructor if example in CONSTRUCTOR else rule_checks.check_native_load


def _kind(example) -> str:
    """A refusal needs a lenient mutant (the check left out), an acceptance a strict one, a step a
    wrong one."""
    if isinstance(example, Stepped):
        return "wrong"
    return "strict" if isinstance(example, (Built, LoadAccepted, Saved)) else "lenient"


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("mutant", rule_mutants.mutants("torch-exact"), ids=lambda m: m.id)
def test_a_rule_mutant_is_failed_by_a_test_naming_its_rule(mutant, profile, request):
    (declared,) = [m for m in rule_mutants.mutants(profile) if m.id == mutant.id]
    failures = []
    for example in (e for e in EXAMPLES if e.rule == mutant.rule):
        try:
            _check(example, request)(declared.implementation, example)
        except AssertionError as failure:
            failures.append(str(failure))
    assert failures, f"{mutant.id} ({mutant.what}) passes every example of {mutant.rule} [{profile}]"
    assert all(f.startswith(f"SPEC {mutant.rule} (") for f in failures), failures


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: f"{e.rule}-{e.what}")
def test_the_reference_passes_every_example(example, request):
    _check(example, request)(registry.resolve("reference"), example)


class _DeclaredReference(reference.Gefen):
    """The reference's optimizer as a class that declares its state layout, as a kernel backend does."""

    gefen_state_layout = reference_dcp.STATE_LAYOUT


@pytest.mark.parametrize("example", DECLARED, ids=lambda e: f"{e.rule}-{e.what}")
def test_a_declared_reference_passes_the_declared_layout_examples(example, request):
    """The examples of SPEC 2.3.6 run for a declared class only: the reference's own is not one."""
    declared = dataclasses.replace(
        registry.resolve("reference"), make_optimizer=lambda params, **kw: _DeclaredReference(params, **kw)
    )
    _check(example, request)(declared, example)


def test_every_rule_of_the_examples_has_its_mutants():
    """:func:`_kind`: each rule's examples have the mutants of their kind."""
    kinds = {(m.rule, m.kind) for m in rule_mutants.mutants("torch-exact")}
    needed = {(e.rule, _kind(e)) for e in EXAMPLES}
    assert needed <= kinds, sorted(needed - kinds)
    assert {r for r, _ in kinds} <= {e.rule for e in EXAMPLES}


def _named_by_the_suite() -> set:
    """The rule ids the suite's tests name: their ``gefen_clause`` marks' strings, the pinned
    steps' clauses and the examples' rules."""
    named = {e.rule for e in EXAMPLES}
    for path in SUITE.glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "gefen_clause":
                named |= {a.value for a in node.args if isinstance(a, ast.Constant)}
    from gefen_conformance.suite.pinned_steps import CLAUSES

    named |= {c for clauses in CLAUSES.values() for c in clauses}
    return named & rules.rule_ids()


def test_every_rule_the_suite_names_is_killed_by_a_mutant_or_listed():
    named = _named_by_the_suite()
    killed = {e.clause_in(p) for e in CATALOGUE.values() for p in PROFILES}
    killed |= (
        {m.rule for m in rule_mutants.mutants("torch-exact")}
        | set(rule_mutants.LAYOUT)
        | set(rule_mutants.RESTORE)
    )
    unproven = named - killed
    assert not unproven - WITHOUT_A_MUTANT, (
        f"named by the suite, killed by no mutant: {sorted(unproven - WITHOUT_A_MUTANT)}"
    )
    assert not WITHOUT_A_MUTANT - unproven, (
        f"listed but killed or no longer named: {sorted(WITHOUT_A_MUTANT - unproven)}"
    )
    marked = {r["id"] for r in rules.register()["rules"] if r.get("not_certified")}
    assert not named & marked, f"named by the suite but marked not certified: {sorted(named & marked)}"


def _adapter_mutants():
    for kind, (rules_of_kind, _, _) in rule_mutants.ADAPTER_MUTANTS.items():
        for rule in sorted(rules_of_kind):
            yield pytest.param(kind, rule, id=f"{kind}-{rule}")


@pytest.mark.proof
@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("kind,rule", _adapter_mutants())
def test_an_adapter_mutant_is_failed_by_the_test_naming_its_rule(kind, rule, profile, tmp_path):
    """A DCP adapter without one layout refusal of SPEC 2.4.1 (a 2-rank partial certification), or
    one that repairs what one rule of SPEC 3.3-3.5 refuses (one-process hostile loads)."""
    selection = rule_mutants.ADAPTER_MUTANTS[kind][1]
    cert = run_suite(rule_mutants.adapter_spec(kind, rule, profile), selection, tmp_path)
    assert failures(cert) > 0, f"the adapter without {rule}'s check survived [{profile}]: {cert['summary']}"
    failed = {c for t in failed_tests(cert) for c in t["clauses"]}
    assert rule in failed, f"{rule} [{profile}]: the failing tests name {sorted(failed)}"
    if kind == "layout":
        assert failures(cert) < len(cert["tests"]) - 1, "more than its own rule's layouts failed"
