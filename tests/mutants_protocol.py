"""Mutants of the optimizer's calling protocol (GradScaler, closures, zero_grad, hyperparameter
changes, state_dict), in the catalogue of tests/mutants.py.

``ENTRIES`` maps a mutant's name to its :class:`tests.mutants.Entry`; tests/mutants.py adds them to
``CATALOGUE`` (and their ``--impl`` spec strings); ``SLOW`` names those whose selections are slow.

Each is a kernel backend written as examples/gefen-fast is (a ``gefen_reference.Gefen`` subclass
declaring the reference's state layout, or one built on a cloned module of the reference), with
one bug real backends have had in how they are called. Only the calling-protocol scenarios
(``gefen_conformance.suite.test_calling_protocol``, SPEC 4.3.13) catch them, each in both profiles.
"""

from __future__ import annotations

import torch

import gefen_reference.native_state as native_state
import gefen_reference.optimizer as optimizer_module
from gefen_reference.native_state import local_tensor

from .mutant_tools import clone
from .mutants import _Backend, _backend_entries


def _with_closure(closure):
    """Run ``closure`` as step() does (SPEC 1.10.1 step 1): under ``enable_grad``, first."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()


def _saved_entries(optimizer, state_dict):
    """``(live parameter, key, saved value)`` of every saved state entry, paired by position."""
    saved = state_dict.get("state") or {}
    for saved_group, group in zip(state_dict["param_groups"], optimizer.param_groups):
        for sid, p in zip(saved_group["params"], group["params"]):
            for key, value in (saved.get(sid) or {}).items():
                yield p, key, value


class _ZeroFirstGradientsLearnNothing(_Backend):
    """Codebook learning: a first step whose gradients are all zero is taken for "no data yet"
    (the next step would learn from real gradients), and with no codebook to quantize with the
    step only counts itself. SPEC 1.6.7 learns the padding codebook from the zeros and steps:
    periods, state, counters, weight decay."""

    @torch.no_grad()
    def step(self, closure=None):
        if self.codebook is not None:
            return super().step(closure)
        loss = _with_closure(closure)
        grads = [local_tensor(p.grad) for _, _, p in self.named_params() if p.grad is not None]
        grads = [g for g in grads if g.numel()]
        if grads and not any(bool(g.any()) for g in grads):
            self.global_step += 1
            return loss
        super().step()
        return loss


class _FoundInfComparedWithOne(_Backend):
    """GradScaler: the skip test is ``found_inf == 1.0``; GradScaler passes the sum of its
    per-device flags, so with infs on two devices (2.0) the overflowed step is applied."""

    def step(self, closure=None):
        found_inf = getattr(self, "found_inf", None)
        if found_inf is None or float(found_inf) == 1.0:
            return super().step(closure)
        self.found_inf = torch.zeros_like(found_inf) if torch.is_tensor(found_inf) else 0.0
        try:
            return super().step(closure)
        finally:
            self.found_inf = found_inf


class _FoundInfOnlyWithScale(_Backend):
    """GradScaler: ``found_inf`` is read only in the unscaling branch, when ``grad_scale`` is set;
    after ``scaler.unscale_(opt)`` (to clip) GradScaler passes ``grad_scale = None``, and the
    overflowed step is applied."""

    def step(self, closure=None):
        if getattr(self, "grad_scale", None) is not None or getattr(self, "found_inf", None) is None:
            return super().step(closure)
        found_inf = self.found_inf
        del self.found_inf
        try:
            return super().step(closure)
        finally:
            self.found_inf = found_inf


class _UnscaledOnRead(_Backend):
    """GradScaler: the kernel multiplies each gradient by ``1/scale`` as it reads it instead of
    unscaling ``.grad`` in place (SPEC 1.10.4): the step is right, but ``.grad`` is still scaled
    afterwards (clipping or logging after ``step`` sees it scaled)."""

    def step(self, closure=None):
        scale, found_inf = getattr(self, "grad_scale", None), getattr(self, "found_inf", None)
        if scale is None or (found_inf is not None and bool(found_inf)):
            return super().step(closure)
        loss = _with_closure(closure)
        inverse = torch.tensor(float(scale), dtype=torch.float64).reciprocal().float()
        originals = [(p, p.grad) for _, _, p in self.named_params() if p.grad is not None]
        for p, g in originals:
            p.grad = g * inverse.to(g.device)
        del self.grad_scale
        try:
            super().step()
        finally:
            self.grad_scale = scale
            for p, g in originals:
                p.grad = g
        return loss


class _InverseScaleInHalf(_UnscaledOnRead):
    """GradScaler: the inverse scale is formed in fp16, as an fp16 kernel forms its constants, and
    ``.grad`` is unscaled in place by it (SPEC 1.10.4 asks for ``r32(1 / double(scale))``). Exact
    for a power of two, as GradScaler's default scale is; off by up to 2^-11 relative for any other
    ``init_scale`` or growth factor."""

    def step(self, closure=None):
        scale, found_inf = getattr(self, "grad_scale", None), getattr(self, "found_inf", None)
        if scale is None or (found_inf is not None and bool(found_inf)):
            return super(_UnscaledOnRead, self).step(closure)
        loss = _with_closure(closure)
        inverse = torch.tensor(float(scale), dtype=torch.float16).reciprocal().float()
        for _, _, p in self.named_params():
            if p.grad is not None:
                p.grad.mul_(inverse.to(p.grad.device))
        del self.grad_scale
        try:
            super(_UnscaledOnRead, self).step()
        finally:
            self.grad_scale = scale
        return loss


class _SkipReturnsNone(_Backend):
    """GradScaler: an overflow skip returns None instead of the closure's loss (SPEC 1.10.11)."""

    def step(self, closure=None):
        loss = super().step(closure)
        found_inf = getattr(self, "found_inf", None)
        return None if found_inf is not None and bool(found_inf) else loss


