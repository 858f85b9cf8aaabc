"""Reproducers of failed comparisons and ``gefen-conformance repro`` (SPEC 4.5.6).

A drawn case (an input-space case, a staging example) is held by value and replayed in the repro
process; every other test's reproducer names the test, which repro runs again by its id. The
proofs certify two mutants of the catalogue (tests/mutants.py; named from
tests/optimizer_mutants.py, which holds them without importing DCP code) on the one suite test
each fails, through the plugin in a subprocess, then replay that test with ``gefen-conformance
repro`` in another and check that it reports the same failing comparisons with the same numbers,
bit for bit:

* ``lr-half-percent-high`` as a kernel backend (tolerance profile) on a pinned fp32 step: the
  parameter update outside its stage bound (SPEC 5.6.8);
* ``lr-half-percent-high`` as declared (``cpu-bit-exact``, torch-exact profile) on the free-running
  fp32 trajectory: parameters differing bit for bit after six steps (SPEC 5.6.10, 5.3.1).

The repro step's wall time is printed, not asserted (benchmarks/README.md "Reproducers"). The
rest runs in-process, apart from the runs a rerun starts: where the files go and what they never
overwrite, a drawn case's round trip through a file, a test's reproducer by its id, the worst
elements, the command's refusals.
"""

from __future__ import annotations

import functools
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from gefen_conformance import cli, judging, repro
from gefen_conformance.certificate import repro_files
from gefen_conformance.implementations.contract import Implementation
from gefen_conformance.suite import optimizer_cases, replayable, staging
from gefen_conformance.suite.space_checks import InputSpaceCase
from gefen_conformance.suite.space_examples import BOUNDARIES
from gefen_conformance.workload import models, runs
from gefen_oracles import numeric

from .mutant_tools import failed_tests, run_suite

REPO = Path(__file__).resolve().parents[1]


# ------------------------------------------------------------------------------- helpers


@functools.lru_cache(maxsize=1)
def _pinned_state() -> dict:
    return runs.pinned_state(torch.float32, 3, weight_decay=0.05, factored_v_2d=False)


def _pinned_case() -> optimizer_cases.PinnedCase:
    return optimizer_cases.pinned(torch.float32, 3, _pinned_state(), weight_decay=0.05, factored_v_2d=False)


def _half_percent_high(params, **hp):
    """The reference stepping with every group's lr 0.5 % high (the catalogue's ``lr-half-percent-high``)."""
    import gefen_reference

    opt = gefen_reference.Gefen(params, **hp)
    step = opt.step

    def high(closure=None):
        saved = [g["lr"] for g in opt.param_groups]
        for g in opt.param_groups:
            g["lr"] = g["lr"] * 1.005
        try:
            return step(closure)
        finally:
            for g, lr in zip(opt.param_groups, saved):
                g["lr"] = lr

    opt.step = high
    return opt


#: ``_half_percent_high`` as an implementation (a replayable case runs an implementation's side).
HALF_PERCENT_HIGH = Implementation(name="half-percent-high", version="0", make_optimizer=_half_percent_high)


def _space_case() -> InputSpaceCase:
    """A drawn input-space case, held by value: three parameters from a synthesized state, one call."""
    return InputSpaceCase(BOUNDARIES["counter-1"].without_factored())


def _blob(case, bitwise: bool, test_id: str, spec: str = "reference") -> tuple[bytes, list]:
    """A reproducer as the plugin makes it, of ``case`` judged against ``_half_percent_high``: by
    value for a replayable case, by the test's id for a deterministic one."""
    judge = judging.Judge(None, bitwise=bitwise)
    if isinstance(case, replayable.ReplayableCase):
        comparisons = case.comparisons(HALF_PERCENT_HIGH, bitwise=bitwise)
        judge.record(comparisons, case=case)
    else:
        comparisons = case.compare(_half_percent_high, bitwise=bitwise)
        judge.record(comparisons, inputs=case.describe())
    blob = judge.reproducer(test_id, ["5.6"], {"name": "x", "version": "1", "spec": spec}, "cpu")
    return blob, comparisons


