"""Where a rank failed or hung, as the certificate's ``where`` records it (SPEC 4.4.8, 4.4.12).

The parser is checked on the two texts a rank's traceback can be (a Python traceback, a
``faulthandler`` dump), then on real ranks of the pool: one raises, the other hangs and is dumped.
"""

from __future__ import annotations

import json
import os
import threading

import pytest

from gefen_conformance.harness.pool import RankFailure, RankOutcome, run_on_ranks
from gefen_conformance.plugin import rank_locations

SUITE = "/opt/venv/lib/python3.11/site-packages/gefen_conformance/suite/test_dcp_reshard.py"
TORCH = "/opt/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"
HARNESS = "/opt/venv/lib/python3.11/site-packages/gefen_conformance/harness/pool/worker.py"
KERNEL = "/home/me/fast/src/gefen_fast/kernels.py"

RAISED = f'''Traceback (most recent call last):
  File "{HARNESS}", line 250, in _run_call
    value = fn(*args)
  File "{SUITE}", line 120, in _restore_body
    state.load_state_dict(saved)
  File "{KERNEL}", line 77, in load_state_dict
    raise KeyError(name)
KeyError: 'enc.weight'

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "{HARNESS}", line 252, in _run_call
    raise RuntimeError("wrapped")
  File "{SUITE}", line 131, in _check_restored
    torch.distributed.barrier()
  File "{TORCH}", line 4500, in barrier
    work.wait()
RuntimeError: wrapped
'''

HUNG = f'''rank 2 (pid 4242) did not finish within the 60 s deadline; stacks dumped, process killed
Thread 0x00007f0000000001 (most recent call first):
  File "/usr/lib/python3.11/threading.py", line 324 in wait
  File "{HARNESS}", line 95 in _watch_parent
  File "/usr/lib/python3.11/threading.py", line 975 in run

Current thread 0x00007f0000000002 (most recent call first):
  File "{TORCH}", line 4500 in barrier
  File "{SUITE}", line 88 in _save_body
  File "{HARNESS}", line 250 in _run_call
'''


def test_a_python_traceback_gives_the_innermost_frame_of_the_code_under_test_of_the_last_exception():
    assert rank_locations.location(RAISED) == (
        "gefen_conformance/suite/test_dcp_reshard.py:131 in _check_restored "
        "(innermost: torch/distributed/distributed_c10d.py:4500 in barrier)"
    )


def test_an_implementations_own_frame_is_code_under_test():
    text = RAISED.split("During handling")[0]
    assert rank_locations.location(text) == "/home/me/fast/src/gefen_fast/kernels.py:77 in load_state_dict"


def test_a_stack_dump_gives_the_thread_running_the_scenario_and_what_it_waited_in():
    assert rank_locations.location(HUNG) == (
        "gefen_conformance/suite/test_dcp_reshard.py:88 in _save_body "
        "(innermost: torch/distributed/distributed_c10d.py:4500 in barrier)"
    )


def test_without_frames_of_the_code_under_test_the_innermost_frame_is_given():
    text = (
        f'Traceback (most recent call last):\n  File "{HARNESS}", line 9, in _prepare\n    x()\nOSError: no\n'
    )
    assert rank_locations.location(text) == "gefen_conformance/harness/pool/worker.py:9 in _prepare"
    assert (
        rank_locations.location(
            "rank 1 (pid 3) ended without reporting a result: SIGKILL\n(no Python stack was dumped)"
        )
        is None
    )


def test_where_lists_every_failed_rank_in_rank_order_and_finds_a_wrapped_rank_failure():
    failure = RankFailure(
        [
            RankOutcome(0, "ok"),
            RankOutcome(1, "hung", traceback=HUNG),
            RankOutcome(2, "raised", exc_type="RuntimeError", traceback=RAISED),
            RankOutcome(3, "died", traceback="rank 3 died: SIGSEGV\n(no Python stack was dumped)"),
        ]
    )
    lines = rank_locations.where(failure)
    assert lines == [
        "rank 1: gefen_conformance/suite/test_dcp_reshard.py:88 in _save_body "
        "(innermost: torch/distributed/distributed_c10d.py:4500 in barrier)",
        "rank 2: gefen_conformance/suite/test_dcp_reshard.py:131 in _check_restored "
        "(innermost: torch/distributed/distributed_c10d.py:4500 in barrier)",
    ]
    try:
        try:
            raise failure
        except RankFailure as error:
            raise AssertionError("the restore failed") from error
    except AssertionError as wrapped:
        assert rank_locations.where(wrapped) == lines
    assert rank_locations.where(ValueError("no ranks")) == [] and rank_locations.where(None) == []


# --- real ranks ----------------------------------------------------------------------------------


def _rank_1_raises_rank_0_waits():
    import torch.distributed as dist

    if dist.get_rank() == 1:
        _raise_in_scenario()
    _wait_in_scenario()


def _raise_in_scenario():
    raise ValueError("slot 3 has the wrong shape")


def _wait_in_scenario():
    threading.Event().wait(600)


def test_real_ranks_a_raising_one_and_a_hung_one_are_located_in_the_scenarios_code():
    with pytest.raises(RankFailure) as caught:
        run_on_ranks(_rank_1_raises_rank_0_waits, 2, timeout=60, failure_grace=0.5)
    failure = caught.value
    lines = rank_locations.where(failure)
    assert [o.status for o in failure.outcomes] == ["hung", "raised"], str(failure)
    assert (
        lines[0].startswith("rank 0: tests/test_rank_locations.py:")
        and "in _wait_in_scenario (innermost: " in lines[0]
    )
    assert "threading.py:" in lines[0] and lines[0].endswith(" in wait)")
    assert lines[1].startswith("rank 1: tests/test_rank_locations.py:") and lines[1].endswith(
        " in _raise_in_scenario"
    )
    assert len(lines) == 2


BROKEN_ADAPTER = """
import dataclasses

from gefen_conformance.implementations.reference import IMPLEMENTATION as REFERENCE


def _refuse_to_save(optimizer):
    raise RuntimeError("this adapter cannot save")


IMPLEMENTATION = dataclasses.replace(REFERENCE, name="broken-adapter", dcp_state=_refuse_to_save)
"""


# a whole suite run in a subprocess: .ci/run runs it (the default run stays under 5 minutes)
@pytest.mark.slow
def test_a_suite_run_records_where_each_failed_rank_was(pytester, monkeypatch):
    """An adapter that raises on every rank of a DCP save: the certificate's test has a ``where``
    line per rank naming the adapter's line, and the terminal summary prints them under the test."""
    pytester.makepyfile(broken_adapter=BROKEN_ADAPTER)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(pytester.path), os.environ.get("PYTHONPATH")]))
    )
    cert_path = pytester.path / "c.json"
    result = pytester.runpytest_subprocess(
        "--impl=broken_adapter:IMPLEMENTATION",
        f"--certificate={cert_path}",
        "-p",
        "no:cacheprovider",
        "-q",
        "-k",
        "test_checkpoint_schema_from_the_files and w2",
    )
    out = result.stdout.str()
    assert result.ret == 1, out[-3000:]
    cert = json.loads(cert_path.read_text())
    (test,) = [t for t in cert["tests"] if t["outcome"] in ("failed", "error")]
    line = BROKEN_ADAPTER.strip().splitlines().index('    raise RuntimeError("this adapter cannot save")') + 1
    assert test["where"] == [f"rank {r}: broken_adapter.py:{line} in _refuse_to_save" for r in range(2)], test
    for line in test["where"]:
        assert f"      {line}" in out.splitlines()  # under the test in the terminal summary