class _ZeroGradInPlace(_Backend):
    """zero_grad: a foreach zeroing kernel that ignores ``set_to_none``: gradients become zeros
    instead of None, so a parameter that gets no new gradient afterwards (frozen, an unrouted
    expert) steps with a zero gradient (counters advance, weight decay and momentum apply)."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        grads = [p.grad for _, _, p in self.named_params() if p.grad is not None]
        for g in grads:
            if g.grad_fn is not None:
                g.detach_()
            else:
                g.requires_grad_(False)
        if grads:
            torch._foreach_zero_(grads)


class _ClosureUnderNoGrad(_Backend):
    """Closure: the step runs under ``no_grad`` and calls the closure without re-enabling grad, so
    a closure that runs a forward pass and ``backward()`` fails (SPEC 1.10.1 step 1)."""

    def step(self, closure=None):
        if closure is None:
            return super().step()

        def under_no_grad():
            with torch.no_grad():
                return closure()

        return super().step(under_no_grad)


class _GroupConstantsKeyedByLr(_Backend):
    """Hyperparameters: per-group constants (betas, eps, weight decay and what derives from them)
    are cached by group index and refreshed only when the group's lr changes, as if only lr
    schedulers touched a group: a beta2 warm-up, a weight-decay schedule or a load of other betas
    with the same lr has no effect (SPEC 1.10.13)."""

    def update_parameters(self, updates):
        cache = self.__dict__.setdefault("_group_constants", {})
        index = {id(p): i for i, g in enumerate(self.param_groups) for p in g["params"]}
        for u in updates:
            kept = cache.get(index[id(u.param)])
            if kept is None or kept.lr != u.hyper.lr:
                kept = cache[index[id(u.param)]] = u.hyper
            self.update_parameter(u.param, u.grad, u.state, kept, u.factored)


class _TensorLrKeyedByVersion(_Backend):
    """Tensor lr: read once (a device sync avoided) and cached with the tensor's ``_version``; a
    write that bypasses the version counter (``lr.data.mul_``, a DLPack or numpy alias) is never
    seen (SPEC 1.4.2)."""

    def update_parameters(self, updates):
        from dataclasses import replace

        cache = self.__dict__.setdefault("_lr_seen", {})
        group_of = {id(p): g for g in self.param_groups for p in g["params"]}
        for u in updates:
            lr, hyper = group_of[id(u.param)]["lr"], u.hyper
            if torch.is_tensor(lr):
                kept = cache.get(id(lr))
                if kept is None or kept[0] is not lr or kept[1] != lr._version:
                    kept = cache[id(lr)] = (lr, lr._version, hyper.lr)
                hyper = replace(hyper, lr=kept[2])
            self.update_parameter(u.param, u.grad, u.state, hyper, u.factored)


#: The reference's native state dict without its compaction (SPEC 1.11.5).
_uncompacted = clone(native_state, _compact=lambda value: value)


class _StateInOneArena(clone(optimizer_module, native_state=_uncompacted).Gefen):
    """State layout: every parameter's per-block state (indices, magnitudes, block second moments)
    lives in one flat arena per dtype, ``state`` holding views into it, and ``state_dict()`` packs
    the state as it is (SPEC 1.11.5: views are copied into compact tensors): each returned tensor
    drags the whole arena along."""

    KEYS = ("m_codebook", "m_magnitude", "vmean")

    def update_parameters(self, updates):
        super().update_parameters(updates)
        held = [(e, k) for e in self.state.values() for k in self.KEYS if torch.is_tensor(e.get(k))]
        if all(e[k]._base is not None for e, k in held):
            return
        by_kind = {}
        for e, k in held:
            by_kind.setdefault((e[k].dtype, e[k].device), []).append((e, k))
        for (dtype, device), items in by_kind.items():
            arena = torch.empty(sum(e[k].numel() for e, k in items), dtype=dtype, device=device)
            at = 0
            for e, k in items:
                n = e[k].numel()
                view = arena[at : at + n].view(e[k].shape)
                view.copy_(e[k])
                e[k], at = view, at + n


class _LoadKeepsCallersTensors(_Backend):
    """Native load: each saved tensor is moved with ``.to(device)``, as torch's
    ``Optimizer.load_state_dict`` moves state, and ``.to`` returns the tensor itself when it is
    already there: the optimizer's state is the caller's tensors, so the caller's later changes
    reach the optimizer and the optimizer's steps write into the caller's dict (SPEC 1.12.8, 1.12.9)."""

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        for p, key, value in _saved_entries(self, state_dict):
            if torch.is_tensor(value) and torch.is_tensor(self.state[p].get(key)):
                self.state[p][key] = value.to(local_tensor(p).device)
        codebook = state_dict.get("gefen_codebook")
        if torch.is_tensor(codebook):
            self.codebook = codebook.to(self.codebook.device)


class _GradScaleReadAsTensorOnly(_Backend):
    """GradScaler: the attributes are read only when they are tensors (as torch's GradScaler sets
    them); a loss scaler that sets Python numbers (``opt.grad_scale = 1024.0``) is ignored and the
    gradients stay scaled (SPEC 1.10.3 takes either)."""

    def _apply_grad_scaler(self):
        scale = getattr(self, "grad_scale", None)
        if scale is None or torch.is_tensor(scale):
            return super()._apply_grad_scaler()
        self.grad_scale = None
        try:
            return super()._apply_grad_scaler()
        finally:
            self.grad_scale = scale


class _HyperparametersCachedByIdentity(_Backend):
    """Hyperparameters: each group's betas, eps and weight decay are copied into a constant buffer
    once, the copy keyed on the values' identity for tensors (a CUDA-graph-style constant cache), so
    a tensor hyperparameter changed in place keeps its first value (SPEC 1.10.13)."""

    def update_parameters(self, updates):
        cache = self.__dict__.setdefault("_constants", {})
        out = []
        for u in updates:
            h = u.hyper
            values = (h.beta1, h.beta2, h.eps, h.weight_decay)
            key = tuple(("tensor", id(v)) if torch.is_tensor(v) else ("float", v) for v in values)
            if key not in cache:
                cache[key] = (values, tuple(v.detach().clone() if torch.is_tensor(v) else v for v in values))
            b1, b2, eps, wd = cache[key][1]
            hyper = type(h)(lr=h.lr, beta1=b1, beta2=b2, eps=eps, weight_decay=wd)
            out.append(type(u)(u.name, u.param, u.grad, u.state, hyper, u.factored))
        super().update_parameters(out)


class _LoadedTensorCountersKept(_Backend):
    """Native load: counters that arrive as one-element tensors are kept as fp32 tensors, the way
    torch.optim's Adam keeps ``state['step']``, instead of becoming Python ints (SPEC 1.12.4 item
    1); they stop counting at 2^24 and ``state_dict()`` returns tensors."""

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        for p, key, value in _saved_entries(self, state_dict):
            if key in ("step", "vmean_step", "factored_step") and torch.is_tensor(value):
                self.state[p][key] = torch.tensor(float(self.state[p][key]), dtype=torch.float32)


class _LoadedIdsBySortOrder(_Backend):
    """Native load: the k-th smallest saved id is mapped to the k-th parameter (a converter that
    rebuilds ids as ``range(n)`` after sorting), not saved group ``j``, position ``i`` to live group
    ``j``, position ``i`` (SPEC 1.12.3 item 2): right for ids in ascending order only."""

    def load_state_dict(self, state_dict):
        groups = [dict(g) for g in state_dict["param_groups"]]
        ordered = sorted(i for g in groups for i in g["params"])
        start = 0
        for g in groups:
            g["params"], start = ordered[start : start + len(g["params"])], start + len(g["params"])
        super().load_state_dict(dict(state_dict, param_groups=groups))


class _LoadPreHookResultDropped(_Backend):
    """Native load re-implemented to stage the backend's own buffers: the load pre-hooks run for
    their side effects only, a hook's returned dict is dropped (SPEC 1.12.13)."""

    def load_state_dict(self, state_dict):
        hooks = self._optimizer_load_state_dict_pre_hooks
        for hook in list(hooks.values()):
            hook(self, state_dict)
        self._optimizer_load_state_dict_pre_hooks = type(hooks)()
        try:
            super().load_state_dict(state_dict)
        finally:
            self._optimizer_load_state_dict_pre_hooks = hooks


