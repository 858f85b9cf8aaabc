"""``--gefen-device`` (SPEC 4.6): the device vocabulary, the profile a device forces, the pool on the
selected device, what the certificate records, and the usage errors.

This machine has no accelerator: the CUDA paths are exercised only as far as their logic goes,
with ``devices.available`` pretending to count devices (never allocating on one).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from gefen_conformance.certificate import build as certificate
from gefen_conformance.certificate import numeric_profile
from gefen_conformance.harness import devices, launch, world
from gefen_conformance.harness import pool as ranks
from gefen_conformance.implementations.contract import CPU_BIT_EXACT
from gefen_conformance.plugin import markers
from gefen_conformance.workload import models

REPO = Path(__file__).resolve().parents[1]
needs_pool = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()) or not sys.platform.startswith("linux"),
    reason="the rank harness needs torch.distributed with gloo, on Linux",
)


@pytest.fixture
def run_device():
    """Restores the run's device after a test that selects another."""
    previous = devices.select(devices.selected())
    yield
    devices.select(previous)


@pytest.fixture
def two_fake_gpus(monkeypatch, run_device):
    """Pretend this machine has two CUDA devices (counting only: nothing is allocated on them)."""
    real = devices.available
    monkeypatch.setattr(devices, "available", lambda kind: 2 if kind == "cuda" else real(kind))
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "Fake GPU", raising=False)
    devices.select(torch.device("cuda"))


def _world_device():
    return str(world.current().device)


# ------------------------------------------------------------------------- the vocabulary


def test_parse_accepts_cpu_and_names_what_it_refuses():
    assert devices.parse("cpu") == torch.device("cpu")
    assert devices.parse(" cpu ") == torch.device("cpu")
    for name, words in [
        ("nonsense", ["'nonsense' is not a torch device"]),
        ("", ["'': give a torch device"]),
        ("cuda:-1", ["cuda:-1"]),
    ]:
        with pytest.raises(devices.DeviceUnavailable) as info:
            devices.parse(name)
        assert all(w in str(info.value) for w in words), str(info.value)
        assert "\n" not in str(info.value)
    if devices.available("cuda") == 0:
        with pytest.raises(devices.DeviceUnavailable, match=r"^cuda: no cuda device is available"):
            devices.parse("cuda")
        with pytest.raises(devices.DeviceUnavailable, match=r"^cuda:1: no cuda device"):
            devices.parse("cuda:1")


def test_parse_refuses_an_index_beyond_the_machine(monkeypatch):
    monkeypatch.setattr(devices, "available", lambda kind: 2)
    with pytest.raises(
        devices.DeviceUnavailable, match=r"^cuda:2: this machine has 2 cuda device\(s\) \(indices 0-1\)"
    ):
        devices.parse("cuda:2")


def test_one_device_per_rank_and_the_backend_for_it():
    cpu, cuda, cuda1 = torch.device("cpu"), torch.device("cuda"), torch.device("cuda:1")
    assert [devices.for_rank(cpu, r) for r in range(3)] == [cpu] * 3
    assert [str(devices.for_rank(cuda, r)) for r in range(3)] == ["cuda:0", "cuda:1", "cuda:2"]
    assert [str(devices.for_rank(cuda1, r)) for r in range(2)] == ["cuda:1", "cuda:2"]
    assert devices.backend_for(cpu) == "gloo" and devices.backend_for(cuda1) == "nccl"
    assert devices.backend_for(torch.device("xpu")) == "gloo"


def test_shortage_counts_the_devices_from_the_chosen_index(monkeypatch):
    assert devices.shortage(torch.device("cpu"), 64) is None
    monkeypatch.setattr(devices, "available", lambda kind: 2)
    assert devices.shortage(torch.device("cuda"), 2) is None
    reason = devices.shortage(torch.device("cuda"), 4)
    assert reason == "needs 4 cuda devices on a node (one per rank) from cuda; this machine has 2"
    assert "this machine has 1" in devices.shortage(torch.device("cuda:1"), 2)


def test_device_names_list_each_rank_device(two_fake_gpus):
    assert devices.names(torch.device("cpu")) == ("cpu",)
    assert devices.names(torch.device("cuda")) == ("cuda:0 Fake GPU", "cuda:1 Fake GPU")
    assert devices.names(torch.device("cuda:1")) == ("cuda:1 Fake GPU",)
    assert devices.names(torch.device("cuda"), 1) == ("cuda:0 Fake GPU",)


# ------------------------------------------------------------------------------ profiles