def _certificate(tests: list) -> dict:
    return {
        "schema": "gefen-conformance-certificate/2",
        "implementation": {"name": "reference", "version": "1", "capabilities": [], "spec": "reference"},
        "verdict": "not-conformant",
        "summary": {},
        "clauses": {},
        "notes": [],
        "tests": tests,
    }


def _test_entry(test_id: str, comparisons=None, outcome: str = "failed") -> dict:
    margins = []
    for c in comparisons or []:
        if c.kind == "bitwise":
            margins.append({"what": c.what, "kind": "bitwise", "differing": c.differing, "total": c.total})
        else:
            used = c.error / c.bound if c.bound > 0 and math.isfinite(c.error) else None
            margins.append(
                {
                    "what": c.what,
                    "kind": "tolerance",
                    "error": c.error,
                    "bound": c.bound,
                    "used": 0.0 if c.error == 0 else used,
                }
            )
    return {
        "id": test_id,
        "clauses": ["5.6"],
        "outcome": outcome,
        "duration_s": 1.0,
        "reason": "",
        "margins": margins,
        "notes": [],
    }


# ----------------------------------------------------------------------- worst elements


# SPEC 4.5.6
def test_worst_elements_are_ordered_by_share_of_the_allowance_and_indexed_by_shape():
    expected = torch.zeros(2, 3)
    observed = torch.tensor([[0.0, 1e-3, 0.5], [2e-3, 0.0, float("nan")]])
    allowed = torch.tensor([[1.0, 1e-4, 1.0], [1e-3, 1.0, 1.0]])
    worst = numeric.worst_elements("p", expected, observed, allowed)
    assert [o.index for o in worst] == [(1, 2), (0, 1), (1, 0), (0, 2)]  # NaN first, then 10x, 2x, 0.5x
    assert (
        worst[1].expected == 0.0
        and worst[1].observed == pytest.approx(1e-3)
        and worst[1].allowed == pytest.approx(1e-4)
    )
    c = numeric.relative_comparison("v", torch.ones(4), torch.tensor([1.0, 1.5, 1.0, 1.2]), 0.1, label="v")
    assert not c.ok and [o.index for o in c.offenders] == [(1,), (3,)]
    assert c.offenders[0].observed == 1.5 and c.offenders[0].allowed == pytest.approx(0.1)
    b = numeric.bitwise_comparison("b", torch.tensor([0.0, 1.0]), torch.tensor([-0.0, 1.0]))
    assert [(o.index, o.expected, o.observed) for o in b.offenders] == [
        ((0,), 0.0, -0.0)
    ]  # signed zeros differ
    assert numeric.relative_comparison("ok", torch.ones(3), torch.ones(3), 0.1).offenders == []


# SPEC 4.5.6, SPEC 5.6.8
def test_a_failing_pinned_step_names_its_worst_elements():
    comparisons = _pinned_case().compare(_half_percent_high, bitwise=False)
    update = next(c for c in comparisons if c.what == "pinned step: parameter update (fp32)")
    assert not update.ok and update.offenders
    worst = update.offenders[0]
    assert worst.share > 1 and abs(worst.observed - worst.expected) > worst.allowed
    shapes = dict(models.OPTIMIZER.shapes)
    assert len(worst.index) == len(shapes[worst.label])


# ------------------------------------------------------------------------------- files


# SPEC 4.5.6
def test_a_drawn_case_survives_its_file_and_replays_to_the_same_numbers(tmp_path):
    case = _space_case()
    blob, comparisons = _blob(case, False, "test_input_space.py::test_x")
    assert not comparisons.ok
    path = tmp_path / "r.pt"
    path.write_bytes(blob)
    payload = repro_files.load(path)  # weights_only: no code runs when it is read
    assert payload["schema"] == judging.REPRO_SCHEMA and payload["test_id"] == "test_input_space.py::test_x"
    (entry,) = payload["cases"]
    assert "rerun" not in entry and entry["case"]["kind"] == "input-space"
    assert {f["what"] for f in entry["failing"]} == {c.what for c in comparisons if not c.ok}
    again = replayable.from_payload(entry["case"]).comparisons(HALF_PERCENT_HIGH, bitwise=False)
    assert [(c.what, c.error, c.bound) for c in again] == [(c.what, c.error, c.bound) for c in comparisons]
    assert again.problems == comparisons.problems == entry["problems"]


