"""The training stack users run (SPEC 4.3.14): FSDP2 ``fully_shard`` over a small transformer, bf16
autocast, a real ``torch.amp.GradScaler`` with an overflow, ``clip_grad_norm_`` over DTensor
gradients, a warm-up-then-cosine schedule, and a torchtitan-style app-state checkpoint, resumed on
another world size with the model sharded again (``gefen_conformance.workload.stack``); in the
scale tier also 8 -> 16 and 16 -> 8 ranks, each a thread of one process.

Each resume path trains the implementation and the reference side by side from the same initial
values on N ranks, saves each through its own adapter, resumes each on M ranks and trains on; the
implementation's run is judged against the reference's: every step's loss, and at the end the
parameters, the scaler's scale, the scheduler's state and the step (SPEC 5.6.24). One run without a
checkpoint under the default ``factored_v_2d=True`` keeps every 2-D DTensor on the block path. Two
failures of the stack: a rank killed during the save, and HSDP's 2-D mesh, which the adapter refuses.
"""

from __future__ import annotations

import math

import pytest
import torch

from gefen_conformance.implementations.contract import DCP_RESHARD, NATIVE_STATE_DICT
from gefen_conformance.suite import checkpoints
from gefen_conformance.workload import stack
from gefen_conformance.workload.saving import killing_writer
from gefen_oracles import kernel_bounds as kb
from gefen_oracles.checkpoint_reader import CheckpointError, read_metadata
from gefen_oracles.numeric import Comparison, Comparisons, bitwise_comparison

TIMEOUT = 60.0
#: The state keys that tell a parameter's second-moment path (SPEC 1.8, 1.9).
ROUTES = {"vmean", "v_row", "v_col"}
KILLED_EXIT_CODE = 19

#: (config, source world, target world): uneven shards everywhere, empty ones on 4 ranks and more.
#: 8 -> 16 and 16 -> 8 run their ranks as threads of one process (the thread launcher) in the scale
#: tier: about a minute of a 2-core machine each.
PATHS = [
    pytest.param("mixed", 2, 4, id="2->4-bf16-policy"),
    pytest.param("tied", 4, 2, id="4->2-tied"),
    pytest.param("mixed-tied", 2, 1, id="2->1-bf16-policy-tied"),
    pytest.param("plain", 1, 2, id="1->2"),
    pytest.param("mixed", 3, 2, id="3->2-bf16-policy"),
    pytest.param("mixed", 8, 16, id="8->16-bf16-policy", marks=pytest.mark.gefen_tier("scale")),
    pytest.param("tied", 16, 8, id="16->8-tied", marks=pytest.mark.gefen_tier("scale")),
]
#: Worlds past this many ranks run as threads of one process (``checkpoints.run_at_scale``).
THREADED_PAST = 4


def _run(fn, world_size: int, args: tuple, impl):
    """``fn`` on ``world_size`` ranks: on the active launcher, or as threads past
    :data:`THREADED_PAST` ranks."""
    if world_size > THREADED_PAST:
        return checkpoints.run_at_scale(fn, world_size, args, impl=impl, timeout=checkpoints.SCALE_TIMEOUT)
    return checkpoints.run(fn, world_size, args, timeout=TIMEOUT)


def _resumed(gefen_checkpoints, impl, reference, config: str, source: int, target: int) -> tuple:
    """``(trained, resumed)`` of one path, made once per session: per side (implementation, then
    reference) the losses before the save, and the resume's ``(losses, report)`` or its error."""
    stack_config = stack.STACK_CONFIGS[config]
    directory = gefen_checkpoints.directory("stack", impl, config, f"w{source}")
    paths = (str(directory / "impl"), str(directory / "reference"))
    trained = gefen_checkpoints.once(
        ("stack-trained", impl.spec, config, source),
        lambda: _run(stack.train_and_save, source, ((impl, reference), stack_config, paths), impl)[0],
    )
    resumed = gefen_checkpoints.once(
        ("stack-resumed", impl.spec, config, source, target),
        lambda: _run(stack.resume_and_train, target, ((impl, reference), stack_config, paths), impl)[0],
    )
    return trained, resumed


# ----------------------------------------------------------------------------------- checks


