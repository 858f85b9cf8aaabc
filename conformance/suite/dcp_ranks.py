"""Rank bodies of the DCP scenarios (SPEC 4.3.2-4.3.7, 5.4), run with ``conformance.ranks``.

Not collected (the module name does not start with ``test_``). Every public function is module
level so the harness can pickle it by reference; each receives the ``--impl`` spec string and
resolves the implementation inside the rank with :func:`conformance.registry.resolve`. The
implementation is driven only through its :class:`~conformance.Implementation` fields and
public APIs: ``optimizer.step``, ``dcp.save`` / ``dcp.load`` / ``dcp.async_save`` of
``impl.dcp_state(optimizer)``, ``impl.save_planner()`` and ``impl.async_writer(path)``.

The workload: a small two-group model of ``Shard(0)`` DTensors on the 1-D CPU mesh with stable
names, trained ``STEPS`` steps on gradients seeded by ``(name, step)``.

* ``base``: ``enc.weight`` (8, 24) with per-column gradient scales (structure for the period
  search), ``enc.bias`` (24,), ``dec.weight`` (7, 12), which splits unevenly on 2, 3 and 4
  ranks (4/3, 3/3/1, 2/2/2/1) without ever leaving a shard empty, and ``head.weight`` (16, 8),
  which never gets a gradient (a fresh slot);
* ``empty``: ``base`` plus ``tiny.weight`` (2, 8), whose shard is empty on ranks 2-3 of 4.
"""

from __future__ import annotations

import os
import zlib

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from conformance import registry
from conformance.sharding import shard, sharded_parameter, world_mesh

STEPS = 3
BASE = {
    "enc.weight": ((8, 24), 0),
    "enc.bias": ((24,), 0),
    "dec.weight": ((7, 12), 1),
    "head.weight": ((16, 8), 1),
}
MODELS = {"base": BASE, "empty": dict(BASE, **{"tiny.weight": ((2, 8), 1)})}
FRESH = "head.weight"
STRUCTURED = "enc.weight"
# Saved hyperparameters per group, and deliberately different ones for restore targets, so a
# restore that forgot the checkpoint's hyperparameters shows.
GROUP_HYPERS = (
    dict(lr=5e-3, betas=(0.8, 0.97), eps=2e-8, weight_decay=0.03),
    dict(lr=4e-3, betas=(0.85, 0.99), eps=1e-8, weight_decay=0.01),
)
TARGET_HYPERS = (
    dict(lr=9.9e-9, betas=(0.1, 0.2), eps=7e-7, weight_decay=0.5),
    dict(lr=8.8e-9, betas=(0.3, 0.4), eps=6e-7, weight_decay=0.25),
)
SAVED_HYPERS = [
    {"lr": g["lr"], "beta1": g["betas"][0], "beta2": g["betas"][1], "eps": g["eps"], "weight_decay": g["weight_decay"]}
    for g in GROUP_HYPERS
]


# ------------------------------------------------------------------------------ workload


def _seeded(name: str, shape, salt) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(zlib.crc32(f"{name}:{salt}".encode())))


def initial(name: str, shape, salt: str = "init") -> torch.Tensor:
    return _seeded(name, shape, salt)


def gradient(name: str, shape, step: int) -> torch.Tensor:
    g = _seeded(name, shape, f"grad{step}")
    if name == STRUCTURED:
        g = g * (1.0 + torch.arange(shape[-1], dtype=torch.float32) % 4)
    return g


def make_params(model: str, mesh, salt: str = "init") -> dict:
    return {n: sharded_parameter(initial(n, shape, salt), mesh) for n, (shape, _) in MODELS[model].items()}


def groups(model: str, params: dict, hypers=GROUP_HYPERS) -> list:
    return [
        dict(hypers[g], params=[(n, params[n]) for n, (_, group) in MODELS[model].items() if group == g])
        for g in range(len(hypers))
    ]


def build(impl, model: str, params: dict, hypers=GROUP_HYPERS, **options):
    options.setdefault("factored_v_2d", False)
    return impl.make_optimizer(groups(model, params, hypers), **options)


def set_gradients(model: str, params: dict, step: int, mesh) -> None:
    for name, (shape, _) in MODELS[model].items():
        params[name].grad = None if name == FRESH else shard(gradient(name, shape, step), mesh)


def train(model: str, optimizer, params: dict, mesh, steps=range(1, STEPS + 1)) -> None:
    for step in steps:
        set_gradients(model, params, step, mesh)
        optimizer.step()


def trained(impl, model: str, mesh, **options):
    params = make_params(model, mesh)
    optimizer = build(impl, model, params, **options)
    train(model, optimizer, params, mesh)
    return params, optimizer


