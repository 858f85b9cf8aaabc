"""``certify --launcher torchrun`` and :mod:`gefen_conformance.harness.torchrun` (SPEC 4.7).

The command line and the launcher's description are checked in-process; the launcher itself runs
real torchrun jobs of 3 CPU ranks on the scenario calls of ``tests/torchrun_probe.py``: every
size on the job's first ranks, a raising and a dying rank (reported as the pool reports them,
peers released at once); slow: a hung rank (stacks dumped, the job ends, nothing left running)
and Ctrl-C (every rank ends). The whole suite under torchrun is certified by ``.ci/run``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from gefen_conformance.cli import certify
from gefen_conformance.cli.usage import UsageError
from gefen_conformance.harness import launch, torchrun
from gefen_conformance.harness.torchrun import entry as torchrun_entry
from gefen_conformance.harness.torchrun import job as torchrun_job
from gefen_conformance.harness.torchrun import launcher as torchrun_launcher

REPO = Path(__file__).resolve().parents[1]
PROBE = "tests/torchrun_probe.py"
RANKS = 3

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="torchrun jobs are run on Linux")


def _args(**given) -> argparse.Namespace:
    base = dict(
        impl="reference",
        certificate=None,
        device=None,
        launcher="torchrun",
        nproc_per_node=None,
        nnodes=None,
        rdzv_endpoint=None,
        node_rank=None,
        checkpoint_dir=None,
    )
    return argparse.Namespace(**dict(base, **given))


# ------------------------------------------------------------------------------ command line


def test_one_node_is_a_standalone_job_of_four_ranks_by_default():
    command = certify.torchrun_command(_args(), ["-q"], "/r.json")
    assert command[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert command[command.index("--nproc-per-node") + 1] == "4" and "--standalone" in command
    assert command[command.index("-m", 3) + 1] == "gefen_conformance.harness.torchrun"
    assert command[command.index("--result-file") + 1] == "/r.json"
    # torchrun's own parser swallows `--`: pytest's arguments follow a separator of our own
    assert command[-2:] == [torchrun.PYTEST_ARGS, "-q"] and "--" not in command


def test_multi_node_options_reach_torchrun_and_paths_become_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    command = certify.torchrun_command(
        _args(
            nproc_per_node=8,
            nnodes=2,
            rdzv_endpoint="node0:29400",
            node_rank=1,
            checkpoint_dir="shared",
            certificate="c.json",
            device="cuda",
        ),
        [],
        "/r",
    )
    assert "--standalone" not in command
    pairs = dict(zip(command, command[1:]))
    assert (
        pairs["--nnodes"] == "2" and pairs["--rdzv-endpoint"] == "node0:29400" and pairs["--node-rank"] == "1"
    )
    assert pairs["--rdzv-backend"] == "c10d" and pairs["--nproc-per-node"] == "8"
    assert pairs["--checkpoint-dir"] == str(tmp_path / "shared") and pairs["--certificate"] == str(
        tmp_path / "c.json"
    )
    assert pairs["--device"] == "cuda"


@pytest.mark.parametrize(
    "given,problem",
    [
        (dict(nnodes=2, checkpoint_dir="/shared"), "needs --rdzv-endpoint"),
        (dict(nnodes=2, rdzv_endpoint="h:1"), "needs --checkpoint-dir"),
        (dict(nproc_per_node=0), "--nproc-per-node must be at least 1"),
        (dict(rdzv_endpoint="nohost"), "give HOST:PORT"),
    ],
)
def test_options_that_do_not_fit_together_are_usage_errors(given, problem):
    with pytest.raises(UsageError, match=problem):
        certify.torchrun_command(_args(**given), [], "/r")


def _cli(cwd: Path, *args: str, **popen) -> subprocess.CompletedProcess:
    env = dict(
        os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    )
    env.update(popen.pop("env", {}))
    return subprocess.run(
        [sys.executable, "-m", "gefen_conformance.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        **popen,
    )


def test_torchrun_options_without_the_torchrun_launcher_are_one_line_usage_errors(tmp_path):
    result = _cli(tmp_path, "certify", "--nproc-per-node", "2", "--checkpoint-dir", "x")
    assert result.returncode == 4
    assert result.stderr.strip().splitlines() == [
        "gefen-conformance certify: --nproc-per-node, --checkpoint-dir only apply with --launcher torchrun"
    ]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_a_device_this_machine_lacks_is_a_usage_error_before_torchrun_starts(tmp_path):
    result = _cli(tmp_path, "certify", "--launcher", "torchrun", "--device", "cuda")
    assert result.returncode == 4
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "--device cuda" in lines[0] and "no cuda device" in lines[0]


def test_the_rank_entry_point_refuses_to_run_outside_torchrun(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(RuntimeError, match="must be started by torchrun: RANK, WORLD_SIZE"):
        torchrun_job.Job()


def test_rank_zero_runs_pytest_without_xdist_and_with_temp_dirs_in_the_run_directory():
    args = torchrun.pytest_arguments("fast", "/c.json", None, "/shared/run", ["-q"])
    assert args[0] == "--impl=fast" and "no:xdist" in args and "--basetemp=/shared/run/pytest" in args
    assert "--certificate=/c.json" in args and args[-1] == "-q"
    assert not any("device" in a for a in args)  # only forwarded when given
    assert "--gefen-device=cuda" in torchrun.pytest_arguments("fast", None, "cuda", "/r", [])


def test_the_launcher_describes_the_job_for_the_certificate():
    job = argparse.Namespace(world_size=4)
    hellos = {r: {"node_rank": r // 2, "device_name": f"cuda:{r % 2}", "pid": 100 + r} for r in range(4)}
    launcher = torchrun_launcher.TorchrunLauncher(job, None, None, torch.device("cuda"), "nccl", hellos)
    assert launcher.execution() == launch.Execution(
        "torchrun", 2, 4, 4, "nccl", "cuda", ("node0/cuda:0", "node0/cuda:1", "node1/cuda:0", "node1/cuda:1")
    )
    with launch.using(launcher):
        assert launch.unfit_reason(4) is None
        assert "needs 5 ranks; the torchrun launcher runs at most 4" in launch.unfit_reason(5)


class _DictStore:
    """The part of a TCPStore that the start-up check uses, in memory."""

    def __init__(self):
        self.values = {}

    def add(self, key, amount):
        self.values[key] = int(self.values.get(key, 0)) + amount
        return self.values[key]

    def set(self, key, value):
        self.values[key] = value

    def check(self, keys):
        return all(k in self.values for k in keys)


def _job(rank, world_size):
    return argparse.Namespace(rank=rank, world_size=world_size)


def test_a_checkpoint_directory_that_a_rank_does_not_see_is_named_before_any_scenario(tmp_path):
    store = _DictStore()
    store.add("markers", 1)  # rank 1 wrote its marker: somewhere rank 0 does not see
    problem = torchrun_entry._check_run_dir(_job(0, 2), store, str(tmp_path))
    assert (tmp_path / ".rank-0").exists()
    assert "rank 0 on " in problem and "does not see the markers of rank(s) 1" in problem
    assert "--checkpoint-dir must be one filesystem shared by every node" in problem


def test_every_rank_seeing_every_marker_passes_the_check(tmp_path):
    store = _DictStore()
    for rank in (1, 2):
        (tmp_path / f".rank-{rank}").write_text("elsewhere")
        store.add("markers", 1)
    assert torchrun_entry._check_run_dir(_job(0, 3), store, str(tmp_path)) is None


def test_a_checkpoint_directory_a_rank_cannot_write_is_named(tmp_path):
    problem = torchrun_entry._check_run_dir(_job(3, 4), _DictStore(), str(tmp_path / "absent"))
    assert problem.startswith("rank 3 on ") and "cannot write in" in problem


# ----------------------------------------------------------------------------- torchrun jobs


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _left_running(pids, within: float = 10.0) -> list[int]:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        alive = [p for p in pids if _alive(p)]
        if not alive:
            return []
        time.sleep(0.2)
    return alive


def _probe(tmp_path: Path, *select: str, options=()) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "facts"
    out.mkdir()
    result = _cli(
        REPO,
        "certify",
        "--launcher",
        "torchrun",
        "--nproc-per-node",
        str(RANKS),
        "--out",
        str(tmp_path / "c.json"),
        *options,
        "--",
        PROBE,
        "-q",
        "-p",
        "no:randomly",
        *select,
        env={"GEFEN_TORCHRUN_PROBE_OUT": str(out)},
    )
    facts = {p.stem: json.loads(p.read_text()) for p in out.glob("*.json")}
    return result, facts


# a whole torchrun job of four ranks (the longest test of the default run): the default run covers its
# parts with tests/test_scenarios_in_one_world.py (scenarios on the first ranks of a larger world, the
# suite's own bodies and checks) and tests/test_ranks.py (a raising or dying rank reported at once,
# nothing left running); .ci/run runs this and certifies the reference under torchrun
@pytest.mark.slow
def test_scenario_calls_run_on_the_first_ranks_and_failures_are_reported_as_by_the_pool(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    result, facts = _probe(
        tmp_path, "-k", "not hung and not hang and not interrupt", options=("--checkpoint-dir", str(shared))
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "5 passed" in result.stdout
    assert facts["sizes"]["execution"] == {
        "launcher": "torchrun",
        "nodes": 1,
        "world_size": RANKS,
        "max_world_size": RANKS,
        "backend": "gloo",
        "device_type": "cpu",
        "device_names": ["cpu"],
    }
    # a raising or dying rank closes its sockets: its peer fails at once, not at the gloo timeout
    assert facts["raised"]["elapsed"] < 10 and facts["died"]["elapsed"] < 10
    assert _left_running(facts["sizes"]["pids"]) == []
    assert list(shared.iterdir()) == []  # the run directory (markers, test temp dirs) is removed


@pytest.mark.slow
def test_a_checkpoint_directory_that_cannot_be_made_is_a_usage_error_before_any_test(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    result, facts = _probe(tmp_path, options=("--checkpoint-dir", str(blocker)))
    assert result.returncode == 4, result.stdout[-3000:] + result.stderr[-3000:]
    assert f"--checkpoint-dir {blocker}: cannot make the run directory there" in result.stderr
    assert facts == {}


@pytest.mark.slow
def test_a_hung_rank_is_dumped_and_the_job_ends_with_nothing_left_running(tmp_path):
    result, facts = _probe(tmp_path, "-k", "every_size or hung or after_a_hang")
    assert result.returncode == 1, result.stdout[-3000:] + result.stderr[-3000:]
    hung = facts["hung"]
    assert hung["statuses"] == ["ok", "hung"]
    assert "did not finish within the 4 s deadline" in hung["message"]
    assert "in hang_on" in hung["traceback"]  # the stuck thread's stack, dumped by faulthandler
    assert "after-hang" not in facts  # pytest stopped after the hang
    assert "the torchrun job ended: rank(s) 1 hung" in result.stdout
    assert _left_running(facts["sizes"]["pids"]) == []


@pytest.mark.slow
def test_ctrl_c_ends_every_rank(tmp_path):
    out = tmp_path / "facts"
    out.mkdir()
    env = dict(
        os.environ,
        GEFEN_TORCHRUN_PROBE_OUT=str(out),
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    )
    command = [
        sys.executable,
        "-m",
        "gefen_conformance.cli",
        "certify",
        "--launcher",
        "torchrun",
        "--nproc-per-node",
        str(RANKS),
        "--out",
        str(tmp_path / "c.json"),
        "--",
        PROBE,
        "-q",
        "-k",
        "interrupt",
    ]
    # a session of its own, so that the SIGINT below reaches it as a terminal's Ctrl-C would
    child = subprocess.Popen(
        command,
        cwd=REPO,
        env=env,
        start_new_session=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not (out / "ready.json").exists():
            assert child.poll() is None and time.monotonic() < deadline, child.stdout.read()[-3000:]
            time.sleep(0.2)
        time.sleep(1.0)
        pids = json.loads((out / "ready.json").read_text())["pids"]
        os.killpg(child.pid, signal.SIGINT)
        output, _ = child.communicate(timeout=90)
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
            child.wait()
    assert child.returncode == 2, output[-3000:]
    assert _left_running(pids) == [], output[-3000:]