def _losses(what: str, expected: list, actual: list, bitwise: bool) -> Comparison:
    e, a = torch.tensor(expected, dtype=torch.float64), torch.tensor(actual, dtype=torch.float64)
    if bitwise:
        return bitwise_comparison(what, e, a)
    finite = torch.isfinite(e)
    if not torch.equal(finite, torch.isfinite(a)) or len(expected) != len(actual):
        return Comparison(
            what, "tolerance", math.inf, kb.STACK_LOSS_RTOL, problems=[f"{what}: {actual} vs {expected}"]
        )
    error = float(((a - e).abs() / e.abs())[finite].max()) if bool(finite.any()) else 0.0
    problems = [] if error <= kb.STACK_LOSS_RTOL else [f"{what}: {actual} vs the reference's {expected}"]
    return Comparison(what, "tolerance", error, kb.STACK_LOSS_RTOL, problems=problems)


def _parameters(what: str, expected: dict, actual: dict, bitwise: bool) -> list:
    """Full parameters by name: bitwise, or max-abs within ``STACK_PARAMS_MAX_ABS`` (a non-finite
    difference counts as infinite)."""
    if bitwise:
        return [bitwise_comparison(what, expected[n], actual[n], label=n) for n in sorted(expected)]

    def max_abs(n: str) -> float:
        error = float((actual[n].double() - expected[n].double()).abs().max()) if expected[n].numel() else 0.0
        return error if math.isfinite(error) else math.inf

    worst, where = max((max_abs(n), n) for n in sorted(expected))
    bound = kb.STACK_PARAMS_MAX_ABS
    problems = [] if worst <= bound else [f"{what}: max-abs {worst:.3e} at {where}"]
    return [Comparison(f"{what} (max-abs)", "tolerance", worst, bound, problems=problems)]


def compare_runs(reference_run: tuple, impl_run: tuple, bitwise: bool) -> Comparisons:
    """The implementation's run of a path against the reference's (SPEC 5.6.24)."""
    reference_trained, (reference_resumed, reference_end) = reference_run
    impl_trained, (impl_resumed, impl_end) = impl_run
    out = Comparisons()
    skipped = sum(not math.isfinite(loss) for loss in reference_trained + reference_resumed)
    if skipped != 1 or reference_end["scale"] != stack.INIT_SCALE / 2:
        scale = reference_end["scale"]
        out.problem(f"workload too weak: the reference's scaler skipped {skipped} steps, scale {scale}")
    out.add(_losses("losses before the save", reference_trained, impl_trained, bitwise))
    out.add(_losses("losses after the resume", reference_resumed, impl_resumed, bitwise))
    names = sorted(reference_end["params"])
    if sorted(impl_end["params"]) != names:
        out.problem(f"parameters {sorted(impl_end['params'])}, the reference's {names}")
        return out
    out.extend(_parameters("parameters at the end", reference_end["params"], impl_end["params"], bitwise))
    for key, what in (
        ("scale", "the scaler's scale"),
        ("scheduler", "the scheduler's state"),
        ("lrs", "the groups' lr"),
        ("step", "the trainer's step"),
    ):
        same = impl_end[key] == reference_end[key]
        out.exact(
            f"{what} at the end",
            int(not same),
            1,
            [] if same else [f"{what}: {impl_end[key]!r}, the reference's {reference_end[key]!r}"],
        )
    return out


def _refusal(rank: int, outcome, part: str) -> str | None:
    if outcome is None:
        return f"rank {rank}: the save of a 2-D mesh's optimizer succeeded; expected an error naming {part!r}"
    kind, message = outcome
    return (
        None if part in message else f"rank {rank}: raised {kind}: {message!r}; expected one naming {part!r}"
    )


# ------------------------------------------------------------------------------------ tests


@pytest.mark.gefen_clause("4.3.14", "5.6.24", "3.7.1", "1.10.3", "3.5.5")
@pytest.mark.gefen_requires(DCP_RESHARD)
@pytest.mark.parametrize("config,source,target", PATHS)
def test_stack_resumes_like_the_reference(
    gefen_impl, gefen_reference, gefen_checkpoints, gefen_judge, config, source, target
):
    trained, resumed = _resumed(gefen_checkpoints, gefen_impl, gefen_reference, config, source, target)
    failed = [
        f"{side}: the resume raised {r[1]}: {r[2]}"
        for side, r in zip(("implementation", "reference"), resumed)
        if r[0] == "raised"
    ]
    assert not failed, "\n".join(failed)
    impl_run, reference_run = (trained[0], resumed[0]), (trained[1], resumed[1])
    gefen_judge.assert_comparisons(compare_runs(reference_run, impl_run, gefen_judge.bitwise))