def full_params(params: dict) -> dict:
    """Every parameter's global value (a collective)."""
    return {n: p.detach().full_tensor().clone() for n, p in params.items()}


def local(p) -> torch.Tensor:
    return p.detach().to_local()


def planner_of(impl):
    return impl.save_planner() if impl.save_planner is not None else None


def save(impl, optimizer, path: str, params: dict | None = None, planner: bool = True, writer=None) -> None:
    """``dcp.save`` of the optimizer (and the model when ``params`` is given) through the adapter."""
    state = {"optimizer": impl.dcp_state(optimizer)}
    if params is not None:
        state = {"model": dict(params), **state}
    kwargs = {"storage_writer": writer} if writer is not None else {"checkpoint_id": path}
    dcp.save(state, planner=planner_of(impl) if planner else None, **kwargs)


def load(impl, optimizer, path: str, params: dict | None = None) -> None:
    state = {"optimizer": impl.dcp_state(optimizer)}
    if params is not None:
        state = {"model": dict(params), **state}
    dcp.load(state, checkpoint_id=path)


def _error(exc: BaseException) -> dict:
    return {"type": type(exc).__name__, "mro": [c.__name__ for c in type(exc).__mro__], "message": str(exc)}


# ------------------------------------------------------------------------------ saving


def save_trained(spec: str, model: str, path: str) -> dict:
    """Train ``model`` with the implementation and save model and optimizer; the saved full params."""
    impl = registry.resolve(spec)
    mesh = world_mesh()
    params, optimizer = trained(impl, model, mesh)
    save(impl, optimizer, path, params)
    return full_params(params)


# ----------------------------------------------------------------------------- restoring


def restore_report(spec: str, model: str, path: str, resave_path: str) -> dict:
    """Restore ``path`` at this world size with the implementation ``spec`` and report (collective).

    1. A native run: the same implementation trained from scratch here on the same gradient
       stream for steps 1..K, its local parameters recorded, then step K+1.
    2. A fresh optimizer (other hyperparameters, other parameter values) restored with
       ``dcp.load`` of model and optimizer; its full parameters are reported.
    3. The restored state saved again at once with the implementation's adapter to
       ``resave_path`` (read back by the test through the independent reader).
    4. The continuation: the restored parameters are set to the native run's after step K and
       one step is taken on gradient K+1; the max-abs difference from the native run after step
       K+1 is reported per parameter (SPEC 3.7.3).
    A failed load is reported (type, message) instead of 2-4.
    """
    impl = registry.resolve(spec)
    mesh = world_mesh()
    native_params, native = trained(impl, model, mesh)
    before = {n: local(p).clone() for n, p in native_params.items()}
    train(model, native, native_params, mesh, steps=[STEPS + 1])
    after = {n: local(p).clone() for n, p in native_params.items()}

    params = make_params(model, mesh, salt="target")
    optimizer = build(impl, model, params, hypers=TARGET_HYPERS)
    try:
        load(impl, optimizer, path, params)
    except Exception as exc:  # the outcome is the result
        return {"load_error": _error(exc)}
    report = {"load_error": None, "full_params": full_params(params)}
    try:
        save(impl, optimizer, resave_path, params)
        report["resave_error"] = None
    except Exception as exc:  # reported; the continuation still runs
        report["resave_error"] = _error(exc)
    with torch.no_grad():
        for n, p in params.items():
            p.to_local().copy_(before[n])
    train(model, optimizer, params, mesh, steps=[STEPS + 1])
    report["continuation"] = {
        n: float((local(p) - after[n]).abs().max()) if after[n].numel() else 0.0 for n, p in params.items()
    }
    # Teeth of the bound: the same step from the same parameters by an optimizer that restored
    # nothing (only its hyperparameters set to the saved ones).
    blank_params = make_params(model, mesh, salt="blank")
    blank = build(impl, model, blank_params)
    with torch.no_grad():
        for n, p in blank_params.items():
            p.to_local().copy_(before[n])
    train(model, blank, blank_params, mesh, steps=[STEPS + 1])
    report["unrestored"] = {
        n: float((local(p) - after[n]).abs().max()) if after[n].numel() else 0.0 for n, p in blank_params.items()
    }
    return report


# ------------------------------------------------------------------------- failures