# SPEC 4.5.6
def test_a_deterministic_tests_reproducer_names_the_test_and_its_worst_elements(tmp_path):
    test_id = "test_optimizer.py::test_pinned_block_step[plain-torch.float32-pinned-after-3]"
    blob, comparisons = _blob(_pinned_case(), False, test_id)
    path = tmp_path / "r.pt"
    path.write_bytes(blob)
    (entry,) = repro_files.load(path)["cases"]
    assert entry["rerun"] == test_id and "case" not in entry
    update = next(f for f in entry["failing"] if f["what"] == "pinned step: parameter update (fp32)")
    worst = next(c for c in comparisons if c.what == update["what"]).offenders
    assert update["worst"] and [tuple(w["index"]) for w in update["worst"]] == [o.index for o in worst]
    assert update["worst"][0]["observed"] == worst[0].observed


# SPEC 4.5.6
def test_a_kind_is_one_class_and_an_unknown_kind_is_refused():
    kinds = replayable.kinds()
    assert kinds["input-space"] is InputSpaceCase and kinds["staging"] is staging.StagingCase
    assert isinstance(_space_case(), replayable.ReplayableCase)
    with pytest.raises(ValueError, match="unknown case kind 'pinned-step'"):
        replayable.from_payload({"kind": "pinned-step"})
    with pytest.raises(ValueError, match="already"):
        replayable.replayable("input-space")(type("Other", (), {}))


# SPEC 4.5.6
def test_reproducers_go_beside_their_certificate_and_never_over_other_files(tmp_path):
    blob, _ = _blob(_pinned_case(), False, "t.py::a")
    target = tmp_path / "out" / "cert.partial.json"
    cert = _certificate(
        [_test_entry("t.py::a"), _test_entry("t.py::b"), _test_entry("t.py::c", outcome="passed")]
    )
    directory = target.parent / "cert.partial.repro"
    directory.mkdir(parents=True)
    foreign = directory / repro_files.file_name("t.py::b")
    foreign.write_text("not ours")  # a file of someone else's where t.py::b's reproducer would go
    stale = directory / repro_files.file_name("t.py::gone")
    stale.write_bytes(blob)  # a reproducer of the certificate this one replaces
    unrelated = directory / "notes.pt"
    unrelated.write_text("keep me")
    written = repro_files.write_beside(cert, target, {"t.py::a": blob, "t.py::b": blob, "t.py::nosuch": blob})
    a, b, c = cert["tests"]
    assert written == [directory / repro_files.file_name("t.py::a")]
    assert a["repro"] == f"cert.partial.repro/{repro_files.file_name('t.py::a')}"
    assert (target.parent / a["repro"]).read_bytes() == blob
    assert "repro" not in b and foreign.read_text() == "not ours"
    assert any("t.py::b" in n and "not a reproducer" in n for n in cert["notes"])
    assert "repro" not in c
    assert not stale.exists() and unrelated.read_text() == "keep me"
    # the same run again replaces its own reproducer
    again = _certificate([_test_entry("t.py::a")])
    assert repro_files.write_beside(again, target, {"t.py::a": blob}) == written
    # a run without failures leaves no directory behind
    clean = tmp_path / "clean" / "c.json"
    clean.parent.mkdir()
    assert repro_files.write_beside(_certificate([_test_entry("t.py::a", outcome="passed")]), clean, {}) == []
    assert not (clean.parent / "c.repro").exists()


# SPEC 4.5.6
def test_file_names_are_safe_and_distinct():
    ids = [
        "test_optimizer.py::test_pinned_block_step[plain-torch.float32-pinned-after-3]",
        "test_optimizer.py::test_pinned_block_step[plain-torch.float32-pinned-after-3 ]",
        "a/../../b::c[../x]",
    ]
    names = [repro_files.file_name(i) for i in ids]
    assert len(set(names)) == 3
    assert all("/" not in n and not n.startswith(".") and n.endswith(".pt") for n in names)


# ------------------------------------------------------------------------------ command


def _written(tmp_path: Path, tests: list, blobs: dict) -> Path:
    cert = _certificate(tests)
    path = tmp_path / "cert.json"
    repro_files.write_beside(cert, path, blobs)
    path.write_text(json.dumps(cert))
    return path