class _GroupKeysOfAFixedSchema(_Backend):
    """State dict: the groups are serialized through the keys the backend knows (a fused wrapper
    rebuilding its groups from its own table): a caller's keys (a scheduler's ``initial_lr``, a
    layer-wise decay's ``layer_id``) are dropped (SPEC 1.11.2 keeps them)."""

    def state_dict(self):
        sd = dict(super().state_dict())
        known = {"params", "param_names", "param_names_synthesized", "name", *self.defaults}
        sd["param_groups"] = [
            {k: v for k, v in g.items() if k in known or k.startswith("gefen")} for g in sd["param_groups"]
        ]
        return sd


class _IndicesReadRowMajor(_Backend):
    """State layout: the kernel indexes ``m_codebook`` through its data pointer as the row-major
    tensor it allocates itself; a load that kept a checkpoint's column-major strides is read in
    another element order (SPEC 1.12.8 loads values, not layouts)."""

    def update_parameter(self, p, grad, state, hyper, factored):
        t = state.get("m_codebook")
        if t is None or t.is_contiguous():
            return super().update_parameter(p, grad, state, hyper, factored)
        state["m_codebook"] = torch.as_strided(t, t.shape, (t.shape[1], 1), t.storage_offset())
        try:
            super().update_parameter(p, grad, state, hyper, factored)
        finally:
            state["m_codebook"] = t