def save_with_divergent_layout(spec: str, path: str, how: str, odd_rank: int = 1):
    """Every rank saves; ``odd_rank`` built its optimizer with a different layout (SPEC 2.3.5, 2.4.1).
    Returns the save's error on this rank (None if it succeeded).

    ``how`` is "renamed" (one parameter named differently: same slot count, different identity)
    or "unnamed" (plain parameters, so the optimizer synthesizes the names).
    """
    impl = registry.resolve(spec)
    mesh = world_mesh()
    params = make_params("base", mesh)
    if dist.get_rank() == odd_rank and how == "renamed":
        renamed = {("dec.weight.rank%d" % odd_rank if n == "dec.weight" else n): p for n, p in params.items()}
        layout = [
            dict(GROUP_HYPERS[g], params=[(n, p) for n, p in renamed.items() if BASE[n.split(".rank")[0]][1] == g])
            for g in range(2)
        ]
        optimizer = impl.make_optimizer(layout, factored_v_2d=False)
    elif dist.get_rank() == odd_rank and how == "unnamed":
        layout = [
            dict(GROUP_HYPERS[g], params=[p for n, p in params.items() if BASE[n][1] == g]) for g in range(2)
        ]
        optimizer = impl.make_optimizer(layout, factored_v_2d=False)
    else:
        optimizer = build(impl, "base", params)
    train("base", optimizer, params, mesh)
    try:
        save(impl, optimizer, path, params)
    except Exception as exc:  # the outcome is the result (a rank that returns stays warm for the next call)
        return _error(exc)
    return None


def failing_load(spec: str, path: str, before_dir: str, after_dir: str, odd_rank: int = 1):
    """A load that one rank refuses: ``odd_rank`` built its optimizer with ``deterministic=True``
    while the checkpoint says False (SPEC 3.3.7). The live state (trained one step of its own,
    target hyperparameters), model included, is saved before and after the attempt; returns
    the load's error."""
    impl = registry.resolve(spec)
    mesh = world_mesh()
    params = make_params("base", mesh, salt="target")
    optimizer = build(impl, "base", params, hypers=TARGET_HYPERS, deterministic=dist.get_rank() == odd_rank)
    train("base", optimizer, params, mesh, steps=[7])
    save(impl, optimizer, before_dir, params)
    error = None
    try:
        # the optimizer only: DCP itself copies model entries into the parameters before the
        # adapter sees anything, so the adapter's fail-atomicity covers the optimizer
        load(impl, optimizer, path)
    except Exception as exc:  # the outcome is the result
        error = _error(exc)
    save(impl, optimizer, after_dir, params)
    return error


class DyingWriter(dcp.FileSystemWriter):
    """DCP's ``FileSystemWriter`` whose rank ``victim`` writes its payload, then dies (``os._exit``)
    before reporting its write results, i.e. before any rank can commit ``.metadata``."""

    def __init__(self, path: str, victim: int):
        super().__init__(path)
        self.victim = victim

    def write_data(self, plan, planner):
        future = super().write_data(plan, planner)
        if dist.get_rank() == self.victim:
            future.wait()
            os._exit(17)
        return future


def killed_save(spec: str, path: str, victim: int = 1) -> None:
    """Train and save with rank ``victim`` killed in the middle of the save (collective)."""
    impl = registry.resolve(spec)
    mesh = world_mesh()
    params, optimizer = trained(impl, "base", mesh)
    train("base", optimizer, params, mesh, steps=[STEPS + 1])
    save(impl, optimizer, path, params, writer=DyingWriter(path, victim))


def load_and_continue(spec: str, path: str) -> dict:
    """Restore ``path`` into a fresh optimizer and take one more step (collective)."""
    impl = registry.resolve(spec)
    mesh = world_mesh()
    params = make_params("base", mesh, salt="target")
    optimizer = build(impl, "base", params, hypers=TARGET_HYPERS)
    load(impl, optimizer, path, params)
    restored = full_params(params)
    train("base", optimizer, params, mesh, steps=[STEPS + 1])
    stepped = full_params(params)
    finite = all(bool(torch.isfinite(v).all()) for v in stepped.values())
    return {"restored": restored, "moved": any(not torch.equal(restored[n], stepped[n]) for n in restored), "finite": finite}


# -------------------------------------------------------------------- payload identity


def payload_saves(spec: str, model: str, root: str, with_reference: bool):
    """Save one trained state several ways under ``root`` (collective; optimizer only):

    ``impl_planned`` and ``impl_planned_again`` with ``impl.save_planner()``, ``impl_default``
    with DCP's default planner and, when ``with_reference``, ``reference`` from the reference
    trained on identical gradients and saved with its own adapter and planner. Returns the
    largest gap between adjacent codewords of the reference's codebook on this rank (a checkpoint
    carries no codebook; SPEC 5.6.11 needs it), or None.
    """
    impl = registry.resolve(spec)
    mesh = world_mesh()
    _, optimizer = trained(impl, model, mesh)
    save(impl, optimizer, os.path.join(root, "impl_planned"))
    save(impl, optimizer, os.path.join(root, "impl_planned_again"))
    save(impl, optimizer, os.path.join(root, "impl_default"), planner=False)
    if with_reference:
        ref = registry.resolve("reference")
        _, ref_optimizer = trained(ref, model, mesh)
        save(ref, ref_optimizer, os.path.join(root, "reference"))
        return largest_codeword_gap(ref_optimizer.codebook)
    return None