# SPEC 4.5.6
def test_repro_of_a_fixed_implementation_passes_and_refusals_are_one_line(tmp_path, capsys):
    blob, comparisons = _blob(_space_case(), True, "t.py::traj")
    path = _written(
        tmp_path, [_test_entry("t.py::traj", comparisons), _test_entry("t.py::other")], {"t.py::traj": blob}
    )
    # the certificate's implementation is the reference: replayed against it, the comparison passes
    assert cli.main(["repro", str(path), "t.py::traj"]) == 0
    out = capsys.readouterr().out
    assert "verdict: passes now" in out and "input-space case: 3 parameters" in out
    assert (
        repro._find_test(json.loads(path.read_text()), "conformance/suite/t.py::traj")["id"] == "t.py::traj"
    )
    for argv, status, needle in [
        (
            ["repro", str(path), "t.py::nosuch"],
            4,
            "holds no test 't.py::nosuch'; tests with a reproducer: t.py::traj",
        ),
        (["repro", str(path), "t.py::other"], 4, "t.py::other has no reproducer"),
        (["repro", str(path), "t.py::traj", "--impl", "no_such_module:X"], 4, "no_such_module"),
        (["repro", str(tmp_path / "missing.json"), "t.py::traj"], 2, "cannot read"),
    ]:
        assert cli.main(argv) == status, argv
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and needle in err, err
    (tmp_path / json.loads(path.read_text())["tests"][0]["repro"]).write_bytes(b"garbage")
    assert cli.main(["repro", str(path), "t.py::traj"]) == 2
    assert "not a reproducer" in capsys.readouterr().err


# SPEC 4.5.6
def test_repro_runs_a_deterministic_test_again_by_its_id(tmp_path, capsys):
    test_id = "test_optimizer.py::test_pinned_block_step[plain-torch.float32-pinned-after-3]"
    blob, comparisons = _blob(_pinned_case(), False, test_id)
    path = _written(tmp_path, [_test_entry(test_id, comparisons)], {test_id: blob})
    # the reference passes the test it runs again (in a pytest process of its own)
    assert cli.main(["repro", str(path), test_id]) == 0
    out = capsys.readouterr().out
    assert "the test run again by its id; profile torch-exact (bitwise)" in out, out
    assert "verdict: passes now" in out and "pinned step (fp32, gradient of step 3" in out
    # a test the suite no longer has is a usage error
    gone = "test_optimizer.py::test_no_such_test"
    blob, _ = _blob(_pinned_case(), False, gone)
    path = _written(tmp_path, [_test_entry(gone, comparisons)], {gone: blob})
    assert cli.main(["repro", str(path), gone]) == 4
    assert "test_no_such_test" in capsys.readouterr().err


# ------------------------------------------------------------------------------- proofs


def _repro(cert_path: Path, test_id: str) -> tuple[subprocess.CompletedProcess, float]:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    )
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "gefen_conformance.cli", "repro", str(cert_path), test_id],
        cwd=cert_path.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    return result, time.monotonic() - started


def _failing_margins(test: dict) -> list:
    return [
        m
        for m in test["margins"]
        if (m["kind"] == "bitwise" and m["differing"])
        or (m["kind"] == "tolerance" and (m["used"] is None or m["used"] > 1))
    ]