def test_a_non_cpu_device_is_always_judged_by_tolerance():
    exact = SimpleNamespace(capabilities={CPU_BIT_EXACT})
    loose = SimpleNamespace(capabilities=set())
    cpu, cuda = torch.device("cpu"), torch.device("cuda:0")
    assert numeric_profile.choose(exact.capabilities, cpu) == numeric_profile.NumericProfile(
        numeric_profile.Profile.TORCH_EXACT, "cpu-bit-exact declared"
    )
    assert numeric_profile.choose(exact.capabilities, cpu).bitwise
    assert numeric_profile.choose(loose.capabilities, cpu) == numeric_profile.NumericProfile(
        numeric_profile.Profile.TOLERANCE, "cpu-bit-exact not declared"
    )
    chosen = numeric_profile.choose(exact.capabilities, cuda)
    name, reason = chosen.name, chosen.reason
    assert not chosen.bitwise
    assert name == "tolerance" and "device cuda:0" in reason and "cpu-bit-exact declared" in reason
    assert "CPU arithmetic only" in reason
    assert numeric_profile.bitwise(exact, cpu) and not numeric_profile.bitwise(exact, cuda)
    assert not numeric_profile.bitwise(loose, cpu)


def test_the_certificate_profile_follows_the_run_device(run_device):
    assert certificate.profile_facts({CPU_BIT_EXACT})["name"] == "torch-exact"
    devices.select(torch.device("cuda"))
    facts = certificate.profile_facts({CPU_BIT_EXACT})
    assert facts["name"] == "tolerance" and facts["reason"].startswith("device cuda: a non-CPU device")
    assert facts["free_running"] and "comparison" not in facts  # the tolerance profile's bounds, not bitwise
    assert certificate.profile_facts({CPU_BIT_EXACT}, device="cpu")["name"] == "torch-exact"


def test_bitwise_only_tests_are_skipped_off_cpu_with_the_reason(run_device):
    def item(*required):
        return SimpleNamespace(iter_markers=lambda name: [SimpleNamespace(args=required)] if required else [])

    assert markers.off_device(item(CPU_BIT_EXACT)) is None  # on CPU it runs
    devices.select(torch.device("cuda:1"))
    reason = markers.off_device(item("dcp-reshard", CPU_BIT_EXACT))
    assert reason == "cpu-bit-exact is judged on CPU only; device cuda:1 is judged by tolerance (SPEC 4.6.4)"
    assert markers.off_device(item("dcp-reshard")) is None


# -------------------------------------------------------------- where tensors live


def test_outside_a_scenario_the_implementation_lives_on_the_run_device(run_device):
    assert models.device_for(lambda *a, **k: None) == torch.device("cpu")
    devices.select(torch.device("meta"))  # any device type: nothing is allocated here
    assert world.bound() is None
    assert models.device_for(lambda *a, **k: None) == torch.device("meta")
    assert models.device_for(models.REFERENCE) == torch.device("cpu")  # the oracle never moves


def test_state_to_cpu_copies_every_tensor_and_keeps_the_rest():
    live = torch.ones(3)
    tags = {"a"}  # a mutable leaf that is neither a tensor nor a container it rebuilds
    state = {
        "state": {0: {"m": live, "step": 3, "pair": (live, "x"), "tags": tags}},
        "groups": [{"lr": torch.tensor(1.0)}],
    }
    copied = models.state_to_cpu(state)
    tags.add("b")
    assert copied["state"][0]["tags"] == {"a"}  # a deep copy, cheaper than copy.deepcopy
    assert copied["state"][0]["step"] == 3 and copied["state"][0]["pair"][1] == "x"
    assert torch.equal(copied["state"][0]["m"], live) and copied["state"][0]["m"] is not live
    live.add_(1)
    assert copied["state"][0]["m"].tolist() == [1.0, 1.0, 1.0]  # a copy, not a view
    assert copied["groups"][0]["lr"].device.type == "cpu"


# --------------------------------------------------------------------- the pool


def test_the_pool_describes_the_run_device(two_fake_gpus):
    assert launch.execution().as_dict() == {
        "launcher": "pool",
        "nodes": 1,
        "world_size": None,
        "max_world_size": None,
        "backend": "nccl",
        "device_type": "cuda",
        "device_names": ["cuda:0 Fake GPU", "cuda:1 Fake GPU"],
    }


def test_a_scenario_with_more_ranks_than_devices_is_unfit_before_any_rank_starts(two_fake_gpus):
    assert launch.unfit_reason(2) is None
    reason = launch.unfit_reason(3)
    assert reason == "needs 3 cuda devices on a node (one per rank) from cuda; this machine has 2"
    with pytest.raises(launch.WorldTooLarge, match="needs 3 cuda devices"):
        launch.run(_world_device, 3)
    with pytest.raises(ValueError, match=r"run_on_ranks\(3 ranks on cuda\): needs 3 cuda devices"):
        ranks.run_on_ranks(_world_device, 3)


@needs_pool
def test_pool_ranks_run_on_cpu_by_default_and_sizes_run_are_drained(run_device):
    launch.drain_world_sizes()
    assert launch.run(_world_device, 2, timeout=60) == ["cpu", "cpu"]
    assert launch.run(_world_device, 1, timeout=60) == ["cpu"]
    assert ranks.run_on_ranks(_world_device, 1, device="cpu", timeout=60) == ["cpu"]  # not through launch
    assert launch.drain_world_sizes() == [1, 2]
    assert launch.drain_world_sizes() == []


