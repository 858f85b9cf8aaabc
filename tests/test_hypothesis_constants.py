"""A suite run's examples depend on the suite's version only (SPEC 4.4.4): hypothesis's constants
drawn from the source of local modules are turned off while a suite run's profile is in effect."""

from __future__ import annotations

import importlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gefen_conformance.plugin.hypothesis_profiles import HypothesisProfile


def _new_constants(base: int) -> str:
    """500 integers no module of the project holds (hypothesis reads at most 1024 from one module)."""
    return "".join(f"C{i} = {base + 7919 * i}\n" for i in range(500))


def _drawn() -> list:
    """The 300 derandomized examples of one fixed property (the same function each call)."""
    seen: list = []

    @settings(derandomize=True, max_examples=300, database=None, deadline=None)
    @given(st.integers())
    def integers(x):
        seen.append(x)

    integers()
    return seen


def _import_new_constants(tmp_path, monkeypatch, name: str, base: int) -> None:
    (tmp_path / f"{name}.py").write_text(_new_constants(base))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module(name)  # kept in sys.modules: hypothesis notices new modules by their count


def test_hypothesis_draws_from_local_modules_without_the_suites_profile(tmp_path, monkeypatch):
    """The behaviour the suite turns off: importing a local module changes derandomized examples."""
    providers = pytest.importorskip("hypothesis.internal.conjecture.providers")
    if not hasattr(providers, "_get_local_constants"):
        pytest.skip("this hypothesis draws no constants from local modules")
    before = _drawn()
    _import_new_constants(tmp_path, monkeypatch, "gefen_constants_probe_a", 987_654_321_000)
    assert _drawn() != before


def test_a_suite_runs_examples_do_not_change_with_the_modules_imported(tmp_path, monkeypatch):
    profile = HypothesisProfile("default")  # keeps the active profile: only the constants change
    profile.enter()
    try:
        before = _drawn()
        _import_new_constants(tmp_path, monkeypatch, "gefen_constants_probe_b", 123_456_789_000)
        assert _drawn() == before
    finally:
        profile.exit()
