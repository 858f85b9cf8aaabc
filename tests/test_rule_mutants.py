"""Certified means killed (SPEC 0.2.4): every rule the suite names by id has a mutant, an
implementation wrong in that rule alone, that a suite test naming the rule fails, in both
profiles; and the reference passes every example.

The constructor's, the native load's and the step's rules are proven here in-process (their checks
take milliseconds, tests/rule_mutants.py); so are a one-process DCP save's (the save examples run
in a gloo group of one made for this module and destroyed after it) and the DCP load's that one
process shows (SPEC 3.1-3.7, the suite's checks called under a gloo group of one in this process:
its examples, its hyperparameter staging examples and its hostile checkpoints), and the load's
agreement (SPEC 3.2.3) by one launcher call on two ranks. The 2-rank layout refusals of SPEC 2.4.1
are proven by partial certifications in a subprocess (``-m proof``); rules that are single clauses
are proven by the catalogue of tests/mutants.py, through tests/test_suite_catches_mutants.py. Every
proof is marked ``proof`` (hundreds of mutants in two profiles: minutes of CPU): ``.ci/run`` runs
them, the README's test command leaves them out; the checks that the reference passes every example
and that the lists are exact run everywhere."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

import gefen_reference as reference
import gefen_reference.dcp as reference_dcp
from gefen_conformance.certificate import rules
from gefen_conformance.implementations import registry
from gefen_conformance.suite import dcp_load_checks, hostile, rule_checks, staging_examples
from gefen_conformance.suite import test_hostile_checkpoints as hostile_tests
from gefen_conformance.suite import test_hyper_staging as hyper_staging_tests
from gefen_conformance.suite.dcp_load_examples import DCP_LOAD, DcpLoadRefused
from gefen_conformance.suite.rule_examples import (
    CONSTRUCTOR,
    NATIVE_LOAD,
    NATIVE_STATE,
    SHARDED_LOAD,
    Built,
    LoadAccepted,
    RoundTrip,
    ShardedLoad,
    Stepped,
    StepRefused,
)
from gefen_conformance.suite.save_rule_examples import DECLARED, SAVES, Saved
from gefen_conformance.suite.staging import StagingCase
from gefen_conformance.suite.step_rule_examples import REFUSED_CALLS, STEPPED

from . import rule_mutants
from .mutant_tools import failed_tests, failures, run_suite
from .mutants import CATALOGUE, PROFILES
from .support import world_of_one

EXAMPLES = CONSTRUCTOR + NATIVE_LOAD + NATIVE_STATE + SHARDED_LOAD + STEPPED + REFUSED_CALLS + SAVES

#: Rules the suite names by id that no mutant kills yet (the package's unproven_rules.json): the
#: certificate counts them as checked without a mutant proof. An entry that gains a mutant must
#: leave; a rule newly named without one fails the test below.
WITHOUT_A_MUTANT = rules.unproven()  # fmt: skip
#: Rules that bind the torch-exact profile alone (SPEC 0.2.4): their mutants round differently, which
#: the tolerance profile accepts, so they are proven under torch-exact only.
TORCH_EXACT_ONLY = {r["id"] for r in rules.register()["rules"] if r.get("profile") == "torch-exact"}


@pytest.fixture(scope="module")
def one_rank():
    """A gloo group of one for the DCP save and load examples, destroyed when the module's tests
    are done."""
    with world_of_one() as world:
        yield world


def _check(example, request):
    if isinstance(example, Stepped):
        return rule_checks.check_stepped
    if isinstance(example, ShardedLoad):
        return _in_a_world_of_one(rule_checks.check_sharded_load)
    if example in NATIVE_STATE:
        return rule_checks.check_native_state
    if isinstance(example, StepRefused):
        return rule_checks.check_step_refused
    if example in SAVES:
        world = request.getfixturevalue("one_rank")
        return lambda impl, e: rule_checks.check_save(impl, e, world)
    return rule_checks.check_constructor if example in CONSTRUCTOR else rule_checks.check_native_load


def _in_a_world_of_one(check):
    """``check`` run in an in-process group of one, as the suite's ``gefen_one_rank`` runs it."""

    def run(impl, example):
        with world_of_one():
            check(impl, example)

    return run


def _kind(example) -> str:
    """A refusal needs a lenient mutant (the check left out), an acceptance a strict one, a step a
    wrong one."""
    if isinstance(example, Stepped):
        return "wrong"
    if isinstance(example, ShardedLoad):
        return "lenient" if example.steps or example.save else "strict"
    return "strict" if isinstance(example, (Built, LoadAccepted, RoundTrip, Saved)) else "lenient"


@pytest.mark.proof
@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("mutant", rule_mutants.mutants("torch-exact"), ids=lambda m: m.id)
def test_a_rule_mutant_is_failed_by_a_test_naming_its_rule(mutant, profile, request):
    if profile == "tolerance" and mutant.rule in TORCH_EXACT_ONLY:
        pytest.skip(f"{mutant.rule} binds the torch-exact profile only (the register's profile)")
    (declared,) = [m for m in rule_mutants.mutants(profile) if m.id == mutant.id]
    _assert_failed_for_its_rule(
        mutant, profile, EXAMPLES, lambda e: _check(e, request)(declared.implementation, e)
    )