class _GroupsPairedByName(_Backend):
    """Native load: when every saved and live group carries a ``name``, groups are paired by name
    (a "match groups by name" convenience), not by position as SPEC 1.12.3 item 2 and torch pair
    them."""

    def load_state_dict(self, state_dict):
        groups, live = state_dict["param_groups"], [g.get("name") for g in self.param_groups]
        saved = [g.get("name") for g in groups]
        if None in saved or None in live or sorted(saved) != sorted(live) or saved == live:
            return super().load_state_dict(state_dict)
        reordered, state, next_id = [], {}, 0
        for name in live:
            group = dict(groups[saved.index(name)])
            ids = []
            for pid in group["params"]:
                if pid in state_dict["state"]:
                    state[next_id] = state_dict["state"][pid]
                ids.append(next_id)
                next_id += 1
            reordered.append(dict(group, params=ids))
        super().load_state_dict(dict(state_dict, param_groups=reordered, state=state))


#: name -> (class, clause, selection, bug)
_MUTANTS = {
    "zero-first-gradients-learn-nothing": (
        _ZeroFirstGradientsLearnNothing,
        "1.6.1",
        "all_zero_first_gradients",
        "all-zero first gradients learn no codebook and the step does nothing",
    ),
    "found-inf-compared-with-one": (
        _FoundInfComparedWithOne,
        "1.10.3",
        "found_inf_skips",
        "found_inf = 2.0 (infs on two devices) does not skip the step",
    ),
    "found-inf-only-with-grad-scale": (
        _FoundInfOnlyWithScale,
        "1.10.3",
        "found_inf_skips",
        "found_inf ignored when grad_scale is None (after scaler.unscale_)",
    ),
    "grad-unscaled-on-read": (
        _UnscaledOnRead,
        "1.10.4",
        "grad_scale_unscales",
        ".grad left scaled after the step (unscaled on read)",
    ),
    "inverse-scale-in-half": (
        _InverseScaleInHalf,
        "1.10.4",
        "no_power_of_two",
        "the inverse of a GradScaler scale formed in fp16",
    ),
    "skip-returns-none": (
        _SkipReturnsNone,
        "1.10.11",
        "found_inf_skips",
        "a found_inf skip returns None, not the closure's loss",
    ),
    "zero-grad-in-place": (
        _ZeroGradInPlace,
        "1.10.11",
        "zero_grad_then",
        "zero_grad ignores set_to_none: parameters without a new gradient step with zeros",
    ),
    "closure-under-no-grad": (
        _ClosureUnderNoGrad,
        "1.10.1#1",
        "closure_runs_forward",
        "the closure runs under no_grad: its backward() fails",
    ),
    "group-constants-keyed-by-lr": (
        _GroupConstantsKeyedByLr,
        "1.10.13",
        "hyperparameter_change_alone",
        "betas, eps and weight decay refreshed only when lr changes",
    ),
    "tensor-lr-keyed-by-version": (
        _TensorLrKeyedByVersion,
        "1.4.2",
        "tensor_lr_written_through",
        "a tensor lr re-read only when its _version moves",
    ),
    "state-in-one-arena": (
        _StateInOneArena,
        "1.11.5",
        "state_dict_tensors_are_compact",
        "state_dict() returns views into one flat state arena",
    ),
    "load-keeps-callers-tensors": (
        _LoadKeepsCallersTensors,
        "1.12.8",
        "load_copies_the_callers",
        "a native load keeps the caller's tensors as the optimizer's state",
    ),
    "grad-scale-read-as-tensor-only": (
        _GradScaleReadAsTensorOnly,
        "1.10.3",
        "grad_scale_unscales",
        "grad_scale given as a Python float is ignored: the gradients stay scaled",
    ),
    "hyperparameters-cached-by-identity": (
        _HyperparametersCachedByIdentity,
        "1.10.13",
        "tensor_hyperparameter_changed",
        "betas, eps and weight decay cached by tensor identity: an in-place change is not seen",
    ),
    "loaded-tensor-counters-kept": (
        _LoadedTensorCountersKept,
        "1.12.4",
        "load_of_another_checkpoint_form",
        "counters loaded as tensors stay fp32 tensors instead of becoming Python ints",
    ),
    "loaded-ids-by-sort-order": (
        _LoadedIdsBySortOrder,
        "1.12.3",
        "load_of_another_checkpoint_form",
        "a native load maps saved ids by their sorted order, not by position",
    ),
    "group-keys-of-a-fixed-schema": (
        _GroupKeysOfAFixedSchema,
        "1.11.2",
        "load_of_another_checkpoint_form",
        "state_dict() drops a caller's group keys (initial_lr, layer_id)",
    ),
    "indices-read-row-major": (
        _IndicesReadRowMajor,
        "1.12.8",
        "load_of_another_checkpoint_form",
        "loaded column-major indices are read as row-major through the data pointer",
    ),
    "groups-paired-by-name": (
        _GroupsPairedByName,
        "1.12.3",
        "load_of_another_checkpoint_form",
        "a native load pairs named groups by name instead of by position",
    ),
    "load-pre-hook-result-dropped": (
        _LoadPreHookResultDropped,
        "1.12.13",
        "load_pre_hook_result",
        "a load pre-hook's returned dict is dropped",
    ),
}

ENTRIES: dict = _backend_entries(_MUTANTS)
SLOW: frozenset = frozenset()