@pytest.mark.gefen_clause("4.3.14", "1.9.1", "1.1.5", "5.6.24")
@pytest.mark.gefen_requires(NATIVE_STATE_DICT)
def test_stack_with_the_default_flags_keeps_dtensors_on_the_block_path(
    gefen_impl, gefen_reference, gefen_judge
):
    """The optimizer's default ``factored_v_2d=True`` under ``fully_shard`` on 2 ranks (no
    checkpoint): every 2-D DTensor parameter still takes the block path (its state holds
    ``vmean``, never ``v_row``/``v_col``), and the run matches the reference's."""
    config = stack.STACK_CONFIGS["plain"]
    ranks = checkpoints.run(stack.train_with_the_default_flags, 2, ((gefen_impl, gefen_reference), config))
    problems = []
    for rank, ((_, _, impl_keys), (_, _, reference_keys)) in enumerate(ranks):
        if any("v_row" in keys for keys in reference_keys.values()):
            problems.append(f"rank {rank}: the reference's DTensor parameters took the factored path")
        problems += [
            f"rank {rank}: {name} holds {sorted(set(keys) & ROUTES)}, the reference's "
            f"{sorted(set(reference_keys.get(name, ())) & ROUTES)} (SPEC 1.9.1)"
            for name, keys in impl_keys.items()
            if set(keys) & ROUTES != set(reference_keys.get(name, ())) & ROUTES
        ]
    assert not problems, "\n".join(problems[:20])
    (impl_losses, impl_end, _), (reference_losses, reference_end, _) = ranks[0]
    out = Comparisons()
    out.add(_losses("losses with the default flags", reference_losses, impl_losses, gefen_judge.bitwise))
    out.extend(
        _parameters(
            "parameters with the default flags",
            reference_end["params"],
            impl_end["params"],
            gefen_judge.bitwise,
        )
    )
    gefen_judge.assert_comparisons(out)


@pytest.mark.gefen_clause("4.3.14", "4.3.3", "4.2.2", "5.1.2")
@pytest.mark.gefen_requires(DCP_RESHARD)
def test_stack_rank_killed_mid_save_leaves_nothing_to_resume(gefen_impl, gefen_checkpoints):
    """Rank 1 writes its payload and dies before reporting it: rank 0 raises within the bound, no
    ``.metadata`` is committed, and a resume of that directory fails on every rank."""
    path = gefen_checkpoints.scratch("stack-killed") / "checkpoint"
    config = stack.STACK_CONFIGS["mixed"]
    outcomes = checkpoints.run(
        stack.train_and_save,
        2,
        ((gefen_impl,), config, (str(path),), killing_writer(1, KILLED_EXIT_CODE)),
        timeout=TIMEOUT,
        allow_failure=True,
    )
    assert [o.status for o in outcomes] == ["raised", "died"], "\n".join(o.headline() for o in outcomes)
    assert outcomes[1].exitcode == KILLED_EXIT_CODE, outcomes[1].headline()
    with pytest.raises(CheckpointError, match="did not commit"):
        read_metadata(path)
    resumed = checkpoints.run(
        stack.resume_and_train, 2, ((gefen_impl,), config, (str(path),)), timeout=TIMEOUT
    )
    assert all(r[0][0] == "raised" for r in resumed), [r[0][:2] for r in resumed]


@pytest.mark.gefen_clause("4.3.14", "2.4.1", "2.3.4")
@pytest.mark.gefen_requires(DCP_RESHARD)
def test_stack_hsdp_mesh_is_refused_and_nothing_written(gefen_impl, gefen_checkpoints):
    """``fully_shard`` on a 2-D (replicate x shard) mesh: every rank's save raises naming the mesh
    ("one-dimensional", SPEC 2.4.1), and nothing is written."""
    path = gefen_checkpoints.scratch("stack-hsdp") / "checkpoint"
    outcomes = checkpoints.run(stack.refused_on_a_2d_mesh, 2, (gefen_impl, str(path)), timeout=TIMEOUT)
    problems = [p for rank, o in enumerate(outcomes) if (p := _refusal(rank, o, "one-dimensional"))]
    written = sorted(p.name for p in path.iterdir()) if path.exists() else []
    if written:
        problems.append(f"written although the save failed: {written}")
    assert not problems, "\n".join(problems)
