"""Rank bodies and fixtures for tests/test_dcp_save.py.

Every public function here is module level and picklable, so it can run on
spawned gloo ranks (conformance.ranks.run_on_ranks) as well as in-process at
world size 1. The functions read rank and world size from torch.distributed.
"""

from __future__ import annotations

import hashlib
import os
import warnings

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.tensor import Shard, distribute_tensor

import reference
import reference.dcp as rdcp
from conformance.sharding import world_mesh
from oracles import checkpoint_reader

# Five slots in two groups: a searched-period matrix, a vector, a matrix whose
# first dimension does not divide evenly over 4 ranks, a parameter that never
# receives a gradient (a fresh slot), and a two-row matrix whose shard is empty
# on ranks 2 and 3 of a 4-rank world.
SHAPES = {
    "enc.weight": (64, 48),
    "enc.bias": (48,),
    "dec.weight": (10, 8),
    "head.weight": (16, 8),
    "tiny.weight": (2, 8),
}
FRESH = "head.weight"
HYPERS = dict(lr=2.5e-3, betas=(0.8, 0.97), eps=2e-8, weight_decay=0.03)
GROUP1 = dict(lr=2e-3, weight_decay=0.01)
SAVE_STEPS = 3
COMPACT_KEYS = ("automatic_period", "step", "m_codebook", "m_magnitude", "vmean", "vmean_step")


def mesh():
    return world_mesh()


def make_params(device_mesh) -> dict:
    params = {}
    for name, shape in SHAPES.items():
        full = torch.linspace(-0.8, 0.7, torch.Size(shape).numel()).reshape(shape)
        params[name] = torch.nn.Parameter(distribute_tensor(full, device_mesh, [Shard(0)]))
        coordinate = params[name].device_mesh.get_coordinate()
        assert coordinate == device_mesh.get_coordinate(), (
            "parameter %s landed on a stale mesh (coordinate %s)" % (name, coordinate)
        )
    return params


def grouped(params) -> list:
    return [
        {"params": [("enc.weight", params["enc.weight"]), ("enc.bias", params["enc.bias"])]},
        {
            "params": [
                ("dec.weight", params["dec.weight"]),
                (FRESH, params[FRESH]),
                ("tiny.weight", params["tiny.weight"]),
            ],
            **GROUP1,
        },
    ]


def gradient(name: str, step: int, device_mesh):
    seed = 1000 * step + sum(map(ord, name))
    full = torch.randn(SHAPES[name], generator=torch.Generator().manual_seed(seed))
    return distribute_tensor(full, device_mesh, [Shard(0)])


def train(optimizer, params, device_mesh, steps=SAVE_STEPS, first_step=0):
    for step in range(first_step, first_step + steps):
        for name, p in params.items():
            p.grad = None if name == FRESH else gradient(name, step, device_mesh)
        optimizer.step()


def reference_optimizer(params, **overrides):
    kwargs = dict(HYPERS, fused=False, factored_v_2d=False, deterministic=True)
    kwargs.update(overrides)
    return reference.Gefen(grouped(params), **kwargs)


def gefenx_optimizer(params, **overrides):
    import gefen

    kwargs = dict(HYPERS, fused=False, factored_v_2d=False, deterministic=True)
    kwargs.update(overrides)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return gefen.Gefen(grouped(params), **kwargs)


def trained_reference(device_mesh=None):
    device_mesh = device_mesh or mesh()
    params = make_params(device_mesh)
    optimizer = reference_optimizer(params)
    train(optimizer, params, device_mesh)
    return optimizer, params, device_mesh


def copy_of_trained(template, device_mesh):
    """A new reference Gefen on new parameters holding a clone of ``template``'s state.

    Cheaper than training again; the parameters keep their initial values.
    """
    params = make_params(device_mesh)
    optimizer = reference_optimizer(params)
    for name, p in params.items():
        source = template.state[_param(template, name)]
        optimizer.state[p] = {k: (v.clone() if torch.is_tensor(v) else v) for k, v in source.items()}
    optimizer.codebook = template.codebook.clone()
    optimizer.global_step = template.global_step
    return optimizer, params, device_mesh