@pytest.mark.proof
# SPEC 4.5.6, SPEC 5.6.8, SPEC 5.6.10
@pytest.mark.parametrize(
    "spec,select,test_id",
    [
        pytest.param(
            "tests.optimizer_mutants:tolerant_lr_half_percent_high",
            "test_pinned_block_step and plain and float32 and pinned-after-3",
            "test_optimizer.py::test_pinned_block_step[plain-torch.float32-pinned-after-3]",
            id="pinned-tolerance",
        ),
        pytest.param(
            "tests.optimizer_mutants:mutant_lr_half_percent_high",
            "test_block_step_matches_reference and plain and float32",
            "test_optimizer.py::test_block_step_matches_reference[plain-torch.float32]",
            id="free-running-bitwise",
        ),
    ],
)
def test_repro_reproduces_a_mutants_failure_bit_for_bit(spec, select, test_id, tmp_path):
    cert = run_suite(spec, select, tmp_path)
    (failed,) = failed_tests(cert)
    assert failed["id"] == test_id, failed["id"]
    assert failed["repro"].startswith("certificate.repro/"), failed
    assert (tmp_path / failed["repro"]).is_file()
    result, elapsed = _repro(tmp_path / "certificate.json", failed["id"])
    print(f"repro of {spec} {test_id}: {elapsed:.2f} s wall (interpreter start included)")
    out = result.stdout
    assert result.returncode == 1, out[-3000:] + result.stderr[-3000:]
    assert "verdict: reproduced bit for bit" in out, out[-3000:]
    failing = _failing_margins(failed)
    assert failing
    for m in failing:
        line = next((ln for ln in out.splitlines() if ln.startswith(f"FAILED {m['what']}: ")), None)
        assert line is not None, f"{m['what']} not reported:\n{out[-3000:]}"
        if m["kind"] == "bitwise":
            assert f"{m['differing']} of {m['total']} elements differ" in line, line
        else:
            assert f"error {m['error']!r}, bound {m['bound']!r}" in line, line
        assert line.endswith("(the same in the certificate)"), line
    first_problem = failed["reason"].removeprefix("AssertionError: ").split(" | ")[0].removesuffix("...")
    assert f"  {first_problem}" in out
    assert "worst elements" in out and "expected" in out and "observed" in out and "allowed" in out


#: One failure of each other kind the suite replays (SPEC 4.5.6): the mutant, its selection, the
#: failing test and the start of its input in words. How long a replay takes is measured by
#: benchmarks/repro_time.py, never asserted here.
OTHER_KINDS = [
    pytest.param(
        "tests.mutants:tolerant_factored_mean_unclamped",
        "inputs_match_reference",
        "test_input_space.py::test_inputs_match_reference",
        "input-space case: ",
        id="input-space",
    ),
    pytest.param(
        "tests.mutants:mutant_list_tail_dropped",
        "lifecycle_matches_reference",
        "test_input_space.py::test_lifecycle_matches_reference",
        "input-space case: 1",  # one of the lifecycle's counts over 128
        id="lifecycle",
    ),
    pytest.param(
        "tests.mutants:mutant_lr_truncated_into_int",
        "staging_regression and into-int64",
        "test_hyper_staging.py::test_staging_regression[lr-into-int64]",
        "staging case: ",
        id="staging",
    ),
    pytest.param(
        "tests.mutants:mutant_fresh_buffer_per_load",
        "reshard_restores and not many and not empty",
        "test_dcp_reshard.py::test_reshard_restores_model_and_continues_within_bound[1->2]",
        "model 'base' trained and saved by ",
        id="restore",
    ),
    pytest.param(
        "tests.mutants:mutant_bf16_restore_rounding",
        "restore_into_a_stepped",
        "test_dcp_continuation.py::test_restore_into_a_stepped_optimizer[bf16-2->1]",
        "model 'wide' in bf16 saved by the reference on 2 ranks",
        id="continuation",
    ),
    pytest.param(
        "tests.mutants:mutant_dense_momentum_rounding",
        "goldens",
        "test_goldens.py::test_saves_match_the_goldens",
        "the 3 cases of the golden catalogue",
        id="golden",
    ),
]


@pytest.mark.proof
# SPEC 4.5.6
@pytest.mark.parametrize("spec,select,test_id,described", OTHER_KINDS)
def test_repro_replays_every_kind_of_failure(spec, select, test_id, described, tmp_path):
    cert = run_suite(spec, select, tmp_path)
    failed = next(t for t in failed_tests(cert) if t["id"] == test_id)
    assert failed.get("repro") and failed.get("input", "").startswith(described), failed
    result, elapsed = _repro(tmp_path / "certificate.json", failed["id"])
    out = result.stdout
    assert result.returncode == 1, out[-3000:] + result.stderr[-3000:]
    assert "verdict: reproduced bit for bit" in out, out[-3000:]
    assert f"case 1 of 1: {failed['input']}" in out
    print(f"repro of {spec} {test_id}: {elapsed:.2f} s wall (interpreter start included)")
