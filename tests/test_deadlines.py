"""The load clock and the deadline scale (SPEC 4.2.10), on a machine whose load the test sets.

``deadlines._others`` (the runnable threads besides the caller) and ``deadlines._cpus`` are
replaced, so the clock's arithmetic is checked exactly whatever the real machine is doing;
tests/test_load.py checks the harness under real load (slow).
"""

from __future__ import annotations

import time

import pytest

from gefen_conformance.harness import deadlines


@pytest.fixture
def machine(monkeypatch):
    """A machine with 2 CPUs and ``machine.others`` runnable threads (settable)."""

    class Machine:
        others = 0.0

    m = Machine()
    monkeypatch.setattr(deadlines, "_cpus", lambda: 2)
    monkeypatch.setattr(deadlines, "_others", lambda: m.others)
    previous = deadlines.set_scale(None)
    yield m
    deadlines.set_scale(previous)


def _run_until_expired(
    deadline: deadlines.Deadline, limit_s: float = 10.0, since: float | None = None
) -> float:
    # measured from the deadline's own start unless told: the caller built it a moment before this call
    started = deadline.started if since is None else since
    while not deadline.expired():
        assert time.monotonic() - started < limit_s, "the deadline never expired"
        time.sleep(min(0.01, deadline.wait_s() or 0.01))
    return time.monotonic() - started


@pytest.mark.parametrize("others, stretch", [(0, 1.0), (2, 1.0), (3, 1.5), (8, 4.0), (16, 8.0), (1000, 20.0)])
def test_the_stretch_is_the_oversubscription_between_1_and_20(machine, others, stretch):
    machine.others = others
    assert deadlines.stretch_now() == stretch
    assert deadlines.settled_stretch() == stretch


def test_a_quiet_machine_expires_a_deadline_at_its_length(machine):
    elapsed = _run_until_expired(deadlines.Deadline(0.3))
    assert 0.3 <= elapsed < 0.6


def test_a_loaded_machine_stretches_a_deadline_by_its_load(machine):
    machine.others = 8  # 8 runnable threads on 2 CPUs: everything runs 4x slower
    deadline = deadlines.Deadline(0.2)
    elapsed = _run_until_expired(deadline)
    assert 0.8 <= elapsed < 1.3
    assert deadline.peak_stretch == 4.0
    assert "stretched to" in deadline.describe() and "(up to 4.0x)" in deadline.describe()


def test_the_stretch_follows_the_load_as_it_changes(machine):
    deadline = deadlines.Deadline(0.4)
    machine.others = 16  # 8x for 0.8 s of wall time: 0.1 quiet seconds
    time.sleep(0.8)
    deadline.tick()
    assert deadline.spent == pytest.approx(0.1, abs=0.03)
    machine.others = 0  # then quiet: the remaining 0.3 s at wall speed
    elapsed = _run_until_expired(deadline, since=time.monotonic())
    assert 0.25 <= elapsed < 0.5


def test_a_hang_is_still_reported_under_any_load(machine):
    machine.others = 10_000  # absurd load: the stretch is capped, so the bound holds
    elapsed = _run_until_expired(deadlines.Deadline(0.05), limit_s=5)
    assert 0.05 * deadlines.MAX_STRETCH <= elapsed < 0.05 * deadlines.MAX_STRETCH + 0.5


def test_the_deadline_scale_multiplies_every_bound(machine):
    deadlines.set_scale(3)
    deadline = deadlines.Deadline(0.1)
    assert deadline.quiet == pytest.approx(0.3)
    assert 0.3 <= _run_until_expired(deadline) < 0.6
    assert "scaled by 3 to 0.3 s" in deadline.describe()
    assert deadlines.wall_bound(2.0) == pytest.approx(6.0)
    machine.others = 8
    assert deadlines.wall_bound(2.0) == pytest.approx(24.0)  # scaled, then stretched by the load now


def test_the_scale_reaches_child_processes_through_the_environment(machine, monkeypatch):
    deadlines.set_scale(2.5)
    assert deadlines.os.environ[deadlines.SCALE_ENV] == "2.5"
    deadlines.set_scale(None)
    assert deadlines.SCALE_ENV not in deadlines.os.environ
    monkeypatch.setenv(deadlines.SCALE_ENV, "4")
    assert deadlines.scale() == 4.0


@pytest.mark.parametrize("text", ["0", "-1", "nan", "inf", "fast", ""])
def test_a_scale_that_is_not_a_finite_positive_number_is_refused(text):
    with pytest.raises(ValueError, match="deadline scale"):
        deadlines.parse_scale(text)


def test_wait_until_waits_on_the_load_clock(machine):
    machine.others = 8
    started = time.monotonic()
    assert deadlines.wait_until(lambda seconds: time.sleep(seconds) or False, 0.1) is False
    assert 0.4 <= time.monotonic() - started < 0.8
    assert deadlines.wait_until(lambda seconds: True, 0.1) is True