def trained_twins(device_mesh):
    """A gefen-x Gefen and a reference Gefen trained on identical gradients.

    Raises AssertionError naming the first difference if their compact state is
    not bit-identical (the md5 comparison would be meaningless then).
    """
    gx_params, ref_params = make_params(device_mesh), make_params(device_mesh)
    gx, ref = gefenx_optimizer(gx_params), reference_optimizer(ref_params)
    train(gx, gx_params, device_mesh)
    train(ref, ref_params, device_mesh)
    assert gx._gefen_global_step == ref.global_step
    assert torch.equal(gx._gefen_codebook, ref.codebook), "codebooks differ"
    for name in SHAPES:
        a, b = gx.state[gx_params[name]], ref.state[ref_params[name]]
        for key in COMPACT_KEYS:
            assert (key in a) == (key in b), (name, key)
            if key in a:
                same = torch.equal(a[key], b[key]) if torch.is_tensor(a[key]) else a[key] == b[key]
                assert same, "compact state differs: %s %s" % (name, key)
    return gx, ref


def save(state, path, planner=None, thread_count=1):
    writer = dcp.FileSystemWriter(path, thread_count=thread_count)
    dcp.save({"optimizer": state}, storage_writer=writer, planner=planner)


def payload_md5(path) -> dict:
    digests = {}
    for entry in sorted(os.listdir(path)):
        if entry.endswith(".distcp"):
            with open(os.path.join(path, entry), "rb") as handle:
                digests[entry] = hashlib.md5(handle.read()).hexdigest()
    return digests


def comparable_metadata(path) -> dict:
    """``.metadata`` parsed, without its random save id and checkpoint path."""
    metadata = checkpoint_reader.read_metadata(path)
    storage_meta = metadata.storage_meta
    return {
        "state_dict_metadata": metadata.state_dict_metadata,
        "storage_data": metadata.storage_data,
        "planner_data": metadata.planner_data,
        "version": getattr(metadata, "version", None),  # older torch (2.7) has no format version
        "modules": getattr(storage_meta, "modules", None),
    }


def checkpoint_bytes(path) -> list:
    """Every ``.metadata`` or ``.distcp`` file (possibly partial) under ``path``."""
    if not os.path.isdir(path):
        return []
    return sorted(e for e in os.listdir(path) if e == ".metadata" or e.endswith(".distcp"))


# ----------------------------------------------------------------------------- md5 body

SAVE_VARIANTS = (
    # (directory, implementation, planned, thread_count)
    ("gefenx_plain", "gefenx", False, 1),
    ("gefenx_planned", "gefenx", True, 1),
    ("gefenx_threads", "gefenx", True, 2),
    ("ref_plain", "ref", False, 1),
    ("ref_planned", "ref", True, 1),
    ("ref_planned_again", "ref", True, 1),
    ("ref_threads", "ref", True, 2),
)


def save_all_variants(root: str) -> int:
    """Save the same compact state with both adapters in every variant (collective)."""
    import gefen

    device_mesh = mesh()
    gx, ref = trained_twins(device_mesh)
    for directory, impl, planned, threads in SAVE_VARIANTS:
        path = os.path.join(root, directory)
        if impl == "gefenx":
            state, planner = gefen.GefenDCPState(gx), (gefen.GefenSavePlanner() if planned else None)
        else:
            state, planner = rdcp.GefenDCPState(ref), (rdcp.GefenSavePlanner() if planned else None)
        save(state, path, planner, threads)
    return dist.get_rank()


def load_into_gefenx(path: str) -> dict:
    """``dcp.load`` a checkpoint into a fresh gefen-x optimizer; report what it restored."""
    import gefen

    device_mesh = mesh()
    params = make_params(device_mesh)
    target = gefenx_optimizer(params, lr=9.9e-9, betas=(0.1, 0.2), eps=7e-7, weight_decay=0.5)
    dcp.load({"optimizer": gefen.GefenDCPState(target)}, storage_reader=dcp.FileSystemReader(path))
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
    group["params"][0] = torch.nn.Parameter(torch.zeros(SHAPES["dec.weight"]))


def _nonfinite(key, value):
    def make(old):
        new = old.clone()
        new.view(-1)[0] = value
        return new

    return _set_state(key, make)