def _assert_failed_for_its_rule(mutant, profile, examples, check) -> None:
    """``check`` fails at least one example of ``mutant`` 's rule, and only for that rule."""
    failures = []
    for example in (e for e in examples if e.rule == mutant.rule):
        try:
            check(example)
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


TABLES = {
    "constructor": CONSTRUCTOR,
    "native-load": NATIVE_LOAD,
    "native-state": NATIVE_STATE,
    "stepped": STEPPED,
    "refused-calls": REFUSED_CALLS,
}


@pytest.mark.parametrize("table", sorted(TABLES))
def test_every_example_is_named_once_in_its_test(table):
    """An example's ``what`` is its test id: two alike would be told apart only by pytest's suffixes."""
    names = [e.what for e in TABLES[table]]
    assert len(names) == len(set(names)), sorted({n for n in names if names.count(n) > 1})


def test_every_rule_of_the_examples_has_its_mutants():
    """:func:`_kind`: each rule's examples have the mutants of their kind."""
    kinds = {(m.rule, m.kind) for m in rule_mutants.mutants("torch-exact")}
    needed = {(e.rule, _kind(e)) for e in EXAMPLES}
    assert needed <= kinds, sorted(needed - kinds)
    assert {r for r, _ in kinds} <= {e.rule for e in EXAMPLES}


