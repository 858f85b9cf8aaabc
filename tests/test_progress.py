"""A progress line per suite module, with the elapsed time and an estimate of what is left
(SPEC 4.4.11): 35-40 s of silence after "collected 127 items"."""

from __future__ import annotations

import re

import pytest

from gefen_conformance.plugin.progress import Progress, duration

LINE = re.compile(
    r"^gefen: (test_\w+\.py) done, (\d+) tests? in .+; (\d+) of (\d+) tests in [^,]+(, about .+ left)?$"
)


class _Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def _progress():
    lines, clock = [], _Clock()
    return Progress(lines.append, clock), lines, clock


def test_a_line_when_the_last_test_of_a_module_finishes_with_an_estimate_from_the_rate_so_far():
    progress, lines, clock = _progress()
    progress.expect(
        [
            "conformance/suite/test_a.py::t1",
            "conformance/suite/test_a.py::t2",
            "test_b.py::u[1]",
            "test_b.py::u[2]",
        ]
    )
    for i, test in enumerate(["test_a.py::t1", "test_a.py::t2"]):
        progress.started_test(test)
        clock.now += 5
        progress.finished_test(test)
        assert len(lines) == i  # only when the module is done
    assert lines == ["gefen: test_a.py done, 2 tests in 10 s; 2 of 4 tests in 10 s, about 10 s left"]
    progress.started_test("test_b.py::u[1]")
    clock.now += 80
    progress.finished_test("test_b.py::u[1]")
    progress.finished_test("test_b.py::u[1]")  # a test reported twice counts once
    progress.started_test("test_b.py::u[2]")
    clock.now += 30
    progress.finished_test("test_b.py::u[2]")
    assert lines[1] == "gefen: test_b.py done, 2 tests in 1 min 50 s; 4 of 4 tests in 2 min 00 s"
    assert all(LINE.match(line) for line in lines)


def test_tests_outside_the_selection_are_ignored_and_the_first_selection_wins():
    progress, lines, clock = _progress()
    progress.expect(["test_a.py::t1"])
    progress.expect(["test_a.py::t1", "test_a.py::t2"])  # a second xdist worker reports the same collection
    progress.started_test("tests/test_mine.py::x")
    progress.finished_test("tests/test_mine.py::x")
    assert lines == [] and progress.started is None
    progress.started_test("test_a.py::t1")
    progress.finished_test("test_a.py::t1")
    assert lines == ["gefen: test_a.py done, 1 test in 0.0 s; 1 of 1 tests in 0.0 s"]


def test_durations_read_as_people_read_them():
    assert [duration(s) for s in (0.04, 9.94, 42.4, 61, 3599.4, 3725)] == [
        "0.0 s",
        "9.9 s",
        "42 s",
        "1 min 01 s",
        "59 min 59 s",
        "1 h 02 min",
    ]


SELECTION = ["-k", "test_global_step_counts_every_step_call or test_dcp_names"]


def _run(pytester, *extra):
    return pytester.runpytest_subprocess("--impl=reference", "-p", "no:cacheprovider", *SELECTION, *extra)


# the xdist run is a whole suite run in two workers: .ci/run runs it (the default run stays under 5 minutes)
WORKERS = [pytest.param([], id="one-process"), pytest.param(["-n", "2"], id="xdist", marks=pytest.mark.slow)]


@pytest.mark.parametrize("workers", WORKERS)
def test_a_real_run_prints_a_line_per_module(pytester, workers):
    result = _run(pytester, *workers)
    out = result.stdout.str()
    assert result.ret == 6, out  # partial
    lines = [line for line in out.splitlines() if line.startswith("gefen: ")]
    modules = sorted(LINE.match(line).group(1) for line in lines)
    assert modules == ["test_dcp_names.py", "test_optimizer.py"], out
    totals = {LINE.match(line).group(4) for line in lines}
    done = sorted(int(LINE.match(line).group(3)) for line in lines)
    assert totals == {"3"} and done[-1] == 3, out  # 2 name scenarios and the global-step test


# -q decides in one place (SuiteRun.progress) whatever the launcher: .ci/run runs these
@pytest.mark.slow
@pytest.mark.parametrize("workers", WORKERS)
def test_a_real_run_with_q_prints_none(pytester, workers):
    quiet = _run(pytester, *workers, "-q")
    assert quiet.ret == 6 and "gefen: " not in quiet.stdout.str()
