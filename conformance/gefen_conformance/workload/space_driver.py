"""How one side is driven through an input case (SPEC 4.3.10).

:func:`starting_state` builds the native state dict both sides load (from the reference's own
``state_dict()`` of the case's groups, so names and hyperparameters are the reference's);
:func:`run` drives one side (an implementation's ``make_optimizer``, or
:data:`gefen_conformance.workload.models.REFERENCE`) through the case and records, per call, the
parameters before and after, the gradients the step had to use (unscaled, CPU), the native state
dict after, and the hyperparameters the groups held. The suite (``test_input_space.py``) judges
the records with the oracles: bitwise against the reference's run, or each call as a pinned step
from the implementation's own state (SPEC 5.6.1), so nothing accumulates however long the
counter. An implementation's tensors live on its device
(:func:`gefen_conformance.workload.models.device_for`); the records are CPU copies.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from gefen_conformance.workload.models import REFERENCE, device_for, group_hypers, state_to_cpu, to_cpu
from gefen_conformance.workload.space import (
    COLUMN_PADDING,
    DTYPES,
    GRAD_SCALE,
    GroupCase,
    InputCase,
    gradient,
    initial,
    late_group,
    registered,
    starting_codebook,
    synthesized_entry,
)

__all__ = ["Built", "CaseRun", "StepCall", "build", "grad_scale", "placed", "run", "starting_state"]


def _lr(group: GroupCase, device, case: InputCase):
    lr = 0.0 if case.schedule == "warmup" else group.lr
    if not group.tensor_lr:
        return lr
    dtype = torch.float32 if group.tensor_lr is True else DTYPES[group.tensor_lr]
    return torch.tensor(lr, dtype=dtype, device=device)


def _options(case: InputCase) -> dict:
    options = {"factored_v_2d": case.factored}
    if case.deterministic:
        options["deterministic"] = True
    for name in case.options:
        if name == "unfused":
            options["fused"] = False
        else:
            options[name] = (case.substring,) if name == "period_one_substrings" else True
    return options


def _group(case: InputCase, g: int, params: dict, device) -> dict:
    group = case.groups[g]
    return {
        "params": [(case.name(i), params[i]) for i in case.order() if case.params[i].group == g],
        "lr": _lr(group, device, case),
        "betas": group.betas,
        "eps": group.eps,
        "weight_decay": group.weight_decay,
    }


@dataclass
class Built:
    params: dict  # i -> nn.Parameter
    grad_buffers: dict  # dtype -> flat buffer for the flat-view layout's gradients
    offsets: dict  # i -> storage offset in its dtype's flat buffers
    optimizer: Any = None
    buckets: dict = field(default_factory=dict)  # dtype -> flat bucket of the bucket-grad gradients
    bucket_offsets: dict = field(default_factory=dict)  # i -> offset in its dtype's bucket
    pending: dict | None = None  # the group an add-group event registers


def _offsets(case: InputCase, layout: str, order: list, *, first: int, gap: int) -> tuple[dict, dict]:
    """Offsets of the ``layout`` parameters in flat per-dtype buffers, in ``order``: the first at
    ``first``, ``gap`` elements between views."""
    sizes: dict = {}
    offsets = {}
    for i in order:
        p = case.params[i]
        if p.layout == layout:
            start = sizes.get(p.torch_dtype, first)
            offsets[i] = start
            sizes[p.torch_dtype] = start + p.numel + gap
    return sizes, offsets


def build(case: InputCase, make_optimizer, device) -> Built:
    # flat views never at offset 0, with gaps between them; a gradient bucket packed as DDP packs it
    flat_sizes, offsets = _offsets(case, "flat-view", list(range(len(case.params))), first=3, gap=5)
    order = case.order()
    bucket_order = order[::-1] if case.grad_order == "reverse" else order
    bucket_sizes, bucket_offsets = _offsets(case, "bucket-grad", bucket_order, first=0, gap=0)
    buffers = {dtype: torch.zeros(size, dtype=dtype, device=device) for dtype, size in flat_sizes.items()}
    grad_buffers = {
        dtype: torch.zeros(size, dtype=dtype, device=device) for dtype, size in flat_sizes.items()
    }
    params = {}
    for i, p in enumerate(case.params):
        value = initial(case, i).to(device)
        if p.layout == "transposed":
            param = torch.nn.Parameter(value.t().contiguous().t())
        elif p.layout == "channels-last":
            param = torch.nn.Parameter(value.contiguous(memory_format=torch.channels_last))
        elif p.layout == "flat-view":
            view = buffers[p.torch_dtype][offsets[i] : offsets[i] + p.numel].view(p.shape)
            view.copy_(value)
            param = torch.nn.Parameter(view)
        elif p.layout == "column-slice":
            param = torch.nn.Parameter(_column_slice(value))
        else:
            param = torch.nn.Parameter(value.clone())
        param.requires_grad_(not p.frozen)
        params[i] = param
    built = Built(params, grad_buffers, offsets)
    built.buckets = {
        dtype: torch.zeros(size, dtype=dtype, device=device) for dtype, size in bucket_sizes.items()
    }
    built.bucket_offsets = bucket_offsets
    late = late_group(case)
    groups = [_group(case, g, params, device) for g in range(len(case.groups)) if g != late]
    if late is not None:
        built.pending = _group(case, late, params, device)
    built.optimizer = make_optimizer(groups, **_options(case))
    return built


def _column_slice(value: torch.Tensor) -> torch.Tensor:
    """``value`` as the slice ``wide[..., :k]`` of a buffer :data:`COLUMN_PADDING` columns wider
    (unit inner stride, padded rows)."""
    *rows, columns = value.shape
    wide = torch.zeros(*rows, columns + COLUMN_PADDING, dtype=value.dtype, device=value.device)
    return wide[..., :columns].copy_(value)


def _permuted(value: torch.Tensor) -> torch.Tensor:
    """``value`` dense in another memory order than the logical one: channels_last for 4-D,
    dimensions reversed otherwise (the transpose, for 2-D)."""
    if value.dim() == 4:
        return value.contiguous(memory_format=torch.channels_last)
    order = tuple(range(value.dim() - 1, -1, -1))
    return value.permute(order).contiguous().permute(order)


def placed(case: InputCase, built: Built, i: int, value: torch.Tensor, device) -> torch.Tensor:
    """A gradient in parameter ``i`` 's layout: strides like its parameter's, a view into the flat
    gradient buffer or a bucket, doubled strides, a slice with padded rows or another dense memory
    order."""
    p, param = case.params[i], built.params[i]
    value = value.to(device)
    if p.layout == "column-slice":
        return _column_slice(value)
    if p.layout == "padded-rows-grad":
        tall = torch.zeros(2 * value.shape[0], *value.shape[1:], dtype=value.dtype, device=device)
        return tall[::2].copy_(value)
    if p.layout == "permuted-grad":
        return _permuted(value)
    if p.layout == "flat-view":
        buffer = built.grad_buffers[p.torch_dtype]
        return buffer[built.offsets[i] : built.offsets[i] + p.numel].view(p.shape).copy_(value)
    if p.layout == "strided-grad":
        wide = torch.zeros(*p.shape, 2, dtype=value.dtype, device=device)
        return wide[..., 0].copy_(value)
    if p.layout == "bucket-grad":
        bucket, at = built.buckets[p.torch_dtype], built.bucket_offsets[i]
        return bucket[at : at + p.numel].view(p.shape).copy_(value)
    out = torch.empty_strided(param.shape, param.stride(), dtype=value.dtype, device=device)
    return out.copy_(value)


def starting_state(case: InputCase) -> dict:
    """The native state dict both sides load before the first call (SPEC 1.11): the reference's
    ``state_dict()`` of the case's groups with the case's codebook
    (:func:`gefen_conformance.workload.space.starting_codebook`: none for a codebook learned at the
    first call), global step ``case.counter``, and a synthesized entry for every parameter with a
    period."""
    built = build(case, REFERENCE, torch.device("cpu"))
    sd = built.optimizer.state_dict()
    ids = {i: pid for pid, i in enumerate(case.order()) if registered(case, i, 1)}
    sd["state"] = {
        ids[i]: (synthesized_entry(case, i) if p.period is not None else {"name": case.name(i)})
        for i, p in enumerate(case.params)
        if i in ids
    }
    codebook = starting_codebook(case)
    sd["gefen_codebook"] = None if codebook is None else codebook.clone()
    sd["gefen_global_step"] = case.counter
    for group in sd["param_groups"]:
        group.pop("_gefen_checkpoint_metadata", None)
    return state_to_cpu(sd)  # a deep copy: nothing of the built optimizer's lives on


# ---------------------------------------------------------------------------------- driving


@dataclass
class StepCall:
    """One ``step()`` call of a run. ``grads[i]``: the (unscaled) gradient parameter ``i`` had to
    step with, or None; ``hypers[g]``: group ``g`` 's values as Python floats (lr by SPEC 1.4.2)
    when the call was made; ``skipped``: ``found_inf`` was set; ``loss``: what ``step`` returned
    (the closure protocol's loss, else None)."""

    before: dict
    after: dict
    grads: dict
    state_dict: dict
    hypers: list
    skipped: bool = False
    loss: Any = None
    expected_loss: Any = None


@dataclass
class CaseRun:
    case: InputCase
    loaded: dict  # the native state dict right after the load (CPU copy)
    calls: list = field(default_factory=list)


def _apply_schedule(case: InputCase, optimizer, device, call: int) -> None:
    """SPEC 1.4.2: what a scheduler does between steps (in place for a tensor lr where the case says so)."""
    for g, group in enumerate(optimizer.param_groups):
        lr = group["lr"]
        if case.schedule == "warmup":  # groups keep the case's order: an added group comes last
            value = case.groups[g].lr * (call - 1) / (case.calls - 1)
            if torch.is_tensor(lr):
                lr.fill_(value)
            else:
                group["lr"] = value
            continue
        if case.schedule == "lr-in-place" and torch.is_tensor(lr):
            lr.mul_(0.5)
        elif torch.is_tensor(lr):
            group["lr"] = torch.tensor(float(lr.item()) * 0.5, device=lr.device)
        else:
            group["lr"] = lr * 0.5
        if case.schedule == "all":
            group["beta1"], group["beta2"] = (0.8, 0.99) if group["beta1"] != 0.8 else (0.9, 0.999)
            group["eps"] = group["eps"] * 10.0
            group["weight_decay"] = 0.1 if group["weight_decay"] == 0.0 else 0.0


def _hypers(optimizer) -> list:
    return [group_hypers(group) for group in optimizer.param_groups]


def grad_scale(case: InputCase, call: int) -> float:
    """The GradScaler protocols' scale at ``call``: :data:`GRAD_SCALE`, halved until every scaled
    gradient is finite in its dtype (a power of two, so unscaling is exact)."""
    scale = GRAD_SCALE
    for i in range(len(case.params)):
        g = gradient(case, i, call)
        while (
            g is not None and scale > 1.0 and not bool(torch.isfinite((g.double() * scale).to(g.dtype)).all())
        ):
            scale /= 2.0
    return scale


def _skipped(case: InputCase, call: int) -> bool:
    return case.protocol == "found-inf" and call == case.calls - 1


def _lifecycle(case: InputCase, built: Built, call: int) -> None:
    """The case's events before ``call`` (:data:`gefen_conformance.workload.space.EVENTS`)."""
    for at, event in case.events:
        if at != call:
            continue
        if event == "add-group":
            built.optimizer.add_param_group(built.pending)
        elif event == "replace-storage":
            with torch.no_grad():
                for p in built.params.values():
                    p.data = p.data.clone()
        elif event == "channels-last":
            with torch.no_grad():
                for p in built.params.values():
                    if p.dim() == 4:
                        p.data = p.data.contiguous(memory_format=torch.channels_last)


def run(make_optimizer, case: InputCase, state_dict: dict) -> CaseRun:
    """Drive one side through ``case`` from ``state_dict`` (:func:`starting_state`)."""
    device = device_for(make_optimizer)
    built = build(case, make_optimizer, device)
    opt, params = built.optimizer, built.params
    opt.load_state_dict(state_to_cpu(state_dict))  # a deep copy: starting_state's tensors live on CPU
    out = CaseRun(case, state_to_cpu(opt.state_dict()))
    for call in range(1, case.calls + 1):
        _lifecycle(case, built, call)
        if call > 1 and case.schedule != "constant":
            _apply_schedule(case, opt, device, call)
        grads = {i: gradient(case, i, call) for i in params}
        before = {i: to_cpu(p) for i, p in params.items()}
        hypers = _hypers(opt)
        record = StepCall(before, {}, grads, {}, hypers, skipped=_skipped(case, call))
        scale = grad_scale(case, call) if case.protocol in ("grad-scale", "found-inf") else 1.0

        def assign():
            for i, p in params.items():
                g = grads[i]
                p.grad = (
                    None if g is None else placed(case, built, i, (g.double() * scale).to(g.dtype), device)
                )

        if case.protocol == "closure":
            for i, p in params.items():  # what a previous iteration left behind
                stale = gradient(case, i, call, stale=True)
                p.grad = None if stale is None else placed(case, built, i, stale, device)
            record.expected_loss = torch.tensor(float(call))

            def closure():
                opt.zero_grad(set_to_none=True)
                assign()
                return record.expected_loss

            record.loss = opt.step(closure)
        else:
            assign()
            if case.protocol in ("grad-scale", "found-inf"):
                opt.grad_scale = torch.tensor(scale, device=device)
                opt.found_inf = torch.tensor(1.0 if record.skipped else 0.0, device=device)
            opt.step()
        record.after = {i: to_cpu(p) for i, p in params.items()}
        record.state_dict = state_to_cpu(opt.state_dict())
        out.calls.append(record)
    return out