def largest_codeword_gap(codebook) -> float | None:
    """The largest gap between adjacent codewords (None without a codebook)."""
    if codebook is None:
        return None
    cb = codebook.detach().cpu().double()
    return float((cb[1:] - cb[:-1]).max())


# ------------------------------------------------------------------------------- async


def _wait(response):
    return getattr(response, "upload_completion", response).result(timeout=60)


def async_snapshot(spec: str, root: str) -> dict:
    """SPEC 2.6.1: a synchronous save, then ``dcp.async_save`` with ``impl.async_writer``, an
    optimizer step before the background write may start, the wait, and a synchronous save
    after the step (collective). The background write is held until the step is done."""
    import threading

    impl = registry.resolve(spec)
    mesh = world_mesh()
    params, optimizer = trained(impl, "base", mesh)
    save(impl, optimizer, os.path.join(root, "sync_before"))
    writer = impl.async_writer(os.path.join(root, "async"))
    gate = threading.Event()
    write_data = writer.write_data

    gated = []

    def gated_write_data(plan, planner):
        gated.append(gate.is_set())
        if not gate.wait(30):
            raise RuntimeError("the test never opened the gate")
        return write_data(plan, planner)

    writer.write_data = gated_write_data
    # The next gradients are sharded now: sharding is a collective, and the background save runs
    # its own collectives on the default group while the step is taken.
    set_gradients("base", params, STEPS + 1, mesh)
    response = dcp.async_save({"optimizer": impl.dcp_state(optimizer)}, storage_writer=writer,
                              planner=planner_of(impl))
    try:
        optimizer.step()
    finally:
        gate.set()
    _wait(response)
    save(impl, optimizer, os.path.join(root, "sync_after"))
    return {"write_data_calls": len(gated)}


def async_with_default_writer(spec: str, path: str):
    """SPEC 2.6.2: ``dcp.async_save`` of the adapter with DCP's default ``FileSystemWriter``."""
    impl = registry.resolve(spec)
    mesh = world_mesh()
    _, optimizer = trained(impl, "base", mesh)
    try:
        _wait(dcp.async_save({"optimizer": impl.dcp_state(optimizer)}, storage_writer=dcp.FileSystemWriter(path)))
    except Exception as exc:  # the outcome is the result
        return _error(exc)
    return None


# ------------------------------------------------------------------------------ memory

MEMORY_SHAPES = {f"layer{i}.weight": (64, 64) for i in range(8)}


def planned_save_peak(spec: str, root: str) -> dict:
    """SPEC 5.4.2 at world size 1: the peak extra bytes (``oracles.memory.StorageTracker``) of a
    save of the adapter with ``impl.save_planner()``, and the same with DCP's default planner.

    DCP's ``FileSystemWriter`` keeps every tensor it wrote until the file it wrote it to is closed
    (SPEC 2.5.3), so with one payload file per rank it would hold every slot whatever the planner
    does. The measured saves use ``single_file_per_rank=False`` (one file per item): the writer
    then holds one item at a time and the peak is the planner's. A standard save of the same
    state is written too, for the test to compare contents. Gradients are multiples of 1/8 so
    codebook learning sees few distinct values (cheap).
    """
    from oracles.memory import StorageTracker

    impl = registry.resolve(spec)
    mesh = world_mesh()
    params = {n: sharded_parameter(initial(n, s), mesh) for n, s in MEMORY_SHAPES.items()}
    names = list(params)
    optimizer = impl.make_optimizer(
        [dict(GROUP_HYPERS[0], params=[(n, params[n]) for n in names[:2]]),
         dict(GROUP_HYPERS[1], params=[(n, params[n]) for n in names[2:]])],
        factored_v_2d=False,
    )
    for step in (1, 2):
        for n, s in MEMORY_SHAPES.items():
            params[n].grad = shard(torch.round(gradient(n, s, step) * 8) / 8, mesh)
        optimizer.step()
    save(impl, optimizer, os.path.join(root, "standard"))
    peaks = {}
    for name, planner in (("planned", planner_of(impl)), ("default", None)):
        writer = dcp.FileSystemWriter(os.path.join(root, name), single_file_per_rank=False)
        state = {"optimizer": impl.dcp_state(optimizer)}
        tracker = StorageTracker()
        with tracker:
            dcp.save(state, storage_writer=writer, planner=planner)
        del state, writer
        peaks[name] = tracker.peak_bytes
    return peaks
