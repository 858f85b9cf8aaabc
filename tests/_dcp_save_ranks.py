"""Rank bodies and fixtures for tests/test_dcp_save.py.

Every public function here is module level and picklable, so it can run on launched gloo ranks
(``gefen_conformance.harness.launch.run``) as well as in-process at world size 1 (inside a
``gefen_conformance.harness.sharding.WorldOfOne``). Rank, mesh and group come from
``gefen_conformance.harness.world.current()``; the model, optimizers and saves are those of
``tests.support`` and ``gefen_conformance.workload``.
"""

from __future__ import annotations

import os

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.device_mesh import DeviceMesh

from gefen_conformance.harness import world
from gefen_conformance.harness.sharding import world_mesh
from gefen_conformance.implementations import registry
from gefen_conformance.workload import models, saving
from tests.support import COMPACT_KEYS, DCP_MODEL, FRESH, dcp_optimizer, dcp_trained

REFERENCE = registry.resolve("reference")


def copy_of_trained(template, mesh=None):
    """``(optimizer, params, mesh)``: a new reference Gefen on new parameters holding a clone of
    ``template``'s state (cheaper than training again; the parameters keep their initial values)."""
    mesh = world_mesh() if mesh is None else mesh
    params = models.parameters(DCP_MODEL, mesh=mesh)
    optimizer = dcp_optimizer("reference", params)
    for name, p in params.items():
        source = template.state[_param(template, name)]
        optimizer.state[p] = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in source.items()}
    optimizer.codebook = template.codebook.clone()
    optimizer.global_step = template.global_step
    return optimizer, params, mesh


def trained_twins(mesh):
    """A gefen-x Gefen and a reference Gefen trained on identical gradients.

    Raises AssertionError naming the first difference if their compact state is
    not bit-identical (the md5 comparison would be meaningless then).
    """
    gx, gx_params = dcp_trained("gefenx", mesh=mesh)
    ref, ref_params = dcp_trained("reference", mesh=mesh)
    assert gx._gefen_global_step == ref.global_step
    assert torch.equal(gx._gefen_codebook, ref.codebook), "codebooks differ"
    for name in DCP_MODEL.shapes:
        a, b = gx.state[gx_params[name]], ref.state[ref_params[name]]
        for key in COMPACT_KEYS:
            assert (key in a) == (key in b), (name, key)
            if key in a:
                same = torch.equal(a[key], b[key]) if torch.is_tensor(a[key]) else a[key] == b[key]
                assert same, f"compact state differs: {name} {key}"
    return gx, ref


# ----------------------------------------------------------------------------- md5 body

SAVE_VARIANTS = (
    # (directory, implementation, planned, thread_count)
    ("gefenx_plain", "gefenx", False, 1),
    ("gefenx_planned", "gefenx", True, 1),
    ("gefenx_threads", "gefenx", True, 2),
    ("ref_plain", "reference", False, 1),
    ("ref_planned", "reference", True, 1),
    ("ref_planned_again", "reference", True, 1),
    ("ref_threads", "reference", True, 2),
)


def save_all_variants(root: str) -> int:
    """Save the same compact state with both adapters in every variant (collective)."""
    optimizers = dict(zip(("gefenx", "reference"), trained_twins(world_mesh())))
    for directory, impl, planned, threads in SAVE_VARIANTS:
        path = os.path.join(root, directory)
        saving.save(
            registry.resolve(impl),
            optimizers[impl],
            planner=planned,
            writer=dcp.FileSystemWriter(path, thread_count=threads),
        )
    return world.current().rank


def load_into_gefenx(path: str) -> dict:
    """``dcp.load`` a checkpoint into a fresh gefen-x optimizer; report what it restored."""
    params = models.parameters(DCP_MODEL, mesh=world_mesh())
    target = dcp_optimizer("gefenx", params, lr=9.9e-9, betas=(0.1, 0.2), eps=7e-7, weight_decay=0.5)
    saving.load(registry.resolve("gefenx"), target, path)
    return {
        "global_step": target._gefen_global_step,
        "counters": {
            name: (target.state[p].get("step"), target.state[p].get("vmean_step"))
            for name, p in params.items()
        },
        "hypers": [
            {key: float(group[key]) for key in ("lr", "beta1", "beta2", "eps", "weight_decay")}
            for group in target.param_groups
        ],
        "local_periods": {name: target.state[p].get("automatic_period") for name, p in params.items()},
    }


# ------------------------------------------------------------------ fail-before-write body


def _param(optimizer, name):
    for group in optimizer.param_groups:
        for pname, p in zip(group["param_names"], group["params"]):
            if pname == name:
                return p
    raise KeyError(name)


def _state(optimizer, name="enc.weight"):
    return optimizer.state[_param(optimizer, name)]


def _set_state(key, make, name="enc.weight"):
    def apply(opt):
        state = _state(opt, name)
        state[key] = make(state[key] if key in state else None)

    return apply


def _drop_state(key, name="enc.weight"):
    def apply(opt):
        del _state(opt, name)[key]

    return apply


def _set_attr(attr, value):
    def apply(opt):
        setattr(opt, attr, value(getattr(opt, attr)) if callable(value) else value)

    return apply


def _set_group(index, key, make):
    def apply(opt):
        opt.param_groups[index][key] = make(opt.param_groups[index][key])

    return apply


def _shorten_one_block(opt):
    state = _state(opt)
    period = state["automatic_period"]
    state["m_codebook"] = state["m_codebook"].reshape(-1)[:-period].reshape(-1, period)
    state["m_magnitude"] = state["m_magnitude"][:-1]