@functools.cache
def _named_by_collected_tests() -> frozenset:
    """The rule ids the suite's collected tests name in their ``gefen_clause`` marks, computed ones
    included: a collection of the whole suite (every tier) in a subprocess."""
    with tempfile.TemporaryDirectory() as scratch:
        dump = Path(scratch) / "clauses.json"
        command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
        command += ["-p", "tests.clause_dump", "--impl=reference"]
        done = subprocess.run(
            command,
            cwd=Path(__file__).resolve().parents[1],
            env={**os.environ, "GEFEN_CLAUSE_DUMP": str(dump)},
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert dump.exists(), done.stdout[-2000:] + done.stderr[-2000:]
        named = json.loads(dump.read_text(encoding="utf-8"))
    return frozenset(c for clauses in named.values() for c in clauses) & rules.rule_ids()


def test_every_rule_the_suite_names_is_killed_by_a_mutant_or_listed():
    named = _named_by_collected_tests()
    killed = {e.clause_in(p) for e in CATALOGUE.values() for p in PROFILES}
    killed |= (
        {m.rule for m in rule_mutants.mutants("torch-exact")}
        | {m.rule for m in rule_mutants.dcp_load_mutants("torch-exact")}
        | set(rule_mutants.LAYOUT)
        | set(rule_mutants.RESTORE)
        | set(rule_mutants.STAGING)
        | set(rule_mutants.AGREEMENT)
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


def test_every_rule_not_marked_is_named_by_the_suite():
    """A rule the register does not mark not certified is named by some suite test: no run of the
    whole suite leaves it unchecked."""
    unmarked = {r["id"] for r in rules.register()["rules"] if not r.get("not_certified")}
    assert not unmarked - _named_by_collected_tests(), sorted(unmarked - _named_by_collected_tests())


def test_at_least_95_percent_of_the_register_is_certified_by_the_suite():
    """The register's figure (SPEC 0.2.4): the rules the suite names, less those no mutant has been
    shown to fail for (the tests above prove the rest, in every profile that certifies them), against
    all rules of the register."""
    register = rules.register()["rules"]
    certified = _named_by_collected_tests() - WITHOUT_A_MUTANT
    assert len(certified) >= 0.95 * len(register), f"{len(certified)} of {len(register)} rules certified"


# ------------------------------------------------------------------------------ DCP loads in one process


@pytest.mark.proof
@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("mutant", rule_mutants.dcp_load_mutants("torch-exact"), ids=lambda m: m.id)
def test_a_dcp_load_mutant_is_failed_by_a_test_naming_its_rule(mutant, profile, one_rank):
    if profile == "tolerance" and mutant.rule in TORCH_EXACT_ONLY:
        pytest.skip(f"{mutant.rule} binds the torch-exact profile only (the register's profile)")
    (declared,) = [m for m in rule_mutants.dcp_load_mutants(profile) if m.id == mutant.id]
    _assert_failed_for_its_rule(
        mutant, profile, DCP_LOAD, lambda e: dcp_load_checks.check(declared.implementation, e, one_rank)
    )


@pytest.mark.parametrize("example", DCP_LOAD, ids=lambda e: f"{e.rule}-{e.what}")
def test_the_reference_passes_every_dcp_load_example(example, one_rank):
    dcp_load_checks.check(registry.resolve("reference"), example, one_rank)


def test_every_rule_of_the_dcp_load_examples_has_its_mutants():
    """A refusal needs a lenient mutant, a restore a strict or a wrong one."""
    kinds = {(m.rule, m.kind) for m in rule_mutants.dcp_load_mutants("torch-exact")}
    for example in DCP_LOAD:
        wanted = {"lenient"} if isinstance(example, DcpLoadRefused) else {"strict", "wrong"}
        assert {k for r, k in kinds if r == example.rule} & wanted, (example.rule, example.what)
    assert {r for r, _ in kinds} <= {e.rule for e in DCP_LOAD}


def _named(test, rule: str) -> bool:
    return any(rule in m.args for m in getattr(test, "pytestmark", []) if m.name == "gefen_clause")


@pytest.mark.proof
@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("rule", sorted(rule_mutants.STAGING))
def test_a_staging_mutant_is_failed_by_the_property_naming_its_rule(rule, profile, one_rank):
    """The explicit examples of the property that names ``rule`` (``LIMITS`` or ``OPEN_LIMITS``),
    loaded by the staging mutant of ``rule``: one of them finds a problem."""
    what, _, test_name = rule_mutants.STAGING[rule]
    test = getattr(hyper_staging_tests, test_name)
    assert _named(test, rule), f"{test_name} does not name {rule}"
    examples = staging_examples.OPEN_LIMITS if "aliased" in test_name else staging_examples.LIMITS
    impl = rule_mutants.staging_mutant(rule, profile)
    for saved, dests in examples.values():
        found = StagingCase(saved, dests).comparisons(impl, bitwise=profile == "torch-exact", world=one_rank)
        if found.problems:
            return
    pytest.fail(f"the staging mutant of {rule} ({what}) passes every example of {test_name} [{profile}]")


@pytest.fixture(scope="module")
def hostile_variants(one_rank, tmp_path_factory):
    return hostile.craft_all(str(tmp_path_factory.mktemp("hostile")))


@pytest.mark.proof
@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("rule", sorted(rule_mutants.RESTORE))
def test_a_restore_mutant_is_failed_by_the_hostile_cases_of_its_rule(rule, profile, hostile_variants):
    """A DCP adapter that repairs what one rule of SPEC 3.3-3.5 refuses loads the hostile cases
    that break that rule (``test_refused_without_mutation`` names the rule for each): one of them
    is accepted or refused for another reason."""
    impl = rule_mutants.restore_mutant(rule, profile)
    cases = [case for case, (broken, _) in hostile.RULES.items() if broken == rule]
    assert cases, f"no hostile case breaks {rule}"
    problems = [
        p
        for case in cases
        for p in hostile.refusal_problems(case, hostile.load_attempt(impl, hostile_variants[case]))
    ]
    assert problems, (
        f"the adapter with {rule_mutants.RESTORE[rule][0]!r} refuses every case of {rule} [{profile}]"
    )


@pytest.mark.proof
@pytest.mark.parametrize("rule", sorted(rule_mutants.AGREEMENT))
def test_a_load_agreement_mutant_is_failed_on_two_ranks(rule, hostile_variants):
    """``test_refused_on_every_rank[nan-momentum]`` (naming the rule) on two ranks, one launcher
    call for both profiles' mutants: the damaged row is rank 0's, so rank 1 stages successfully
    and, without the agreement, commits where every rank must raise."""
    from gefen_conformance.harness import launch

    assert _named(hostile_tests.test_refused_on_every_rank, rule)
    specs = [rule_mutants.agreement_spec(rule, profile) for profile in PROFILES]
    outcomes = launch.run(
        rule_mutants.agreement_attempts,
        2,
        (specs, hostile_variants["nan-momentum"]),
        timeout=60.0,
        allow_failure=True,
    )
    for o in outcomes:
        assert o.status == "ok", f"rank {o.rank} {o.status}: {o.message}"
    for i, profile in enumerate(PROFILES):
        accepted = [o.rank for o in outcomes if o.value[i]["error"] is None]
        assert accepted, f"every rank refused nan-momentum without the agreement of {rule} [{profile}]"


def _adapter_mutants():
    for kind, (rules_of_kind, _, _) in rule_mutants.ADAPTER_MUTANTS.items():
        for rule in sorted(rules_of_kind):
            yield pytest.param(kind, rule, id=f"{kind}-{rule}")


@pytest.mark.proof
@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize("kind,rule", _adapter_mutants())
def test_an_adapter_mutant_is_failed_by_the_test_naming_its_rule(kind, rule, profile, tmp_path):
    """A DCP adapter without one layout refusal of SPEC 2.4.1 (a 2-rank partial certification)."""
    selection = rule_mutants.ADAPTER_MUTANTS[kind][1]
    cert = run_suite(rule_mutants.adapter_spec(kind, rule, profile), selection, tmp_path)
    assert failures(cert) > 0, f"the adapter without {rule}'s check survived [{profile}]: {cert['summary']}"
    failed = {c for t in failed_tests(cert) for c in t["clauses"]}
    assert rule in failed, f"{rule} [{profile}]: the failing tests name {sorted(failed)}"
    assert failures(cert) < len(cert["tests"]) - 1, "more than its own rule's layouts failed"