# (scenario id, SPEC clause, corruption applied on the failing rank, expected type, message part)
PREFLIGHT_SCENARIOS = (
    ("no_codebook", "2.4.3", _set_attr("codebook", None), RuntimeError, "initialized codebook"),
    ("short_codebook", "2.4.3", _set_attr("codebook", lambda cb: cb[:255].clone()), ValueError, "codebook geometry"),
    ("codebook_2d", "2.4.3", _set_attr("codebook", lambda cb: cb.reshape(128, 2).clone()), ValueError, "codebook geometry"),
    ("index_dtype", "2.4.3", _set_state("m_codebook", lambda t: t.long()), ValueError, "index dtype"),
    ("device_mismatch", "2.4.3", _set_state("m_magnitude", lambda t: torch.empty(t.shape, device="meta")), ValueError, "device is inconsistent"),
    ("untiled_blocks", "2.4.3", _shorten_one_block, ValueError, "momentum block geometry"),
    ("vmean_geometry", "2.4.3", _set_state("vmean", lambda t: torch.cat([t, t[:1]])), ValueError, "second-moment block geometry"),
    ("nan_vmean", "2.4.3", _nonfinite("vmean", float("nan")), ValueError, "non-finite"),
    ("inf_magnitude", "2.4.3", _nonfinite("m_magnitude", float("inf")), ValueError, "non-finite"),
    ("nan_codebook", "2.4.3", _set_attr("codebook", lambda cb: torch.where(torch.arange(256) == 3, float("nan"), cb)), ValueError, "non-finite"),
    ("partial_state", "2.4.2", _drop_state("vmean"), ValueError, "partial optimizer state"),
    ("orphaned_counter", "2.4.2", _set_state("vmean_step", lambda _: 5, name=FRESH), ValueError, "partial optimizer state"),
    ("negative_step", "2.4.2", _set_state("step", lambda _: -1), ValueError, "nonnegative integer"),
    ("bool_step", "2.4.2", _set_state("step", lambda _: True), ValueError, "nonnegative integer"),
    ("bad_global_step", "2.4.2", _set_attr("global_step", 2.5), ValueError, "nonnegative integer"),
    ("missing_names", "2.4.1", _set_group(1, "param_names", lambda _: []), RuntimeError, "stable param_names"),
    ("synthesized_name", "2.4.1", _set_group(0, "param_names_synthesized", lambda f: [True] + list(f[1:])), RuntimeError, "synthesized"),
    ("duplicate_name", "2.4.1", _set_group(1, "param_names", lambda n: ["enc.weight"] + list(n[1:])), RuntimeError, "unique across every group"),
    ("plain_tensor", "2.4.1", _plain_tensor_param, RuntimeError, "DTensor"),
    ("factored_v_2d", "2.4.1", _set_attr("factored_v_2d", True), RuntimeError, "factored_v_2d"),
)
SCENARIO_IDS = tuple(s[0] for s in PREFLIGHT_SCENARIOS)


def _outcome(exc):
    if exc is None:
        return None
    return (type(exc).__name__, str(exc))


def preflight_failures(root: str, failing_rank: int = 0) -> list:
    """Run every preflight scenario through ``dcp.save`` (collective).

    ``failing_rank`` corrupts a fresh copy of its optimizer; the others stay
    healthy. Returns one ``(scenario, outcome)`` per scenario, where the outcome
    is ``(exception type, message)`` or None if the save succeeded.
    """
    device_mesh = mesh()
    template, _, _ = trained_reference(device_mesh)
    results = []
    for scenario, _clause, corrupt, _type, _part in PREFLIGHT_SCENARIOS:
        optimizer, _, _ = copy_of_trained(template, device_mesh)
        if dist.get_rank() == failing_rank:
            corrupt(optimizer)
        error = None
        try:
            save(rdcp.GefenDCPState(optimizer), os.path.join(root, scenario), rdcp.GefenSavePlanner())
        except Exception as exc:  # the outcome is the result
            error = exc
        results.append((scenario, _outcome(error)))
    return results


def divergent_layouts(root: str) -> tuple:
    """Each rank renames one parameter differently, then all save (collective)."""
    device_mesh = mesh()
    optimizer, _, _ = trained_reference(device_mesh)
    group = optimizer.param_groups[1]
    group["param_names"] = ["dec.weight_rank%d" % dist.get_rank()] + list(group["param_names"][1:])
    error = None
    try:
        save(rdcp.GefenDCPState(optimizer), os.path.join(root, "divergent"), rdcp.GefenSavePlanner())
    except Exception as exc:
        error = exc
    return _outcome(error)


def reordered_mesh_save(root: str) -> tuple:
    """Parameters on a mesh listing the ranks backwards (collective)."""
    from torch.distributed.device_mesh import DeviceMesh

    world = dist.get_world_size()
    backwards = DeviceMesh("cpu", torch.arange(world - 1, -1, -1))
    optimizer, _, _ = trained_reference(backwards)
    error = None
    try:
        save(rdcp.GefenDCPState(optimizer), os.path.join(root, "reordered"), rdcp.GefenSavePlanner())
    except Exception as exc:
        error = exc
    return _outcome(error)
