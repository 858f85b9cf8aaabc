"""A slow machine gives a slow run, not a different verdict (SPEC 4.2.10, 4.2.11, 4.4.6),
tried it: with the machine oversubscribed (``benchmarks/load.py``: 4 busy processes per core, on
top of whatever else runs), correct scenarios are not taken for hung ones, a rank that truly hangs
is still reported within the stated bound, and Ctrl-C still ends a certification within 5 s with
nothing left running. All slow (minutes each); ``.ci/run`` runs them.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from gefen_conformance.harness import deadlines
from gefen_conformance.harness.pool import RankFailure, run_on_ranks

from . import test_ranks
from .interrupt_probe import interrupt_run
from .support import deadline_wall_s

REPO = Path(__file__).resolve().parents[1]
PER_CORE = 4

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (dist.is_available() and dist.is_gloo_available()) or not sys.platform.startswith("linux"),
        reason="the rank harness needs torch.distributed with gloo, on Linux",
    ),
]


def _load_module():
    spec = importlib.util.spec_from_file_location("gefen_benchmarks_load", REPO / "benchmarks" / "load.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def oversubscribed():
    """PER_CORE busy processes per core for the test (bounded to 30 min, always stopped)."""
    with _load_module().Oversubscribed(PER_CORE, 1800) as load:
        time.sleep(2.0)  # let the load show in the kernel's run queue
        yield load
        assert load.alive() == load.count, "a busy process ended early: the load was not applied throughout"


def test_the_load_generator_is_bounded_and_cleaned_up():
    module = _load_module()
    with module.Oversubscribed(1, 1.0) as load:
        pids = [p.pid for p in load.processes]
        assert load.count == module.usable_cpus() and load.alive() == load.count
        time.sleep(2.5)
        assert load.alive() == 0  # each stopped at its own deadline
    with module.Oversubscribed(1, 600) as load:
        pids = [p.pid for p in load.processes]
    assert not [
        pid
        for pid in pids
        if Path(f"/proc/{pid}").exists()
        and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    ]


def test_the_harness_bounds_hold_at_load(oversubscribed):
    run_on_ranks(test_ranks._pid, 2, timeout=60)  # two warm workers: what follows times the call, not a start
    # a rank that truly hangs: still reported, within its deadline as the load stretched it
    started = time.monotonic()
    with pytest.raises(RankFailure) as info:
        run_on_ranks(test_ranks._nap_forever_on_rank_1, 2, timeout=5.0)
    elapsed = time.monotonic() - started
    rank0, rank1 = info.value.outcomes
    assert (rank0.status, rank1.status) == ("raised", "hung"), str(info.value)
    wall = deadline_wall_s(rank1.message, 5.0)
    assert 5.0 <= wall <= 5.0 * deadlines.MAX_STRETCH * 1.05
    assert elapsed < wall + 2 * deadlines.settled_stretch() + 3, rank1.message
    # a rank that raises or dies mid-collective: its peers fail at once, nobody is taken for hung
    with pytest.raises(RankFailure) as info:
        run_on_ranks(test_ranks._rank1_raises_rank0_in_collective, 2, timeout=30)
    assert [o.status for o in info.value.outcomes] == ["raised", "raised"]
    with pytest.raises(RankFailure) as info:
        run_on_ranks(test_ranks._exit_mid_collective, 3, timeout=20)
    assert [o.status for o in info.value.outcomes] == ["raised", "died", "raised"]
    # and correct ranks on fresh workers, whose first imports happen before the deadline
    assert sorted(
        r["rank"] for r in run_on_ranks(test_ranks._identity_and_sum, 4, args=("t",), timeout=60)
    ) == [0, 1, 2, 3]


def test_the_failure_scenarios_certify_at_load(oversubscribed, tmp_path):
    """The scenarios most likely to read as hung at load 10-20 (the killed save, the async save, the
    refused load), with fresh rank workers replacing failed ones: all pass, as on a quiet machine."""
    cert_path = tmp_path / "c.json"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "gefen_conformance.cli",
            "certify",
            "--impl",
            "reference",
            "--out",
            str(cert_path),
            "--",
            "-q",
            "-k",
            "test_dcp_failures or test_dcp_async",
        ],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert result.returncode == 6, (
        result.stdout[-4000:] + result.stderr[-2000:]
    )  # partial (-k), nothing failed
    cert = json.loads(cert_path.read_text())
    assert (
        cert["summary"]["passed"] >= 6 and cert["summary"]["failed"] == 0 and cert["summary"]["error"] == 0
    ), [t for t in cert["tests"] if t["outcome"] != "passed"]


@pytest.mark.parametrize("at_s, after_tests", [(15, None), (None, 0.25)], ids=["15s", "quarter-of-tests"])
def test_ctrl_c_at_load_stops_within_5_s_with_nothing_left(oversubscribed, tmp_path, at_s, after_tests):
    report = interrupt_run(tmp_path, at_s, after_tests=after_tests)
    assert not report["finished_before_signal"], report["output"][-3000:]
    assert report["exit"] not in (0, None), report["output"][-3000:]
    assert report["stopped_after_s"] < 5, report["output"][-3000:]
    assert report["left"] == [], report["left"]
    assert report["gone_after_s"] < 5, report  # every process of the run, within 5 s of the signal
    if report["verdict"] is not None:
        assert report["verdict"] == "incomplete"
        assert report["certificates"] == ["gefen-certificate-reference.partial.json"]
