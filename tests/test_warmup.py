"""One-time costs are paid before any scenario, outside every deadline (SPEC 4.2.11).

The pool part: a rank's preparation runs before its call's deadline starts, once per worker and
device, and its failure is that rank's failure; the fork server's preload gives every worker the
scenario modules and torch's lazily imported parts before it reports ready. The suite part: an
implementation whose kernels cost seconds per process the first time (a C build, a JIT compile)
certifies with deadlines far shorter than that cost, its ``prepare`` hook called in the test
process and in every rank, and the certificate records the warm-up.
"""

from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch.distributed as dist

from gefen_conformance import Implementation
from gefen_conformance.harness import pool as ranks
from gefen_conformance.harness.pool import RankFailure, run_on_ranks
from gefen_conformance.plugin import warmup

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()) or not sys.platform.startswith("linux"),
    reason="the rank harness needs torch.distributed with gloo, on Linux",
)

PREPARE_S = 3.0


def slow_prepare(directory: str, *, device) -> None:
    """A one-time cost of PREPARE_S seconds per process, recorded in ``directory``."""
    time.sleep(PREPARE_S)
    Path(directory, f"{os.getpid()}-{device}").write_text("prepared")


def failing_prepare(victim_marker: str, *, device) -> None:
    if os.environ.get("GEFEN_TEST_RANK_MARK") == victim_marker and os.environ.get("RANK") == "1":
        raise RuntimeError("the kernels of rank 1 failed to build")


def quick_pid() -> int:
    return os.getpid()


def loaded_modules() -> dict:
    return {
        name: name in sys.modules
        for name in (
            "torch._dynamo",
            "torch.distributed.checkpoint.filesystem",
            "gefen_conformance.suite.test_dcp_failures",
            "gefen_reference.dcp",
        )
    }


@pytest.fixture
def preparation():
    """Whatever a test sets with ``prepare_workers`` is undone, and its workers are not reused."""
    yield ranks.prepare_workers
    ranks.prepare_workers()
    ranks.shutdown_pool()


def test_a_rank_prepares_once_before_its_call_and_the_deadline_counts_from_then(preparation, tmp_path):
    preparation(prepare=slow_prepare, args=(str(tmp_path),))
    started = time.monotonic()
    first = run_on_ranks(quick_pid, 2, timeout=1.0)  # 1 s: far less than the preparation
    assert time.monotonic() - started >= PREPARE_S
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"{pid}-cpu" for pid in first)
    second = run_on_ranks(quick_pid, 2, timeout=1.0)
    assert set(second) == set(first)  # the same warm workers, not prepared again
    assert len(list(tmp_path.iterdir())) == 2


def test_a_rank_whose_preparation_raises_fails_the_call_before_it_starts(preparation, monkeypatch):
    monkeypatch.setenv("GEFEN_TEST_RANK_MARK", "this-test")
    preparation(prepare=failing_prepare, args=("this-test",))
    with pytest.raises(RankFailure) as info:
        run_on_ranks(quick_pid, 2, timeout=30)
    rank0, rank1 = info.value.outcomes
    assert rank1.status == "raised" and "[while preparing this rank on cpu]" in rank1.message
    assert "the kernels of rank 1 failed to build" in rank1.traceback
    assert rank0.status == "raised" and "did not start: rank 1 failed while preparing" in rank0.message
    monkeypatch.setenv("GEFEN_TEST_RANK_MARK", "another")  # the same preparation, now succeeding
    assert len(run_on_ranks(quick_pid, 2, timeout=30)) == 2


def test_prepared_workers_start_with_the_scenario_modules_and_torchs_lazy_imports(preparation):
    preparation(warmup.RANK_PRELOAD)
    ranks.shutdown_pool()  # fresh workers
    for loaded in run_on_ranks(loaded_modules, 2, timeout=60):
        assert loaded == dict.fromkeys(loaded, True), loaded


def test_a_prepare_hook_must_be_callable():
    with pytest.raises(TypeError, match="prepare must be callable"):
        Implementation(name="x", version="0", make_optimizer=lambda params, **hp: None, prepare="build")


# ------------------------------------------------------------------------------- in the suite

