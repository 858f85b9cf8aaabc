"""``GefenDCPState``: the reshardable DCP ``Stateful`` for the reference Gefen optimizer."""

from __future__ import annotations

import torch.distributed as dist

from . import agreement, compact, dense, layout, optimizer_view, placeholder, restore, schema


def _require_process_group() -> None:
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError("GefenDCPState requires an initialized distributed process group")


class GefenDCPState:
    """Wraps a reference Gefen optimizer for ``torch.distributed.checkpoint``.

    Accepts ``gefen_reference.Gefen`` and any optimizer class that declares the
    reference's state layout (``gefen_reference.dcp.STATE_LAYOUT``, SPEC 2.3.6).

    ``state_dict()`` is collective: every rank must call it (``dcp.save`` and
    ``dcp.load`` do). It returns the v2 checkpoint schema (SPEC.md 2.1) with each
    dense slot as a storage-free placeholder that is expanded only when DCP
    fetches it. Pass ``planner=GefenSavePlanner()`` to ``dcp.save`` to keep at most
    one slot's dense form alive, and ``storage_writer=GefenFileSystemWriter(path)``
    to ``dcp.async_save``.
    """

    def __init__(self, optimizer):
        if not optimizer_view.is_supported(optimizer):
            raise TypeError(
                "GefenDCPState supports gefen_reference.Gefen and classes that declare its state layout "
                "(gefen_state_layout = gefen_reference.dcp.STATE_LAYOUT in the class body), got "
                f"{type(optimizer).__name__}"
            )
        _require_process_group()
        self.optimizer = optimizer
        self._slots = ()
        # With peers, a rank-local layout error raised here would leave the other
        # ranks waiting inside the next collective; it is reported from the
        # synchronized state_dict() instead. Alone, raising early is safe.
        if dist.get_world_size() == 1:
            self._slots = layout.collect_slots(optimizer)
            layout.reject_name_collisions(self._slots)

    # -- save ---------------------------------------------------------------------------

    def state_dict(self):
        """Build this rank's checkpoint dict. **Collective**; see SPEC.md 2.3."""
        _require_process_group()
        local_error = None
        result = None
        try:
            # Re-derived on every call so a retained wrapper sees add_param_group.
            self._slots = layout.collect_slots(self.optimizer)
            result = self._assemble()
        except Exception as exc:  # agreed on below, then re-raised
            local_error = exc
        agreement.settle(local_error, agreement.ABORT_MESSAGE)
        agreement.require_identical_layouts(result["param_identities"])
        self._agree_slot_scalars(result)
        return result

    def _agree_slot_scalars(self, result) -> None:
        """Make every rank write the same per-slot scalars (SPEC 2.4.5). **Collective.**

        Runs after the layout digest, so every rank has the same slots. A rank
        whose shard of a parameter is empty takes the scalars of the ranks that
        hold data; any disagreement among those raises on every rank.
        """
        local = []
        for slot in self._slots:
            holds_data = layout.local_part(slot.parameter).numel() > 0 or slot.parameter.numel() == 0
            triple = tuple(int(result[schema.slot_key(slot.index, f)].item()) for f in agreement.SLOT_SCALARS)
            local.append((holds_data, triple))
        for slot, triple in zip(self._slots, agreement.agreed_slot_scalars(local)):
            initialized, step, vmean_step = triple
            result[schema.slot_key(slot.index, "initialized")] = schema.uint8_flag(initialized)
            result[schema.slot_key(slot.index, "step")] = schema.int64_scalar(step)
            result[schema.slot_key(slot.index, "vmean_step")] = schema.int64_scalar(vmean_step)

    def _assemble(self) -> dict:
        """The rank-local half of ``state_dict()``; runs inside the agreement region."""
        opt = self.optimizer
        slots = self._slots
        layout.reject_name_collisions(slots)
        codebook = optimizer_view.codebook_of(opt)
        out = {
            "format_version": schema.int64_scalar(schema.FORMAT_VERSION),
            "global_step": schema.int64_scalar(
                schema.as_counter(optimizer_view.global_step_of(opt), "global_step")
            ),
            "deterministic": schema.uint8_flag(optimizer_view.deterministic_of(opt)),
            "slot_count": schema.int64_scalar(len(slots)),
            "group_count": schema.int64_scalar(len(opt.param_groups)),
            "param_identities": [slot.identity() for slot in slots],
            "param_group_hypers": [schema.hyper_entry(group) for group in opt.param_groups],
        }
        for slot in slots:
            state = opt.state.get(slot.parameter)
            initialized = compact.is_initialized(slot, state)
            step, vmean_step = compact.step_counters(state)
            local = layout.local_part(slot.parameter)
            if initialized:
                compact.check_expandable(codebook, local, state)
            out[schema.slot_key(slot.index, "initialized")] = schema.uint8_flag(initialized)
            out[schema.slot_key(slot.index, "step")] = schema.int64_scalar(step)
            out[schema.slot_key(slot.index, "vmean_step")] = schema.int64_scalar(vmean_step)
            momentum_build, second_build = _builders(codebook, local, state, initialized)
            out[schema.slot_key(slot.index, "momentum")] = placeholder.deferred(
                slot.parameter, momentum_build
            )
            out[schema.slot_key(slot.index, "second_moment")] = placeholder.deferred(
                slot.parameter, second_build
            )
        return out

    # -- load ---------------------------------------------------------------------------

    def load_state_dict(self, state_dict):
        """Restore this rank's part of a checkpoint. **Collective**; see SPEC.md 3.2.

        Every rank first validates and stages its complete new state without
        touching the optimizer. One all-reduce then tells every rank whether all
        of them succeeded; only then does any rank commit. A rank that failed
        raises its own error; the others raise RuntimeError naming "another rank".
        """
        _require_process_group()
        local_error = None
        plan = None
        try:
            plan = restore.stage(self.optimizer, state_dict)
        except Exception as exc:  # agreed on below, then re-raised
            local_error = exc
        agreement.settle(local_error, agreement.LOAD_ABORT_MESSAGE)
        agreement.require_identical_layouts(plan.identities, agreement.DIVERGENT_LAYOUT_LOAD_MESSAGE)
        self._slots = plan.slots
        restore.commit(self.optimizer, plan)


def _builders(codebook, local, state, initialized):
    """Zero-argument callables producing the slot's dense momentum and second moment.

    They read the live state when called, which is why the async writer snapshots
    them during staging.
    """
    if not initialized:
        return (lambda: dense.zeros(local)), (lambda: dense.zeros(local))
    return (lambda: dense.momentum(codebook, local, state)), (lambda: dense.second_moment(local, state))
