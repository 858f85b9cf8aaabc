"""Sensitivity of the tolerance profile: the smallest error the suite's comparisons detect.

For fp32, bf16 and fp16 and for each of lr, beta1, beta2, eps, weight decay and a bias of the
update itself, an implementation is built from the reference whose step uses the hyperparameter
times ``1 + e`` (its groups keep the user's value; for the bias, every block-path update is
multiplied by ``1 + e``). For each error ``e`` of a log grid, both signs, it is run through the
same comparisons the suite makes under the tolerance profile:

* ``pinned``: the pinned steps of ``test_pinned_block_step`` (pinned codebook and pinned after 3
  steps; plain and weight decay with a tensor lr) and ``test_pinned_factored_step``;
* ``free-running``: the six-step trajectories of ``test_block_step_matches_reference`` (the only
  numeric check for an implementation without ``native-state-dict``).

The reported figure is the smallest ``e`` of the grid (1e-7 to 1, steps 1-2-5) detected with both
signs, and at every larger ``e`` of the grid; "<=1e-07": detected at the grid's smallest error;
">e": not detected even at ``e``, the largest error the grid tries (betas stay below 1: at most
1e-3 for beta2 = 0.999 and 1e-1 for beta1 = 0.9). Run from the repository root:

    python benchmarks/sensitivity.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

import gefen_reference.optimizer as optimizer_module  # noqa: E402
import gefen_reference.steps as steps  # noqa: E402
from gefen_conformance.workload import models, runs  # noqa: E402
from gefen_oracles import codebook_quality, free_running, kernel_bounds, native_compare, pinned_step  # noqa: E402
from gefen_oracles.numeric import Comparisons  # noqa: E402
from tests.mutant_tools import clone  # noqa: E402

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
KINDS = ("lr", "beta1", "beta2", "eps", "weight_decay", "update bias")
GRID = [m * 10.0**k for k in range(-7, 1) for m in (1, 2, 5)] + [1.0]
PINNED_CONFIGS = [
    (0, dict(tensor_lr=False, weight_decay=0.0, factored_v_2d=False)),
    (3, dict(tensor_lr=False, weight_decay=0.0, factored_v_2d=False)),
    (0, dict(tensor_lr=True, weight_decay=0.05, factored_v_2d=False)),
    (3, dict(tensor_lr=True, weight_decay=0.05, factored_v_2d=False)),
    (3, dict(tensor_lr=False, weight_decay=0.05, factored_v_2d=True)),
]
TRAJECTORY_CONFIGS = [
    dict(tensor_lr=False, weight_decay=0.0, factored_v_2d=False),
    dict(tensor_lr=True, weight_decay=0.05, factored_v_2d=False),
]


def perturbed(kind: str, error: float):
    """A reference optimizer class whose steps use the perturbed value (None if out of range)."""
    if kind == "update bias":
        biased = clone(
            steps, _subtract_flat=lambda param, update: steps._subtract_flat(param, update * (1 + error))
        )
        return clone(optimizer_module, block_vmean_step=biased.block_vmean_step).Gefen

    def hyper(**values):
        values[kind] = values[kind] * (1 + error)
        return steps.StepHyper(**values)

    return clone(optimizer_module, StepHyper=hyper).Gefen


def valid(kind: str, error: float) -> bool:
    if kind in ("beta1", "beta2"):
        largest = 0.999 if kind == "beta2" else 0.9  # the largest beta of the workload's groups
        return largest * (1 + error) < 1.0
    return True


class Pinned:
    def __init__(self, dtype):
        self.dtype = dtype
        self.states = [runs.pinned_state(dtype, pin, **kw) for pin, kw in PINNED_CONFIGS]
        self.references = [
            runs.pinned_step(models.REFERENCE, dtype, pin, sd, **kw)
            for (pin, kw), sd in zip(PINNED_CONFIGS, self.states)
        ]

    def detects(self, make) -> bool:
        for (pin, kw), sd, reference_result in zip(PINNED_CONFIGS, self.states, self.references):
            result = runs.pinned_step(make, self.dtype, pin, sd, **kw)
            if native_compare.exact_problems(
                reference_result.state_dict, result.state_dict, codebook_exact=True
            ):
                return True
            checks = pinned_step.check_step(
                runs.param_steps(sd, result, factored=kw["factored_v_2d"]), sd["gefen_codebook"]
            )
            if not checks.ok:
                return True
        return False


class FreeRunning:
    def __init__(self, dtype):
        self.dtype = dtype
        self.references = [runs.trajectory(models.REFERENCE, dtype, 6, **kw) for kw in TRAJECTORY_CONFIGS]

    def detects(self, make) -> bool:
        for kw, ours in zip(TRAJECTORY_CONFIGS, self.references):
            theirs = runs.trajectory(lambda g, **o: make(g, **o), self.dtype, 6, **kw)
            gap = codebook_quality.largest_gap(ours.optimizer.codebook)
            betas = {
                n: (g["beta1"], g["beta2"]) for g in ours.optimizer.param_groups for n in g["param_names"]
            }
            out, moved, systematic = Comparisons(), [], 0.0
            for n in models.OPTIMIZER.shapes:
                factor = free_running.momentum_factor(6, betas[n][0], gap, self.dtype)
                c, d = free_running.trajectory(
                    n, self.dtype, ours.history[n], theirs.params[n].detach(), factor
                )
                out.add(c)
                moved.append(d)
                bound = kernel_bounds.second_moment(ours.params[n].numel(), self.dtype, betas[n][1])
                systematic = max(systematic, kernel_bounds.update(self.dtype, kernel_bounds.stepsize(bound)))
            bias = free_running.displacement_bias(self.dtype, moved, systematic)
            if bias is not None:
                out.add(bias)
            if not out.ok:
                return True
        return False


def threshold(check, kind: str, grid) -> str:
    """The smallest grid error detected with both signs, and at every larger valid error:
    "<=e" when that is the grid's smallest, ">e" when not even the largest valid error ``e`` is."""
    found = None
    usable = [e for e in grid if valid(kind, e)]
    for error in reversed(usable):
        both = all(
            check.detects(lambda g, cls=perturbed(kind, sign * error), **o: cls(g, **o)) for sign in (1, -1)
        )
        if not both:
            break
        found = error
    if found is None:
        return f">{usable[-1]:.0e}"
    return f"<={found:.0e}" if found == usable[0] else f"{found:.0e}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a coarser grid (decades only)")
    args = parser.parse_args()
    grid = [g for g in GRID if args.quick is False or f"{g:.0e}".startswith("1e")]
    start = time.perf_counter()
    rows = {}
    for label, dtype in DTYPES.items():
        pinned, free = Pinned(dtype), FreeRunning(dtype)
        for kind in KINDS:
            rows[(label, kind)] = (threshold(pinned, kind, grid), threshold(free, kind, grid))
            print(
                f"{label} {kind}: pinned {rows[(label, kind)][0]}, free-running {rows[(label, kind)][1]}",
                flush=True,
            )
    print()
    print("| error in | " + " | ".join(f"{d} pinned | {d} free-running" for d in DTYPES) + " |")
    print("|---|" + "---:|" * (2 * len(DTYPES)))
    for kind in KINDS:
        print(
            f"| {kind} | " + " | ".join(f"{rows[(d, kind)][0]} | {rows[(d, kind)][1]}" for d in DTYPES) + " |"
        )
    print(f"\n{time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