SLOW_BUILD = textwrap.dedent('''
    """An implementation (the reference's optimizer) whose kernels cost COST_S seconds the first
    time each process uses them, as a per-process JIT compile does; it declares that cost as its
    ``prepare`` hook, and every use checks that the hook ran in this process first."""
    import json, os, time
    from gefen_conformance import CPU_BIT_EXACT, DCP_RESHARD, NATIVE_STATE_DICT, Implementation
    from gefen_conformance.implementations.reference import IMPLEMENTATION as REFERENCE

    COST_S = float(os.environ["SLOW_BUILD_COST_S"])
    _BUILT = []

    def prepare(device):
        time.sleep(COST_S)
        _BUILT.append(str(device))
        with open(os.environ["SLOW_BUILD_LOG"], "a") as log:
            log.write(json.dumps({"pid": os.getpid(), "device": str(device)}) + "\\n")

    def make_optimizer(params, **hyperparameters):
        if not _BUILT:  # the cost lands here when nobody prepared this process
            prepare("cpu")
        return REFERENCE.make_optimizer(params, **hyperparameters)

    IMPLEMENTATION = Implementation(
        name="slowbuild", version="1", make_optimizer=make_optimizer, dcp_state=REFERENCE.dcp_state,
        save_planner=REFERENCE.save_planner, async_writer=REFERENCE.async_writer,
        capabilities={CPU_BIT_EXACT, DCP_RESHARD, NATIVE_STATE_DICT}, prepare=prepare)
''')


# a whole suite run in a subprocess: .ci/run runs it (the default run stays under 5 minutes)
@pytest.mark.slow
def test_a_per_process_build_longer_than_the_deadlines_is_paid_before_them(pytester, monkeypatch):
    """Ranks "hung" at the deadline inside a kernel build. Here every
    process pays a 4 s build and the scenarios' deadlines are scaled down to 3 s (killed save)
    and 6 s: the certification still passes, because every build happens before any deadline."""
    pytester.makepyfile(slowbuild=SLOW_BUILD)
    log = pytester.path / "builds.jsonl"
    cert = pytester.path / "c.json"
    monkeypatch.setenv("SLOW_BUILD_COST_S", "4")
    monkeypatch.setenv("SLOW_BUILD_LOG", str(log))
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(pytester.path), os.environ.get("PYTHONPATH")]))
    )
    result = pytester.runpytest_subprocess(
        "-p",
        "no:cacheprovider",
        "--impl=slowbuild:IMPLEMENTATION",
        "--gefen-deadline-scale=0.1",
        f"--certificate={cert}",
        "-k",
        "test_rank_killed_mid_save",
    )
    out = result.stdout.str() + result.stderr.str()
    assert result.ret == 6, out  # partial (-k), every test passed
    data = json.loads(cert.read_text())
    assert data["summary"]["passed"] == 1 and data["summary"]["failed"] == 0, out
    assert data["execution"]["deadline_scale"] == 0.1
    assert data["execution"]["warm_up_s"] >= 4.0
    builds = [json.loads(line) for line in log.read_text().splitlines()]
    pids = [b["pid"] for b in builds]
    assert len(pids) == len(set(pids)), "a process built twice"
    # the test process and at least the two ranks of the first call, and the two that replace
    # the killed call's ranks: each built once, before its first call's deadline
    assert len(pids) >= 5 and {b["device"] for b in builds} == {"cpu"}


def test_the_rank_fixtures_are_the_suites_own():
    """A renamed fixture must not silently turn the warm-up's rank workers off (SPEC 4.2.11): every
    name the warm-up looks for is a fixture the suite defines, and the multi-rank scenarios take it."""
    import inspect

    from gefen_conformance.plugin import fixtures, warmup
    from gefen_conformance.suite import test_dcp_reshard

    for name in warmup.RANK_FIXTURES:
        assert callable(getattr(fixtures, name, None)), f"{name} is not a fixture of the suite"
    # the multi-rank scenarios reach the rank runner through the checkpoint cache
    assert set(inspect.signature(fixtures.gefen_checkpoints).parameters) & set(warmup.RANK_FIXTURES)
    scenario = test_dcp_reshard.test_reshard_restores_model_and_continues_within_bound
    assert "gefen_checkpoints" in inspect.signature(scenario).parameters
