"""Where the kernels run, and the error that names the fix where they cannot."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from gefen_triton import launch

REFUSE_CPU = """
import torch, gefen_triton
from gefen_triton import conformance
for attempt in (lambda: gefen_triton.Gefen([torch.nn.Parameter(torch.zeros(4))]),
                lambda: conformance.IMPLEMENTATION.prepare(torch.device("cpu"))):
    try:
        attempt()
    except RuntimeError as exc:
        print("REFUSED:", exc)
    else:
        print("ACCEPTED")
"""


def test_cpu_tensors_without_the_interpreter_are_refused_naming_the_fix():
    """Compiled (no TRITON_INTERPRET), CPU parameters are refused when the optimizer is built and by
    ``prepare``, with an error naming TRITON_INTERPRET=1; nothing falls back silently."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run(
        [sys.executable, "-c", REFUSE_CPU], env=env, capture_output=True, text=True, timeout=120
    )
    lines = [line for line in out.stdout.splitlines() if line.startswith(("REFUSED", "ACCEPTED"))]
    assert len(lines) == 2, out.stdout + out.stderr
    assert all(line.startswith("REFUSED") and "TRITON_INTERPRET=1" in line for line in lines), lines


def test_a_gpu_under_the_interpreter_is_refused_naming_the_fix():
    if not launch.interpreted():
        pytest.skip("the interpreter is not on")
    with pytest.raises(launch.DeviceMismatch, match="unset TRITON_INTERPRET"):
        launch.check_device(torch.device("cuda", 0), "a parameter")


def test_prepare_runs_every_variant(device):
    """``prepare`` (the suite's warm-up hook) runs on the session's device without raising."""
    from gefen_triton import conformance

    conformance.IMPLEMENTATION.prepare(device)