def test_execution_facts_are_the_launcher_description_plus_the_sizes_run(two_fake_gpus):
    facts = certificate.execution_facts([4, 2, 2])
    assert facts == {
        **launch.execution().as_dict(),
        "world_sizes": [2, 4],
        "warm_up_s": None,
        "deadline_scale": 1.0,
        "tier": "default",
    }
    assert facts["backend"] == "nccl" and facts["device_type"] == "cuda"


# ------------------------------------------------------------------ the command line


@pytest.fixture
def child_env(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])))


CUDA = ("cuda", ["--gefen-device cuda: no cuda device is available"])
NONSENSE = ("nonsense", ["--gefen-device 'nonsense' is not a torch device"])
IMPL, PYARGS = ["--impl=reference"], ["--pyargs", "gefen_conformance"]


# each refusal and each way of naming the suite once in the default run; .ci/run runs the other two
@pytest.mark.parametrize(
    "name,words,how",
    [
        pytest.param(*CUDA, IMPL, id="impl-cuda"),
        pytest.param(*NONSENSE, PYARGS, id="pyargs-nonsense"),
        pytest.param(*NONSENSE, IMPL, id="impl-nonsense", marks=pytest.mark.slow),
        pytest.param(*CUDA, PYARGS, id="pyargs-cuda", marks=pytest.mark.slow),
    ],
)
def test_an_unusable_device_is_one_line_exit_4_writing_nothing(pytester, child_env, name, words, how):
    if name == "cuda" and devices.available("cuda"):
        pytest.skip("this machine has CUDA")
    result = pytester.runpytest_subprocess(*how, f"--gefen-device={name}", "-p", "no:cacheprovider")
    err = result.stderr.str()
    assert result.ret == pytest.ExitCode.USAGE_ERROR, result.stdout.str() + err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("ERROR: ") and all(w in lines[0] for w in words), err
    assert "collected" not in result.stdout.str()
    assert not [p.name for p in pytester.path.iterdir() if p.name.startswith("gefen-certificate")]


# a whole suite run in a subprocess: .ci/run runs it (the default run stays under 5 minutes)
@pytest.mark.slow
@needs_pool
def test_device_cpu_certificate_records_the_execution_and_the_sizes_run(pytester, child_env):
    cert_path = pytester.path / "cert.json"
    result = pytester.runpytest_subprocess(
        "--impl=reference",
        "--gefen-device=cpu",
        f"--certificate={cert_path}",
        "-p",
        "no:cacheprovider",
        "-q",
        "-k",
        "test_async_save_with_the_default_writer_is_refused_before_writing or test_global_step",
    )
    assert result.ret == 6, result.stdout.str() + result.stderr.str()  # partial (SPEC 4.4.9)
    cert = json.loads(cert_path.read_text())
    assert cert["summary"]["passed"] == 2 and cert["verdict"] == "partial"
    warm_up = cert["execution"].pop("warm_up_s")
    assert cert["execution"] == {
        "launcher": "pool",
        "nodes": 1,
        "world_size": None,
        "max_world_size": None,
        "backend": "gloo",
        "device_type": "cpu",
        "device_names": ["cpu"],
        "world_sizes": [2],
        "deadline_scale": 1.0,
        "tier": "default",
    }
    assert warm_up > 0
    assert cert["profile"]["name"] == "torch-exact"


def test_a_project_with_its_own_device_option_still_starts(pytester, child_env):
    """The plugin loads in every pytest session of its environment: its option must not collide
    with the ``--device`` many projects define for themselves."""
    pytester.makeconftest("def pytest_addoption(parser):\n    parser.addoption('--device', default='cpu')\n")
    pytester.makepyfile("def test_own(request):\n    assert request.config.getoption('--device') == 'meta'\n")
    result = pytester.runpytest_subprocess("--device=meta", "-p", "no:cacheprovider")
    assert result.ret == 0, result.stdout.str() + result.stderr.str()
    result.assert_outcomes(passed=1)


def test_the_report_shows_the_backend_and_world_sizes():
    from gefen_conformance.certificate import report_model

    cert = {
        "implementation": {"name": "x", "version": "1"},
        "summary": {},
        "verdict": "conformant",
        "execution": {
            "launcher": "pool",
            "nodes": 1,
            "world_size": None,
            "backend": "nccl",
            "device_type": "cuda",
            "device_names": ["cuda:0 H200"],
            "world_sizes": [1, 2],
        },
    }
    rows = dict(report_model.facts(cert))
    assert rows["execution"] == "cuda (cuda:0 H200), nccl, world sizes 1, 2, 1 node(s), pool launcher"
    old = dict(cert, execution={"distributed_backend": "gloo", "device_type": "cpu", "world_sizes": [4]})
    assert dict(report_model.facts(old))["execution"] == "cpu, gloo, world sizes 4"