def _plain_tensor_param(opt):
    group = opt.param_groups[1]
    group["params"][0] = torch.nn.Parameter(torch.zeros(DCP_MODEL.shapes["dec.weight"]))


def _nonfinite(key, value):
    def make(old):
        new = old.clone()
        new.view(-1)[0] = value
        return new

    return _set_state(key, make)


# (scenario id, SPEC clause, corruption applied on the failing rank, expected type, message part)
PREFLIGHT_SCENARIOS = (
    ("no_codebook", "2.4.3", _set_attr("codebook", None), RuntimeError, "initialized codebook"),
    (
        "short_codebook",
        "2.4.3",
        _set_attr("codebook", lambda cb: cb[:255].clone()),
        ValueError,
        "codebook geometry",
    ),
    (
        "codebook_2d",
        "2.4.3",
        _set_attr("codebook", lambda cb: cb.reshape(128, 2).clone()),
        ValueError,
        "codebook geometry",
    ),
    ("index_dtype", "2.4.3", _set_state("m_codebook", lambda t: t.long()), ValueError, "index dtype"),
    (
        "device_mismatch",
        "2.4.3",
        _set_state("m_magnitude", lambda t: torch.empty(t.shape, device="meta")),
        ValueError,
        "device is inconsistent",
    ),
    ("untiled_blocks", "2.4.3", _shorten_one_block, ValueError, "momentum block geometry"),
    (
        "vmean_geometry",
        "2.4.3",
        _set_state("vmean", lambda t: torch.cat([t, t[:1]])),
        ValueError,
        "second-moment block geometry",
    ),
    ("nan_vmean", "2.4.3", _nonfinite("vmean", float("nan")), ValueError, "non-finite"),
    ("inf_magnitude", "2.4.3", _nonfinite("m_magnitude", float("inf")), ValueError, "non-finite"),
    (
        "nan_codebook",
        "2.4.3",
        _set_attr("codebook", lambda cb: torch.where(torch.arange(256) == 3, float("nan"), cb)),
        ValueError,
        "non-finite",
    ),
    ("partial_state", "2.4.2", _drop_state("vmean"), ValueError, "partial optimizer state"),
    (
        "orphaned_counter",
        "2.4.2",
        _set_state("vmean_step", lambda _: 5, name=FRESH),
        ValueError,
        "partial optimizer state",
    ),
    ("negative_step", "2.4.2", _set_state("step", lambda _: -1), ValueError, "nonnegative integer"),
    ("bool_step", "2.4.2", _set_state("step", lambda _: True), ValueError, "nonnegative integer"),
    ("bad_global_step", "2.4.2", _set_attr("global_step", 2.5), ValueError, "nonnegative integer"),
    (
        "missing_names",
        "2.4.1",
        _set_group(1, "param_names", lambda _: []),
        RuntimeError,
        "stable param_names",
    ),
    (
        "synthesized_name",
        "2.4.1",
        _set_group(0, "param_names_synthesized", lambda f: [True] + list(f[1:])),
        RuntimeError,
        "synthesized",
    ),
    (
        "duplicate_name",
        "2.4.1",
        _set_group(1, "param_names", lambda n: ["enc.weight"] + list(n[1:])),
        RuntimeError,
        "unique across every group",
    ),
    ("plain_tensor", "2.4.1", _plain_tensor_param, RuntimeError, "DTensor"),
    ("factored_v_2d", "2.4.1", _set_attr("factored_v_2d", True), RuntimeError, "factored_v_2d"),
)
SCENARIO_IDS = tuple(s[0] for s in PREFLIGHT_SCENARIOS)


def _outcome(exc):
    if exc is None:
        return None
    return (type(exc).__name__, str(exc))


def _saved_outcome(optimizer, path: str):
    """Save with the reference's planner; ``(type, message)`` of the error, or None."""
    try:
        saving.save(REFERENCE, optimizer, path)
    except Exception as exc:  # the outcome is the result
        return _outcome(exc)
    return None


def preflight_failures(root: str, failing_rank: int = 0) -> list:
    """Run every preflight scenario through ``dcp.save`` (collective).

    ``failing_rank`` corrupts a fresh copy of its optimizer; the others stay
    healthy. Returns one ``(scenario, outcome)`` per scenario, where the outcome
    is ``(exception type, message)`` or None if the save succeeded.
    """
    mesh = world_mesh()
    template, _ = dcp_trained(mesh=mesh)
    results = []
    for scenario, _clause, corrupt, _type, _part in PREFLIGHT_SCENARIOS:
        optimizer, _, _ = copy_of_trained(template, mesh)
        if world.current().rank == failing_rank:
            corrupt(optimizer)
        results.append((scenario, _saved_outcome(optimizer, os.path.join(root, scenario))))
    return results


def divergent_layouts(root: str) -> tuple:
    """Each rank renames one parameter differently, then all save (collective)."""
    optimizer, _ = dcp_trained()
    group = optimizer.param_groups[1]
    group["param_names"] = [f"dec.weight_rank{world.current().rank}"] + list(group["param_names"][1:])
    return _saved_outcome(optimizer, os.path.join(root, "divergent"))


def reordered_mesh_save(root: str) -> tuple:
    """Parameters on a mesh listing the ranks backwards (collective)."""
    here = world.current()
    backwards = DeviceMesh(here.device.type, torch.arange(here.size - 1, -1, -1))
    optimizer, _ = dcp_trained(mesh=backwards)
    return _saved_outcome(optimizer, os.path.join(root, "reordered"))
