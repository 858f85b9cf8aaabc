"""The mutant catalogue: broken implementations derived from the reference, one bug each.

Every mutant is a :class:`gefen_conformance.Implementation`; ``CATALOGUE`` says which SPEC clause
must catch it and which suite tests exercise that clause (a ``-k`` selection, so the meta-test
stays fast). Every mutant is judged in both numeric profiles (SPEC 0.4): as declared (with
``cpu-bit-exact`` where its base declares it) and as a kernel backend would declare it, without
``cpu-bit-exact`` (the tolerance profile, ``tolerant_<name>``); an entry names a clause and
selection per profile where they differ. tests/test_suite_catches_mutants.py runs the suite
against each one in each profile. A change that only rounds differently is not a bug under the
tolerance profile: such variants live in the benign catalogue (tests/benign.py), which the suite
must accept. ``beta-rounding`` moved there (as ``fp32-betas-in-ema``, built as kernels do it: the
groups keep the user's betas); what stays here is ``betas-stored-rounded``, which also rewrites
the user's hyperparameters, a bug in both profiles.
Mutants are built from module clones (tests/mutant_tools.py), never by patching the reference.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from types import SimpleNamespace

import torch

import gefen_reference as reference
import gefen_reference.dcp as reference_dcp
import gefen_reference.dcp.agreement as agreement
import gefen_reference.dcp.dense as dense
import gefen_reference.dcp.hyper_staging as hyper_staging
import gefen_reference.dcp.layout as layout
import gefen_reference.dcp.optimizer_view as optimizer_view
import gefen_reference.dcp.placeholder as placeholder
import gefen_reference.dcp.reblock as reblock
import gefen_reference.dcp.restore as restore
import gefen_reference.dcp.schema as schema
import gefen_reference.dcp.state as state
import gefen_reference.dcp.writer as writer_module
import gefen_reference.optimizer as optimizer_module
import gefen_reference.periods as periods
import gefen_reference.steps as steps
from gefen_conformance.implementations import reference as reference_impl
from gefen_conformance.implementations.contract import (
    CPU_BIT_EXACT,
    KNOWN_CAPABILITIES,
    Implementation,
)
from gefen_reference.native_state import local_tensor

from .mutant_tools import clone, proxy
from .optimizer_mutants import as_kernel, mutant_lr_half_percent_high
from .optimizer_mutants import optimizer_mutant as _optimizer_mutant

ALL_CAPS = KNOWN_CAPABILITIES


def _dcp_mutant(name, adapter_module, *, make_optimizer=None):
    """A mutant whose optimizer is the reference's and whose DCP adapter comes from a cloned module."""
    return Implementation(
        name=name,
        version="mutant",
        make_optimizer=make_optimizer or reference_impl.IMPLEMENTATION.make_optimizer,
        dcp_state=lambda opt: adapter_module.GefenDCPState(opt),
        save_planner=reference_impl.IMPLEMENTATION.save_planner,
        async_writer=reference_impl.IMPLEMENTATION.async_writer,
        capabilities=ALL_CAPS,
    )


def _optimizer_with(**step_overrides):
    """reference.Gefen rebuilt on a steps module with some functions swapped."""
    mutated_steps = clone(steps, **step_overrides)
    return clone(
        optimizer_module,
        block_vmean_step=mutated_steps.block_vmean_step,
        factored_step=mutated_steps.factored_step,
    ).Gefen


# --------------------------------------------------------------------------- optimizer


def _betas_stored_rounded(params, **hp):
    """The user's betas rounded to fp32 when the optimizer is built: the groups store (and
    checkpoint) ``fp32(beta)`` instead of the user's value, and the step uses it."""
    b1, b2 = hp.pop("betas", (0.9, 0.999))
    return reference.Gefen(
        params, betas=(float(torch.tensor(b1).item()), float(torch.tensor(b2).item())), **hp
    )


def _codewords_in_bf16(codebook, indices, dtype):
    """Decoded codewords rounded to bf16 whatever the grad dtype (fp32 included)."""
    return codebook[indices.long()].to(torch.bfloat16).to(dtype)


def _block_step_eps_inside_sqrt(param, grad, state, codebook, hyper):
    """The stepsize denominator ``sqrt(vmean/bc2 + eps)`` instead of ``sqrt(vmean/bc2) + eps``."""
    period = state["automatic_period"]
    grad_blocks = grad.reshape(-1).view(-1, period)
    state["vmean"].mul_(hyper.beta2).add_(steps.block_mean_square(grad_blocks), alpha=1 - hyper.beta2)
    state["step"] += 1
    state["vmean_step"] += 1
    bc1 = 1 - hyper.beta1 ** state["step"]
    bc2 = 1 - hyper.beta2 ** state["vmean_step"]
    if hyper.weight_decay > 0.0:
        param.mul_(1 - hyper.lr * hyper.weight_decay)
    denom = (state["vmean"] / bc2).add_(hyper.eps).sqrt_()
    stepsize = torch.reciprocal(denom).mul_(1.0 / bc1)
    momentum = steps.requantized_momentum(state, codebook, grad_blocks, hyper.beta1)
    steps._subtract_flat(param, momentum.mul_(stepsize).mul_(hyper.lr))


class _StepCountsOnlyGradientSteps(reference.Gefen):
    """Global step not advanced by a step() without gradients."""

    def step(self, closure=None):
        had = any(p.grad is not None for _, _, p in self.named_params())
        before = self.global_step
        loss = super().step(closure)
        if not had:
            self.global_step = before
        return loss


def _accepts_zero_eps(params, **hp):
    """eps <= 0 or infinite silently replaced instead of rejected."""
    eps = hp.get("eps", 1e-8)
    if not (math.isfinite(eps) and eps > 0):
        hp["eps"] = 1e-8
    return reference.Gefen(params, **hp)


def _nearest_ties_up(codebook, values):
    """The nearest-codeword rule with ties going to the upper neighbour."""
    k = codebook.numel()
    v = values.float()
    upper = torch.searchsorted(codebook, v.reshape(-1)).reshape(v.shape)
    left, right = (upper - 1).clamp(0, k - 1), upper.clamp(0, k - 1)
    left_wins = (v - codebook[left]).abs() < (v - codebook[right]).abs()
    return torch.where(left_wins, left, right).to(torch.uint8)


def _search_without_fallback(rules, name, global_shape, squared):
    """A period search that ignores the memory-safe fallback."""
    if len(squared) == 1 or rules.forces_period_one(name, len(global_shape)):
        return 1
    return periods.search_period(squared)


def _block_step_without_decay(param, grad, state, codebook, hyper):
    """The block step without its decoupled weight decay (the factor is dropped); the factored
    path keeps its own, so the mutant is wrong in SPEC 1.8.6 alone."""
    steps.block_vmean_step(param, grad, state, codebook, replace(hyper, weight_decay=0.0))


class _ReallocatingStep(reference.Gefen):
    """A step that rebuilds its state tensors instead of updating them in place."""

    def step(self, closure=None):
        loss = super().step(closure)
        for entry in self.state.values():
            for key, value in list(entry.items()):
                if torch.is_tensor(value):
                    entry[key] = value.clone()
        return loss


# ------------------------------------------------------------------------- DCP save


def _momentum_codewords_in_bf16(codebook, local, st):
    """Dense momentum from codewords rounded to bf16 (the optimizer's grad-dtype rounding leaking in)."""
    return dense.momentum(codebook.to(torch.bfloat16).float(), local, st)


def _second_moment_aliasing(local, st):
    """At period 1 the dense second moment is a view of the live vmean instead of a fresh tensor."""
    if st["automatic_period"] == 1:
        return st["vmean"].view(local.shape)
    return dense.second_moment(local, st)


class _FreshBufferPerCall(placeholder._DeferredDenseShard):
    """DCP's destination buffer rebuilt on every fetch: a load copies into a temporary and is lost."""

    def __get_tensor_shard__(self, index):
        return self._build()


def _eager(parameter, build):
    """Every slot expanded when state_dict() runs, and kept."""
    p = placeholder.deferred(parameter, build)
    p.__get_tensor_shard__(None)
    return p


def _local_verdict_only(local_error, abort_message):
    """No agreement: each rank acts on its own verdict."""
    if local_error is not None:
        raise local_error


def _stage_truncating_ints(destination, saved_value, *, key):
    """Integral destinations accept fractional values (the fill truncates them)."""
    if (
        torch.is_tensor(destination)
        and not destination.dtype.is_floating_point
        and destination.dtype != torch.bool
    ):
        value = hyper_staging.read_saved_value(saved_value, key=key)
        return hyper_staging.StagedValue(key, value, destination, float(int(value)))
    return hyper_staging.stage_hyperparameter(destination, saved_value, key=key)


def _stage_any_beta(destination, saved_value, *, key):
    """A beta that rounds to 1 (or beyond) in the destination dtype is accepted."""
    if (
        torch.is_tensor(destination)
        and destination.dtype.is_floating_point
        and key in hyper_staging.BETA_KEYS
    ):
        value = hyper_staging.read_saved_value(saved_value, key=key)
        stored = float(torch.empty((), dtype=destination.dtype).fill_(value).item())
        return hyper_staging.StagedValue(key, value, destination, stored)
    return hyper_staging.stage_hyperparameter(destination, saved_value, key=key)


def _name_by_spelling(group, position):
    """Synthesized names decided by how they look, not by provenance."""
    names = group.get("param_names") or ()
    return bool(optimizer_view._POSITIONAL_SPELLING.match(str(names[position])))


class _CommitBeforeAgreement(state.GefenDCPState):
    """Each rank commits what it staged, then learns whether the others succeeded."""

    def load_state_dict(self, state_dict):
        local_error = None
        try:
            restore.commit(self.optimizer, restore.stage(self.optimizer, state_dict))
        except Exception as exc:
            local_error = exc
        agreement.settle(local_error, agreement.LOAD_ABORT_MESSAGE)


def _state_with(**overrides):
    return clone(state, **overrides)


def _restore_with_staging(stage_fn):
    staging = clone(hyper_staging, stage_hyperparameter=stage_fn)
    return _state_with(restore=clone(restore, hyper_staging=staging))


def _layout_by_spelling():
    view = clone(optimizer_view, name_is_synthesized=_name_by_spelling)
    mutated_layout = clone(layout, optimizer_view=view)
    return _state_with(layout=mutated_layout, restore=clone(restore, layout=mutated_layout))


def _flag_as_int64(value):
    """Flags (initialized, deterministic) written as int64 instead of uint8."""
    return torch.tensor(1 if value else 0, dtype=torch.int64)


def _each_rank_its_own_scalars(local):
    """No slot-scalar agreement (gefen-x 0.5.0's save): every rank writes the scalars of its own
    shard, so a rank whose shard is empty writes ``0, 0, 0`` beside the data-holding ranks'
    counters, and DCP keeps whichever rank's copy of each it chooses (a torn slot)."""
    return [tuple(triple) for _, triple in local]


class _RowByRowShard(placeholder._DeferredDenseShard):
    """A matrix's dense slot written row by row: each row of this rank's shard its own ``SHARD``
    item, where SPEC 2.2.4 writes one chunk per rank. The rows tile the shard, so the checkpoint
    reads back whole, restores and interoperates; only its items differ. A load asks for the same
    rows, each a view (made once) of the one buffer the hook keeps."""

    def _row_chunks(self):
        from torch.distributed.checkpoint.metadata import ChunkStorageMetadata

        chunk = self._chunk()
        if len(chunk.sizes) < 2 or chunk.sizes[0] < 2:
            return [chunk]
        first, *rest = chunk.offsets
        return [
            ChunkStorageMetadata(
                offsets=torch.Size([first + row, *rest]), sizes=torch.Size([1, *chunk.sizes[1:]])
            )
            for row in range(chunk.sizes[0])
        ]

    def rows_at(self, whole, index):
        """The part of ``whole`` (this rank's shard) that the item at ``index`` stands for."""
        if index is None or len(self._row_chunks()) == 1:
            return whole
        return whole.narrow(0, index.offset[0] - self._chunk().offsets[0], 1)

    def __create_write_items__(self, fqn, obj):
        from torch.distributed.checkpoint.metadata import MetadataIndex
        from torch.distributed.checkpoint.planner import WriteItem, WriteItemType

        (item,) = super().__create_write_items__(fqn, obj)
        return [
            WriteItem(
                index=MetadataIndex(fqn, chunk.offsets),
                type=WriteItemType.SHARD,
                tensor_data=replace(item.tensor_data, chunk=chunk),
            )
            for chunk in self._row_chunks()
        ]

    def __create_chunk_list__(self):
        return self._row_chunks()

    def __get_tensor_shard__(self, index):
        whole = super().__get_tensor_shard__(index)
        if index is None:
            return whole
        views = self.__dict__.setdefault("_row_views", {})
        row = tuple(index.offset)
        if row not in views:
            views[row] = self.rows_at(whole, index)
        return views[row]


class _RowByRowPlanner(reference_dcp.GefenSavePlanner):
    """The bounded planner of a row-by-row adapter: the rows of the fresh copy each item names."""

    def resolve_data(self, write_item):
        entry = self.state_dict.get(write_item.index.fqn)
        data = super().resolve_data(write_item)
        return entry.rows_at(data, write_item.index).clone() if isinstance(entry, _RowByRowShard) else data


def _identity_shape_as_tuple(name, group_index, global_shape):
    """An identity whose ``shape`` is a tuple (``tuple(param.shape)``), written by the save and
    compared by the load: the adapter restores its own checkpoints, refuses every other adapter's
    (list-shaped), and every other adapter refuses its checkpoints."""
    entry = schema.identity_entry(name, group_index, global_shape)
    return {**entry, "shape": tuple(entry["shape"])}


def _identities_with_tuple_shapes():
    mutated_layout = clone(layout, schema=proxy(schema, identity_entry=_identity_shape_as_tuple))
    return _state_with(layout=mutated_layout, restore=clone(restore, layout=mutated_layout))


def _reblock_second_moment_in_bf16(codebook, momentum, second, period):
    """The re-blocking with its scratch copy of the dense second moment in bf16 (half the
    memory): each block mean averages bf16-rounded values, 2^-9 relative off even where target
    blocks are the source's own (SPEC 3.7.2: exact up to fp32 round-off there)."""
    return reblock.reblock(codebook, momentum, second.to(torch.bfloat16), period)


@dataclass(frozen=True)
class Entry:
    implementation: Implementation
    clause: str  # the clause whose tests must fail
    select: str  # -k expression choosing the suite tests that exercise it
    bug: str
    tolerance_clause: str | None = None  # the clause under the tolerance profile, when another
    tolerance_select: str | None = None  # the selection under the tolerance profile, when another

    def clause_in(self, profile: str) -> str:
        return self.tolerance_clause or self.clause if profile == TOLERANCE else self.clause

    def select_in(self, profile: str) -> str:
        return self.tolerance_select or self.select if profile == TOLERANCE else self.select


TORCH_EXACT, TOLERANCE = "torch-exact", "tolerance"
PROFILES = (TORCH_EXACT, TOLERANCE)

CATALOGUE = {
    "betas-stored-rounded": Entry(
        _optimizer_mutant("betas-stored-rounded", _betas_stored_rounded),
        "1.8",
        "block_step",
        "the user's betas rounded to fp32 and stored (the step uses them too)",
        tolerance_clause="1.2.4",
        tolerance_select="state_matches",
    ),
    "lr-half-percent-high": Entry(
        mutant_lr_half_percent_high,
        "1.8",
        "block_step",
        "every step applies 1.005 x lr",
        tolerance_select="pinned_block_step and float32",
    ),
    "bf16-codewords": Entry(
        _optimizer_mutant("bf16-codewords", _optimizer_with(dequantize=_codewords_in_bf16)),
        "1.8",
        "block_step",
        "codewords rounded to bf16 for every grad dtype (fp32: 2^-8 relative where 2^-24 is allowed)",
        tolerance_select="pinned_block_step and float32",
    ),
    "eps-inside-sqrt": Entry(
        _optimizer_mutant("eps-inside-sqrt", _optimizer_with(block_vmean_step=_block_step_eps_inside_sqrt)),
        "1.8.7#3",
        "block_step",
        "eps added under the square root of the stepsize denominator",
        tolerance_select="pinned_block_step",
    ),
    "global-step": Entry(
        _optimizer_mutant("global-step", lambda p, **hp: _StepCountsOnlyGradientSteps(p, **hp)),
        "1.10.6",
        "global_step",
        "global step skips steps without gradients",
    ),
    "zero-eps": Entry(
        _optimizer_mutant("zero-eps", _accepts_zero_eps),
        "1.1.3",
        "invalid",
        "invalid eps replaced instead of rejected",
    ),
    "nearest-ties-up": Entry(
        _optimizer_mutant("nearest-ties-up", _optimizer_with(nearest_codeword_indices=_nearest_ties_up)),
        "1.7.1#4",
        "ties",
        "nearest-codeword ties go to the upper index",
    ),
    "no-period-fallback": Entry(
        _optimizer_mutant(
            "no-period-fallback", clone(optimizer_module, choose_period=_search_without_fallback).Gefen
        ),
        "1.5.5#4",
        "state_matches",
        "period search ignores the memory-safe fallback",
    ),
    "no-weight-decay": Entry(
        _optimizer_mutant("no-weight-decay", _optimizer_with(block_vmean_step=_block_step_without_decay)),
        "1.8.6",
        "block_step",
        "decoupled weight decay dropped",
        tolerance_select="pinned_block_step",
    ),
    "reallocating-step": Entry(
        Implementation(
            name="reallocating-step",
            version="mutant",
            make_optimizer=lambda p, **hp: _ReallocatingStep(p, **hp),
            capabilities=ALL_CAPS,
            dcp_state=reference_impl.IMPLEMENTATION.dcp_state,
        ),
        "5.4.3",
        "in_place",
        "state rebuilt every step instead of updated in place",
    ),
    "dense-momentum-rounding": Entry(
        _dcp_mutant(
            "dense-momentum-rounding", _state_with(dense=proxy(dense, momentum=_momentum_codewords_in_bf16))
        ),
        "2.2.5",
        "payload or golden",
        "dense momentum from bf16-rounded codewords",
        tolerance_clause="2.1.6",
        tolerance_select="restore_and_resave",
    ),
    "second-moment-alias": Entry(
        _dcp_mutant(
            "second-moment-alias", _state_with(dense=proxy(dense, second_moment=_second_moment_aliasing))
        ),
        "3.10.1",
        "hostile",
        "dense second moment aliases live vmean at period 1",
    ),
    "fresh-buffer-per-load": Entry(
        _dcp_mutant(
            "fresh-buffer-per-load",
            _state_with(placeholder=clone(placeholder, _DeferredDenseShard=_FreshBufferPerCall)),
        ),
        "3.7.3",
        "reshard and not at_scale",
        "load copies into a temporary buffer: restore is a silent no-op",
    ),
    "unsynchronized-check": Entry(
        _dcp_mutant(
            "unsynchronized-check", _state_with(agreement=proxy(agreement, settle=_local_verdict_only))
        ),
        "2.3.4",
        "dcp_failures",
        "rank-local failures not agreed across ranks",
    ),
    "no-layout-digest": Entry(
        _dcp_mutant(
            "no-layout-digest",
            _state_with(agreement=proxy(agreement, require_identical_layouts=lambda *a, **k: None)),
        ),
        "2.3.5",
        "layout_differing",
        "no cross-rank layout digest",
    ),
    "eager-expansion": Entry(
        _dcp_mutant("eager-expansion", _state_with(placeholder=proxy(placeholder, deferred=_eager))),
        "5.4.2",
        "memory or bounded",
        "every slot expanded and held during the save",
    ),
    "commit-before-agreement": Entry(
        _dcp_mutant("commit-before-agreement", SimpleNamespace(GefenDCPState=_CommitBeforeAgreement)),
        "3.2.5",
        "dcp_failures",
        "a rank commits before every rank staged successfully",
    ),
    "lr-truncated-into-int": Entry(
        _dcp_mutant("lr-truncated-into-int", _restore_with_staging(_stage_truncating_ints)),
        "3.5.2",
        "staging_regression",
        "a fractional lr restored into an integer tensor truncates to 0",
    ),
    "beta-rounds-to-one": Entry(
        _dcp_mutant("beta-rounds-to-one", _restore_with_staging(_stage_any_beta)),
        "3.5.2",
        "staging_regression",
        "a beta that rounds to 1 in the destination dtype is accepted",
    ),
    "flags-as-int64": Entry(
        _dcp_mutant("flags-as-int64", _state_with(schema=proxy(schema, uint8_flag=_flag_as_int64))),
        "4.3.5",
        "schema",
        "uint8 flags written as int64",
    ),
    "names-by-spelling": Entry(
        _dcp_mutant("names-by-spelling", _layout_by_spelling()),
        "2.4.1",
        "caller_name",
        "a caller's name that looks positional is refused",
    ),
    "torn-slot-scalars": Entry(
        _dcp_mutant(
            "torn-slot-scalars",
            _state_with(agreement=proxy(agreement, agreed_slot_scalars=_each_rank_its_own_scalars)),
        ),
        "2.4.5",
        "test_checkpoint_schema_from_the_files and w4-empty-shards",
        "slot scalars not agreed across ranks: empty-shard ranks write torn slots",
    ),
    "dense-slots-row-by-row": Entry(
        replace(
            _dcp_mutant(
                "dense-slots-row-by-row",
                _state_with(placeholder=proxy(placeholder, deferred=_RowByRowShard)),
            ),
            save_planner=lambda: _RowByRowPlanner(),
        ),
        "2.2.4",
        "test_checkpoint_schema_from_the_files and w2",
        "a matrix's dense slot written as one SHARD item per row, not one chunk per rank",
    ),
    "identity-shape-as-tuple": Entry(
        _dcp_mutant("identity-shape-as-tuple", _identities_with_tuple_shapes()),
        "3.8.1",
        "test_cross_implementation_restore and impl-to-reference",
        "identity shapes written and compared as tuples: only its own checkpoints restore",
    ),
    "restore-second-moment-in-bf16": Entry(
        _dcp_mutant(
            "restore-second-moment-in-bf16",
            _state_with(
                restore=clone(restore, reblock=proxy(reblock, reblock=_reblock_second_moment_in_bf16))
            ),
        ),
        "3.7.2",
        # the 2->1 path: every target block a union of whole source blocks
        "test_reshard_resaved_state_is_consistent and 1]",
        "a restore's block means taken over a bf16 copy of the dense second moment",
    ),
}

# ================================================================ input space
#
# Kernel backends written the way examples/gefen-fast is: a ``gefen_reference.Gefen`` subclass that
# keeps the reference's constructor, step order, state format and DCP adapter (it declares the
# reference's state layout, SPEC 2.3.6, so every capability is claimed) and replaces the
# per-parameter update (``update_parameter``, SPEC 4.1.8), or, for a fused multi-tensor backend, ``step``
# itself. Each
# has one bug that real kernels have had and that fires only on an input of the input space
# (SPEC 4.3.10): only the input space and protocol tests catch it, each in both profiles.


class _Backend(reference.Gefen):
    """A kernel backend built on the reference (examples/gefen-fast is one)."""


def _backend(name, cls):
    """``cls`` declared as examples/gefen-fast declares itself: the reference's state layout, in its
    own class (SPEC 2.3.6: not inherited), and every capability but ``cpu-bit-exact``'s absence
    (the catalogue judges both profiles)."""
    cls.gefen_state_layout = reference_dcp.STATE_LAYOUT
    return Implementation(
        name=name,
        version="mutant",
        make_optimizer=lambda params, **hp: cls(params, **hp),
        dcp_state=reference_impl.IMPLEMENTATION.dcp_state,
        save_planner=reference_impl.IMPLEMENTATION.save_planner,
        async_writer=reference_impl.IMPLEMENTATION.async_writer,
        capabilities=ALL_CAPS,
    )


def _backend_entries(table: dict) -> dict:
    """Catalogue entries of ``{name: (backend class, clause, selection, bug)}`` (:func:`_backend`)."""
    return {
        name: Entry(_backend(name, cls), clause, select, bug)
        for name, (cls, clause, select, bug) in table.items()
    }


def _rewrite_logical(param: torch.Tensor, values: torch.Tensor, where: torch.Tensor) -> None:
    """``param.reshape(-1)[where] = values[where]`` in logical order, whatever ``param`` 's layout."""
    work = param.detach().contiguous()
    flat = work.view(-1)
    flat[where] = values.reshape(-1).to(flat.dtype)[where]
    if work.data_ptr() != param.data_ptr():
        param.detach().copy_(work)


class _TileTailSkipped(_Backend):
    """Shapes: the update kernel runs over 65536-element tiles and is launched with ``n // 65536``
    tiles once ``n`` exceeds one tile (floor where the ceiling belongs): the last partial tile's
    parameters are never written."""

    TILE = 65536

    def update_parameter(self, p, grad, state, hyper, factored):
        local = local_tensor(p)
        n = local.numel()
        covered = (n // self.TILE) * self.TILE if n > self.TILE else n
        before = local.detach().reshape(-1).clone()
        super().update_parameter(p, grad, state, hyper, factored)
        if covered < n:
            tail = torch.arange(n, device=local.device) >= covered
            _rewrite_logical(local, before, tail)


class _DimensionOfOneNotFactored(_Backend):
    """Routing: a 2-D parameter with a dimension of 1 is treated as a vector (block second moment),
    as factored optimizers that only factor matrices "with two real dimensions" do (SPEC 1.9.1:
    every plain 2-D parameter is factored)."""

    def update_parameter(self, p, grad, state, hyper, factored):
        if factored and 1 in p.shape:
            if "vmean" not in state:
                steps.new_block_second_moment(state)
            factored = False
        super().update_parameter(p, grad, state, hyper, factored)


def _memory_as_contiguous(t: torch.Tensor, storage_offset=None) -> torch.Tensor:
    """What a kernel handed ``data_ptr()`` (or the storage's base, ``storage_offset=0``) and the
    shape reads: row-major memory from there, whatever the tensor's strides."""
    strides = torch.empty(t.shape, device="meta").stride()
    offset = t.storage_offset() if storage_offset is None else storage_offset
    return torch.as_strided(t.detach(), t.shape, strides, offset)


class _ContiguityAssumed(_Backend):
    """Layouts: the kernel reads the gradient and writes the parameter as row-major memory from
    their data pointers (a transposed or channels_last parameter, a gradient with other strides,
    are read and written in memory order instead of logical order, SPEC 1.13.8)."""

    def update_parameter(self, p, grad, state, hyper, factored):
        super().update_parameter(
            _memory_as_contiguous(local_tensor(p)), _memory_as_contiguous(grad), state, hyper, factored
        )


class _StorageOffsetIgnored(_Backend):
    """Layouts: the kernel takes the storage's base pointer instead of the tensor's data pointer: a
    parameter (or gradient) that is a view into a flat buffer at an offset is read and written at
    the start of the buffer (every standalone tensor starts at offset 0, where both agree)."""

    def update_parameter(self, p, grad, state, hyper, factored):
        p = local_tensor(p)
        p_at_base = torch.as_strided(p.detach(), p.shape, p.stride(), 0)
        grad_at_base = torch.as_strided(grad.detach(), grad.shape, grad.stride(), 0)
        super().update_parameter(p_at_base, grad_at_base, state, hyper, factored)


class _DecodeTableOfFirstDtype(_Backend):
    """Dtypes: one codeword decode table per optimizer, built for the gradient dtype of the first
    parameter it updates and reused for every dtype (examples/gefen-fast caches one per dtype): in a
    mixed-dtype optimizer whose first parameter is bf16, fp32 and fp64 parameters step with
    bf16-rounded codewords (SPEC 1.13.5: rounded to each gradient's own dtype)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._table_dtype = None
        kernels = clone(steps, dequantize=self._dequantize)
        self._block_step, self._factored_step = kernels.block_vmean_step, kernels.factored_step

    def _dequantize(self, codebook, indices, dtype):
        return codebook[indices.long()].to(self._table_dtype).to(dtype)

    def update_parameter(self, p, grad, state, hyper, factored):
        if self._table_dtype is None:
            self._table_dtype = grad.dtype
        if factored:
            self._factored_step(p, grad, state, self.codebook, hyper)
        else:
            self._block_step(local_tensor(p), grad, state, self.codebook, hyper)


class _DecayFlagOfFirstGroup(_Backend):
    """Groups: the fused kernel is specialised once on "has weight decay" from the first group
    (each group's own decay value is used where the flag is on), so weight decay set only in a
    later group is never applied."""

    def update_parameter(self, p, grad, state, hyper, factored):
        if not self.param_groups[0]["weight_decay"] > 0.0:
            hyper = replace(hyper, weight_decay=0.0)
        super().update_parameter(p, grad, state, hyper, factored)


class _LrCapturedAtFirstStep(_Backend):
    """Schedules: the lr is read once per parameter, at its first update, and kept (to avoid a
    ``.item()`` per step, or as a CUDA graph would capture it): a scheduler's later change, a new
    lr or an in-place ``mul_`` of a tensor lr, never takes effect (SPEC 1.4.2)."""

    def update_parameter(self, p, grad, state, hyper, factored):
        captured = self.__dict__.setdefault("_captured_lr", {})
        super().update_parameter(
            p, grad, state, replace(hyper, lr=captured.setdefault(p, hyper.lr)), factored
        )


def _bias_corrections_uint8(hyper, step: int, moment_step: int):
    """``1/bc1`` and ``bc2`` from counters kept in uint8 device scalars: they wrap at 256, and a
    wrapped 0 gives ``bc = 0``, an infinite stepsize."""
    bc1 = 1 - hyper.beta1 ** (step % 256)
    bc2 = 1 - hyper.beta2 ** (moment_step % 256)
    return (1.0 / bc1 if bc1 else math.inf), bc2


def _block_step_uint8_counters(param, grad, state, codebook, hyper):
    """reference.steps.block_vmean_step with the bias corrections of :func:`_bias_corrections_uint8`."""
    period = state["automatic_period"]
    grad_blocks = grad.reshape(-1).view(-1, period)
    state["vmean"].mul_(hyper.beta2).add_(steps.block_mean_square(grad_blocks), alpha=1 - hyper.beta2)
    state["step"] += 1
    state["vmean_step"] += 1
    inverse_bias1, bc2 = _bias_corrections_uint8(hyper, state["step"], state["vmean_step"])
    if hyper.weight_decay > 0.0:
        param.mul_(1 - hyper.lr * hyper.weight_decay)
    denom = torch.sqrt(state["vmean"]).div_(math.sqrt(bc2)).add_(hyper.eps)
    stepsize = torch.reciprocal(denom).mul_(inverse_bias1)
    momentum = steps.requantized_momentum(state, codebook, grad_blocks, hyper.beta1)
    steps._subtract_flat(param, momentum.mul_(stepsize).mul_(hyper.lr))


def _factored_step_uint8_counters(param, grad, state, codebook, hyper):
    """reference.steps.factored_step with the bias corrections of :func:`_bias_corrections_uint8`."""
    period = state["automatic_period"]
    state["step"] += 1
    state["factored_step"] += 1
    inverse_bias1, bc2 = _bias_corrections_uint8(hyper, state["step"], state["factored_step"])
    row_ms, col_ms = steps.row_and_column_mean_squares(grad.detach())
    state["v_row"].mul_(hyper.beta2).add_(row_ms, alpha=1 - hyper.beta2)
    state["v_col"].mul_(hyper.beta2).add_(col_ms, alpha=1 - hyper.beta2)
    row_scale = state["v_row"].mean().clamp_(min=torch.finfo(torch.float32).tiny)
    v_hat = torch.outer(state["v_row"], state["v_col"]).div_(row_scale)
    denom = v_hat.div_(bc2).sqrt_().add_(hyper.eps)
    stepsize = denom.reciprocal_().mul_(inverse_bias1)
    momentum = steps.requantized_momentum(state, codebook, grad.reshape(-1).view(-1, period), hyper.beta1)
    if hyper.weight_decay > 0.0:
        param.mul_(1 - hyper.lr * hyper.weight_decay)
    param.add_(-momentum.view(param.shape).mul_(stepsize).mul_(hyper.lr))


class _Uint8StepCounters(_Backend):
    """Step counters: the kernel's bias corrections read each parameter's step counters from uint8
    scalars (the state dict's Python ints stay right): from step 256 on the corrections are those of
    ``step % 256``, and step 256 itself divides by zero."""

    def update_parameter(self, p, grad, state, hyper, factored):
        if factored:
            _factored_step_uint8_counters(p, grad, state, self.codebook, hyper)
        else:
            _block_step_uint8_counters(local_tensor(p), grad, state, self.codebook, hyper)


class _ZeroGradientBlocksNotApplied(_Backend):
    """Gradient patterns: the update kernel exits early for a block whose gradient is all zero
    ("nothing to apply"; weight decay is a separate pass and still applies). The momentum of such a
    block was updated, and a block whose gradient goes to zero after being nonzero still has
    momentum to apply (SPEC 1.8.8): its parameters stop moving."""

    def update_parameter(self, p, grad, state, hyper, factored):
        period = state["automatic_period"]
        quiet = ~(grad.reshape(-1).view(-1, period) != 0).any(dim=1)
        if not bool(quiet.any()):
            return super().update_parameter(p, grad, state, hyper, factored)
        local = local_tensor(p)
        decayed = local.detach().clone()
        if hyper.weight_decay > 0.0:
            decayed.mul_(1 - hyper.lr * hyper.weight_decay)
        super().update_parameter(p, grad, state, hyper, factored)
        _rewrite_logical(local, decayed.reshape(-1), quiet.repeat_interleave(period))


def _factored_step_mean_unclamped(param, grad, state, codebook, hyper):
    """reference.steps.factored_step dividing by ``mean(v_row)`` without the clamp at fp32 tiny."""
    period = state["automatic_period"]
    state["step"] += 1
    state["factored_step"] += 1
    bc1 = 1 - hyper.beta1 ** state["step"]
    bc2 = 1 - hyper.beta2 ** state["factored_step"]
    row_ms, col_ms = steps.row_and_column_mean_squares(grad.detach())
    state["v_row"].mul_(hyper.beta2).add_(row_ms, alpha=1 - hyper.beta2)
    state["v_col"].mul_(hyper.beta2).add_(col_ms, alpha=1 - hyper.beta2)
    v_hat = torch.outer(state["v_row"], state["v_col"]).div_(state["v_row"].mean())
    denom = v_hat.div_(bc2).sqrt_().add_(hyper.eps)
    stepsize = denom.reciprocal_().mul_(1.0 / bc1)
    momentum = steps.requantized_momentum(state, codebook, grad.reshape(-1).view(-1, period), hyper.beta1)
    if hyper.weight_decay > 0.0:
        param.mul_(1 - hyper.lr * hyper.weight_decay)
    param.add_(-momentum.view(param.shape).mul_(stepsize).mul_(hyper.lr))


class _FactoredMeanUnclamped(_Backend):
    """Gradient patterns: the factored kernel divides ``v_row * v_col`` by ``mean(v_row)`` without
    clamping it at fp32 tiny (SPEC 1.9.3 step 5): an all-zero 2-D gradient on a fresh (or all-zero)
    second moment gives 0/0, and the parameter becomes NaN."""

    def update_parameter(self, p, grad, state, hyper, factored):
        if factored:
            return _factored_step_mean_unclamped(p, grad, state, self.codebook, hyper)
        super().update_parameter(p, grad, state, hyper, factored)


class _GradientsGatheredBeforeClosure(_Backend):
    """Closure: a multi-tensor backend collects every parameter's gradient before it runs the
    closure (SPEC 1.10.1 runs the closure first): with ``zero_grad(set_to_none=True)`` inside the
    closure it steps with the stale gradients of the previous iteration."""

    def step(self, closure=None):
        gathered = [(p, p.grad) for _, _, p in self.named_params()]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        fresh = [(p, p.grad) for p, _ in gathered]
        for p, g in gathered:
            p.grad = g
        try:
            super().step()
        finally:
            for p, g in fresh:
                p.grad = g
        return loss


class _FoundInfAdvancesCounters(_Backend):
    """GradScaler: ``found_inf`` reaches the fused kernel, which writes no parameter and no moment,
    but the host had already advanced the step counters and the global step (SPEC 1.10.3: a
    ``found_inf`` step changes nothing, not even a counter)."""

    def step(self, closure=None):
        found_inf = getattr(self, "found_inf", None)
        if found_inf is None or not bool(found_inf):
            return super().step(closure)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for _, _, p in self.named_params():
            state = self.state[p]
            if p.grad is not None and "step" in state:
                state["step"] += 1
                moment = (
                    "factored_step"
                    if self.factored_v_2d and p.ndim == 2 and "factored_step" in state
                    else "vmean_step"
                )
                if moment in state:
                    state[moment] += 1
        self.global_step += 1
        return loss


class _GradScaleIgnored(_Backend):
    """GradScaler: the backend assumes the caller unscaled the gradients and ignores the
    ``grad_scale`` GradScaler sets on the optimizer (SPEC 1.10.4: the optimizer unscales)."""

    def step(self, closure=None):
        scale = self.__dict__.pop("grad_scale", None)
        try:
            return super().step(closure)
        finally:
            if scale is not None:
                self.grad_scale = scale


class _GroupSkippedWhenFirstFrozen(_Backend):
    """Frozen parameters: the backend skips a group whose first parameter has no gradient, taking it
    for a frozen module (SPEC 1.10.1: every parameter with a gradient steps, wherever the frozen
    ones are)."""

    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        hidden = []
        for group in self.param_groups:
            if group["params"][0].grad is None:
                hidden += [(p, p.grad) for p in group["params"] if p.grad is not None]
        for p, _ in hidden:
            p.grad = None
        try:
            super().step()
        finally:
            for p, g in hidden:
                p.grad = g
        return loss


_INPUTS, _PROTOCOLS = "inputs_match_reference", "protocols_match_reference"

#: name -> (class, clause, selection, bug)
INPUT_SPACE_MUTANTS = {
    "tile-tail-skipped": (
        _TileTailSkipped,
        "4.3.10",
        _INPUTS,
        "the last partial 65536-element tile of a parameter is never written",
    ),
    "dimension-of-one-not-factored": (
        _DimensionOfOneNotFactored,
        "4.3.10",
        _INPUTS,
        "2-D parameters with a dimension of 1 take the block second moment",
    ),
    "contiguity-assumed": (
        _ContiguityAssumed,
        "4.3.10",
        _INPUTS,
        "parameters and gradients read and written in memory order, not logical order",
    ),
    "storage-offset-ignored": (
        _StorageOffsetIgnored,
        "4.3.10",
        _INPUTS,
        "views into a flat buffer read and written at the buffer's start",
    ),
    "decode-table-first-dtype": (
        _DecodeTableOfFirstDtype,
        "4.3.10",
        _INPUTS,
        "codewords rounded to the first parameter's dtype for every dtype",
    ),
    "decay-flag-first-group": (
        _DecayFlagOfFirstGroup,
        "4.3.10",
        _INPUTS,
        "weight decay applied only when the first group has some",
    ),
    "lr-captured-at-first-step": (
        _LrCapturedAtFirstStep,
        "4.3.10",
        _INPUTS,
        "a scheduler's lr change (new value or in-place mul_) never takes effect",
    ),
    "uint8-step-counters": (
        _Uint8StepCounters,
        "4.3.10",
        _INPUTS,
        "bias corrections from step counters that wrap at 256",
    ),
    "zero-gradient-blocks-not-applied": (
        _ZeroGradientBlocksNotApplied,
        "4.3.10",
        _INPUTS,
        "blocks whose gradient is zero do not apply their momentum",
    ),
    "factored-mean-unclamped": (
        _FactoredMeanUnclamped,
        "1.9.3#5",
        _INPUTS,
        "an all-zero 2-D gradient divides 0 by 0 in the factored estimate",
    ),
    "gradients-gathered-before-closure": (
        _GradientsGatheredBeforeClosure,
        "1.10.1",
        _PROTOCOLS,
        "steps with the gradients present before the closure ran",
    ),
    "found-inf-advances-counters": (
        _FoundInfAdvancesCounters,
        "1.10.3",
        _PROTOCOLS,
        "a found_inf step advances the step counters and the global step",
    ),
    "grad-scale-ignored": (
        _GradScaleIgnored,
        "1.10.4",
        _PROTOCOLS,
        "grad_scale never unscales the gradients",
    ),
    "group-skipped-when-first-frozen": (
        _GroupSkippedWhenFirstFrozen,
        "1.10.1#5",
        _PROTOCOLS,
        "a group whose first parameter has no gradient does not step",
    ),
}
CATALOGUE.update(
    {
        name: Entry(_backend(name, cls), clause, select, bug)
        for name, (cls, clause, select, bug) in INPUT_SPACE_MUTANTS.items()
    }
)


# The catalogues of their own modules, which build on the names above.
from . import mutants_edges, mutants_protocol, mutants_space, mutants_stack  # noqa: E402

for _module in (mutants_edges, mutants_protocol, mutants_space, mutants_stack):
    CATALOGUE.update(_module.ENTRIES)

# Spec strings for --impl: tests.mutants:<attribute>
for _name, _entry in CATALOGUE.items():
    globals()["mutant_" + _name.replace("-", "_")] = _entry.implementation
    globals()["tolerant_" + _name.replace("-", "_")] = as_kernel(_entry.implementation)


def spec(name: str, profile: str = TORCH_EXACT) -> str:
    prefix = "tolerant_" if profile == TOLERANCE else "mutant_"
    return "tests.mutants:" + prefix + name.replace("-", "_")


#: A correct implementation that declares fewer capabilities and carries expected failures,
#: one of them stale, to exercise the plugin's bookkeeping.
partial = Implementation(
    name="partial",
    version="1",
    make_optimizer=lambda params, **hp: reference.Gefen(params, **hp),
    capabilities={CPU_BIT_EXACT},
    expected_failures={
        "test_optimizer.py::test_global_step_counts_every_step_call": "pretend known bug (it passes: strict "
        "xfail fails)",
        "test_optimizer.py::test_no_such_test": "stale entry",
        # a test of the scale tier: not stale in a run of the default tier, which leaves it out
        "test_scale.py::test_a_long_life_keeps_its_codebook_and_counters": "pretend known bug at scale",
    },
)
beta_rounding = CATALOGUE["betas-stored-rounded"].implementation
global_step = CATALOGUE["global-step"].implementation
zero_eps = CATALOGUE["zero-eps"].implementation


# =============================================================================================
# State across time and loads (SPEC 4.3.11). Backends written as kernel teams write them: a
# ``gefen_reference.Gefen`` subclass that replaces the per-parameter update (``update_parameter``,
# as examples/gefen-fast does) or the state preparation around it, or the reference DCP adapter
# with one step of its restore replaced. Each one passes a suite that never runs past six steps,
# never loads into a stepped optimizer, never switches modes and restores only small fp32 models,
# and fails the time-and-load modules in both profiles.


class _StepCountsInParameterDtype(reference.Gefen):
    """The kernel keeps each parameter's step counts as a device tensor in the parameter's dtype
    (as capturable optimizers keep a float step tensor), reseeded from the state whenever the
    state was replaced, and takes the bias corrections from it. A bf16 tensor counts exactly only
    to 256: from step 257 on the bias corrections stay at step 256 (7% of the stepsize at step 300
    with beta2 = 0.999). The host counters stay right."""

    def update_parameter(self, p, grad, state, hyper, factored):
        key = "factored_step" if factored else "vmean_step"
        device_counts = self.__dict__.setdefault("_device_counts", {})
        host = (state["step"], state[key])
        kept = device_counts.get(p)
        counts = kept[1] if kept is not None and kept[0] == host else torch.tensor(host, dtype=p.dtype)
        counts += 1
        state["step"], state[key] = int(counts[0]) - 1, int(counts[1]) - 1  # the kernel reads its own counts
        super().update_parameter(p, grad, state, hyper, factored)
        state["step"], state[key] = host[0] + 1, host[1] + 1
        device_counts[p] = ((state["step"], state[key]), counts)


class _CodewordTableBuiltOnce(reference.Gefen):
    """The kernel's codeword table (the codebook in the kernel's own layout) is built on the first
    step and kept; a load that replaces the codebook does not rebuild it, so the next steps decode
    the loaded indices with the old codewords (SPEC 1.12.12, 2.3.6 item 4). Served by the reference
    DCP adapter through its declared layout, as examples/gefen-fast is."""

    gefen_state_layout = optimizer_view.STATE_LAYOUT

    def update_parameter(self, p, grad, state, hyper, factored):
        table = self.__dict__.get("_codeword_table")
        if table is None:
            table = self._codeword_table = self.codebook.detach().clone()
        if factored:
            steps.factored_step(p, grad, state, table, hyper)
        else:
            steps.block_vmean_step(optimizer_module.local_tensor(p), grad, state, table, hyper)


class _StepCountsKeptInKernel(reference.Gefen):
    """The kernel keeps each parameter's step counts itself (as capturable kernels keep device
    counters), seeded from the state the first time it sees the parameter and copied back into the
    state after each step; a load does not reseed them, so after a load into a stepped optimizer the
    counts continue from before the load (SPEC 1.12.12). Served by the reference DCP adapter."""

    gefen_state_layout = optimizer_view.STATE_LAYOUT

    def update_parameter(self, p, grad, state, hyper, factored):
        key = "factored_step" if factored else "vmean_step"
        kernel_counts = self.__dict__.setdefault("_kernel_counts", {})
        if p not in kernel_counts:
            kernel_counts[p] = (state["step"], state[key])
        state["step"], state[key] = kernel_counts[p]
        super().update_parameter(p, grad, state, hyper, factored)
        kernel_counts[p] = (state["step"], state[key])


class _MissingMomentCountsFromStep(reference.Gefen):
    """A second moment missing after a mode switch is created at zero with the momentum's step
    count as its counter (the legacy ``vmean_step`` repair of SPEC 1.8.2 applied to a migration),
    instead of counter 0 (SPEC 1.10.8): the new moment's bias correction skips its warm-up."""

    def _prepare_state(self, name, p, grad, state, factored):
        if "step" in state and not factored and "vmean" not in state:
            steps.new_block_second_moment(state)
            state["vmean_step"] = state["step"]
        if "step" in state and factored and "v_row" not in state:
            steps.new_factored_second_moment(state, tuple(p.shape), grad.device)
            state["factored_step"] = state["step"]
        super()._prepare_state(name, p, grad, state, factored)


def _declared_kernel(name, optimizer_class):
    """A mutant optimizer class that declares the reference's state layout, served by the reference
    DCP adapter (SPEC 2.3.6), with every capability: native loads and DCP restores both reach it."""
    ref = reference_impl.IMPLEMENTATION
    return Implementation(
        name=name,
        version="mutant",
        make_optimizer=lambda p, **hp: optimizer_class(p, **hp),
        dcp_state=ref.dcp_state,
        save_planner=ref.save_planner,
        async_writer=ref.async_writer,
        capabilities=ALL_CAPS,
    )


def _restored_in_parameter_dtype(optimizer, readings):
    """The restore hands each slot's dense momentum to the re-blocking in the parameter's dtype
    (the kernel's quantizer takes parameter-dtype tensors): exact for fp32 models, rounded to 8
    bits for bf16 ones (SPEC 3.6.4 re-blocks the fp32 values)."""
    cast = [
        replace(r, momentum=r.momentum.to(layout.local_part(r.slot.parameter).dtype).float())
        for r in readings
    ]
    return restore._compact_state(optimizer, cast)


#: Elements per chunk of the chunked re-blocking below (bounded scratch, as dense.GATHER_CHUNK).
_REBLOCK_CHUNK = 1 << 16


def _reblock_in_chunks(codebook, momentum, second, period):
    """SPEC 3.6.4 in chunks of 64Ki elements to bound the scratch of the division; the chunk count
    is rounded down, so the partial last chunk of a shard above 64Ki elements is never quantized
    (its indices stay 0: codeword -1 times the block magnitude)."""
    table = codebook.to(device=momentum.device, dtype=torch.float32)
    blocks = momentum.detach().float().reshape(-1).view(-1, period)
    magnitude = blocks.abs().amax(dim=1, keepdim=True)
    indices = torch.zeros(blocks.shape, dtype=torch.uint8, device=momentum.device)
    rows = max(1, _REBLOCK_CHUNK // period)
    for chunk in range(max(1, blocks.shape[0] // rows)):
        part = slice(chunk * rows, (chunk + 1) * rows)
        scaled = torch.where(
            magnitude[part] > 0, blocks[part] / magnitude[part], torch.zeros_like(blocks[part])
        )
        indices[part] = steps.nearest_codeword_indices(table, scaled)
    vmean = second.detach().float().reshape(-1).view(-1, period).mean(dim=1, keepdim=True)
    return indices, magnitude, vmean


CATALOGUE.update(
    {
        "bf16-step-counter": Entry(
            _optimizer_mutant("bf16-step-counter", lambda p, **hp: _StepCountsInParameterDtype(p, **hp)),
            "1.8.5",
            "long_trajectory",
            "step counts kept in the parameter's dtype: bf16 stops counting at 256",
        ),
        "stale-codeword-table": Entry(
            _declared_kernel("stale-codeword-table", _CodewordTableBuiltOnce),
            "1.12.12",
            "load_into_a_stepped",
            "codeword table built on the first step, not rebuilt by a load",
        ),
        "kernel-step-counter": Entry(
            _declared_kernel("kernel-step-counter", _StepCountsKeptInKernel),
            "1.12.12",
            "load_into_a_stepped",
            "step counts kept by the kernel, not reseeded by a load",
        ),
        "migration-counter-from-step": Entry(
            _optimizer_mutant(
                "migration-counter-from-step", lambda p, **hp: _MissingMomentCountsFromStep(p, **hp)
            ),
            "1.10.8",
            "mode_migration",
            "a second moment created by a mode switch starts at the step count, not 0",
        ),
        "bf16-restore-rounding": Entry(
            _dcp_mutant(
                "bf16-restore-rounding",
                _state_with(restore=clone(restore, _compact_state=_restored_in_parameter_dtype)),
            ),
            "3.6.4",
            "restore_into_a_stepped",
            "restored momentum re-blocked in the parameter's dtype (bf16)",
        ),
        "restore-drops-tail-chunk": Entry(
            _dcp_mutant(
                "restore-drops-tail-chunk",
                _state_with(
                    restore=clone(restore, reblock=proxy(restore.reblock, reblock=_reblock_in_chunks))
                ),
            ),
            "3.6.4",
            "restore_into_a_stepped",
            "chunked re-blocking drops the partial last 64Ki chunk",
        ),
    }
)

#: This section's mutants, for the meta-test (each run is a suite subprocess of several seconds: slow).
STATE_OVER_TIME = (
    "bf16-step-counter",
    "stale-codeword-table",
    "kernel-step-counter",
    "migration-counter-from-step",
    "bf16-restore-rounding",
    "restore-drops-tail-chunk",
)
for _name in STATE_OVER_TIME:
    globals()["mutant_" + _name.replace("-", "_")] = CATALOGUE[_name].implementation
    globals()["tolerant_" + _name.replace("-", "_")] = as_kernel(CATALOGUE[_name].implementation)


# =============================================================================================
# The optimizer's lifecycle (SPEC 4.3.12). Backends written as multi-tensor and fused kernel
# teams write them (a ``gefen_reference.Gefen`` subclass declared as examples/gefen-fast is): each
# has one bug that real multi-tensor kernels have had and that fires only past a list size, on
# gradients taking turns or bucketed in reverse, after a group is added or storage replaced, at a
# hyperparameter's edge, on the period search's own inputs or above its fallback cap. Only the
# lifecycle tests catch them, each in both profiles.


class _ListTailDropped(_Backend):
    """Parameter count: the multi-tensor launch takes lists of at most 128 tensors; a step with
    more runs ``len // 128`` full launches (floor where the ceiling belongs) and drops the rest."""

    CHUNK = 128

    def update_parameters(self, updates):
        updates = list(updates)
        if len(updates) > self.CHUNK:
            updates = updates[: len(updates) // self.CHUNK * self.CHUNK]
        super().update_parameters(updates)


class _PlanCachedByShapes(_Backend):
    """Gradients taking turns: the step's launch plan (which state goes with which tensor) is
    captured once per signature of shapes and dtypes, pointers baked in as a CUDA graph bakes them,
    and replayed for any later step of the same signature: when same-shape experts take turns, the
    first step's experts are stepped again with the new gradients."""

    def update_parameters(self, updates):
        updates = list(updates)
        plans = self.__dict__.setdefault("_plans", {})
        signature = tuple((tuple(u.grad.shape), u.grad.dtype, u.factored) for u in updates)
        baked = plans.setdefault(signature, [(u.param, u.state) for u in updates])
        for (param, entry), u in zip(baked, updates):
            self.update_parameter(param, u.grad, entry, u.hyper, u.factored)


class _StorageCapturedAtFirstStep(_Backend):
    """Storage replaced: the kernel keeps each parameter's data tensor from its first update (a raw
    pointer) and writes there ever after, so after ``p.data = ...`` (``module.to(...)``) the
    parameter the model uses never changes again."""

    def update_parameter(self, p, grad, state, hyper, factored):
        captured = self.__dict__.setdefault("_data", {})
        data = captured.setdefault(id(p), local_tensor(p).data)
        if factored:
            steps.factored_step(data, grad, state, self.codebook, hyper)
        else:
            steps.block_vmean_step(data, grad, state, self.codebook, hyper)


class _GroupTableAtFirstStep(_Backend):
    """A group added after steps: the per-group hyperparameter table is built at the first step; a
    parameter the table does not know (a group added later) is looked up at a clamped index and
    steps with the last group's hyperparameters as the first step saw them."""

    def update_parameters(self, updates):
        updates = list(updates)
        if "_known" not in self.__dict__:
            self._known = {id(u.param) for u in updates}
            self._last = updates[-1].hyper if updates else None
        for u in updates:
            hyper = u.hyper if id(u.param) in self._known or self._last is None else self._last
            self.update_parameter(u.param, u.grad, u.state, hyper, u.factored)


class _ZeroLrSkipped(_Backend):
    """lr 0: a parameter whose lr is 0 is taken for frozen and skipped, so a warm-up from zero
    loses its first step's momentum and second moment (SPEC 1.8: lr scales the update only)."""

    def update_parameter(self, p, grad, state, hyper, factored):
        if hyper.lr == 0.0:
            return
        super().update_parameter(p, grad, state, hyper, factored)


def _as_fp32_pointer(lr: torch.Tensor) -> float:
    """A one-element tensor's bytes read as the fp32 a C kernel's ``float*`` sees: the first four
    bytes of a wider dtype, a narrower one's two bytes as the high half."""
    raw = lr.detach().reshape(1).cpu().view(torch.uint8)
    word = torch.zeros(4, dtype=torch.uint8)
    if raw.numel() >= 4:
        word.copy_(raw[:4])
    else:
        word[4 - raw.numel() :] = raw
    return float(word.view(torch.float32)[0])


class _LrReadAsFp32(_Backend):
    """Tensor lrs of every dtype: the kernel takes the group's lr tensor by pointer as ``float*``:
    right for fp32 (and bf16, whose bits are fp32's high half), wrong for fp64 and fp16."""

    def update_parameters(self, updates):
        lrs = {}
        for group in self.param_groups:
            if torch.is_tensor(group["lr"]):
                for p in group["params"]:
                    lrs[id(p)] = _as_fp32_pointer(group["lr"])
        for u in updates:
            hyper = replace(u.hyper, lr=lrs[id(u.param)]) if id(u.param) in lrs else u.hyper
            self.update_parameter(u.param, u.grad, u.state, hyper, u.factored)


class _DeterministicPathWithoutDecay(_Backend):
    """``deterministic=True``: the kernel's deterministic path (ordered reductions, a second code
    path) was written without weight decay."""

    def update_parameter(self, p, grad, state, hyper, factored):
        if self.deterministic:
            hyper = replace(hyper, weight_decay=0.0)
        super().update_parameter(p, grad, state, hyper, factored)


class _SubstringsMatchedAsGiven(_Backend):
    """``period_one_substrings`` in upper case: the kernel's routing matches the substrings as the
    caller gave them, not lowered (SPEC 1.1.4), so "P1." forces nothing."""

    def __init__(self, params, *args, period_one_substrings=(), **kwargs):
        super().__init__(params, *args, period_one_substrings=period_one_substrings, **kwargs)
        self._as_given = tuple(period_one_substrings)

    def choose_period(self, name, global_shape, local_grad):
        rules = replace(self.period_rules, period_one_substrings=self._as_given)
        if local_grad.numel() == 1 or (
            any(s in name for s in self._as_given) or rules.forces_period_one("", len(global_shape))
        ):
            return 1
        return periods.period_from_squares(periods.squared_gradient(local_grad), tuple(global_shape))


def _one_pass_spread(squared, period):
    """E(p) from a one-pass fp32 variance (E[x^2] - E[x]^2): for near-constant gradients the
    difference of two large numbers, which picks another period than the two-pass float64 one."""
    blocks = torch.from_numpy(squared).float().reshape(-1, period)
    variance = (blocks * blocks).mean(dim=1) - blocks.mean(dim=1) ** 2
    return float(variance.clamp_min(0.0).mean().sqrt())


class _OnePassPeriodSearch(_Backend):
    """The period search's own inputs: the search's block variances in one fp32 pass (SPEC 1.5.4:
    two-pass float64)."""

    _periods = clone(periods, block_spread=_one_pass_spread)

    def choose_period(self, name, global_shape, local_grad):
        squared = self._periods.squared_gradient(local_grad)
        return self._periods.choose_period(self.period_rules, name, tuple(global_shape), squared)


_REDUCTION_TILE = 2048


def _tiled_mean_square(grad_blocks):
    """A block's mean of squares reduced over one 2048-element tile only (the kernel's tile loop
    stops after the first tile), divided by the whole period."""
    g = grad_blocks.float() if grad_blocks.dtype == torch.float16 else grad_blocks
    head = g[:, :_REDUCTION_TILE]
    return (head * head).sum(dim=1, keepdim=True) / grad_blocks.shape[1]


class _ReductionTiledAtTheCap(_Backend):
    """Periods above the fallback cap: the block reduction is tiled at 2048 elements and only the
    first tile is summed, which is right for every period the fallback alone can give."""

    _block_step = staticmethod(clone(steps, block_mean_square=_tiled_mean_square).block_vmean_step)

    def update_parameter(self, p, grad, state, hyper, factored):
        if factored:
            super().update_parameter(p, grad, state, hyper, factored)
        else:
            self._block_step(local_tensor(p), grad, state, self.codebook, hyper)


class _BucketAssumedInOrder(_Backend):
    """Gradients bucketed in reverse: when every gradient of a dtype is a view into one contiguous
    bucket, the kernel slices the bucket from its start in parameter order (as it was packed in
    the first DDP it met), so a reverse bucket hands each parameter another one's gradient."""

    def update_parameters(self, updates):
        updates = list(updates)
        by_storage = {}
        for u in updates:
            by_storage.setdefault((u.grad.dtype, u.grad.untyped_storage().data_ptr()), []).append(u)
        for (dtype, _), group in by_storage.items():
            total = sum(u.grad.numel() for u in group)
            base = min(u.grad.storage_offset() for u in group)
            if len(group) < 2 or any(not u.grad.is_contiguous() for u in group):
                continue
            flat = torch.empty(0, dtype=dtype, device=group[0].grad.device).set_(
                group[0].grad.untyped_storage(), base, (total,)
            )
            start = 0
            sliced = {}
            for u in group:
                sliced[id(u)] = flat[start : start + u.grad.numel()].view(u.grad.shape)
                start += u.grad.numel()
            updates = [replace(u, grad=sliced[id(u)]) if id(u) in sliced else u for u in updates]
        super().update_parameters(updates)


_LIFECYCLE = "lifecycle_matches_reference or group_added_after_steps"

#: name -> (class, clause, selection, bug)
LIFECYCLE_MUTANTS = {
    "list-tail-dropped": (
        _ListTailDropped,
        "4.3.12",
        _LIFECYCLE,
        "a step of more than 128 tensors drops the tail",
    ),
    "plan-cached-by-shapes": (
        _PlanCachedByShapes,
        "4.3.12",
        _LIFECYCLE,
        "a launch plan replayed for any step of the same shapes, pointers baked in",
    ),
    "storage-captured-at-first-step": (
        _StorageCapturedAtFirstStep,
        "4.3.12",
        _LIFECYCLE,
        "updates written to the storage a parameter had at its first step",
    ),
    "group-table-at-first-step": (
        _GroupTableAtFirstStep,
        "1.2.7",
        _LIFECYCLE,
        "a group added after steps steps with the last group known at the first step",
    ),
    "zero-lr-skipped": (
        _ZeroLrSkipped,
        "4.3.12",
        _LIFECYCLE,
        "a parameter whose lr is 0 does not step its state",
    ),
    "lr-read-as-fp32": (
        _LrReadAsFp32,
        "4.3.12",
        _LIFECYCLE,
        "a tensor lr's bytes read as fp32 whatever its dtype",
    ),
    "deterministic-path-without-decay": (
        _DeterministicPathWithoutDecay,
        "4.3.12",
        _LIFECYCLE,
        "deterministic=True steps without weight decay",
    ),
    "substrings-matched-as-given": (
        _SubstringsMatchedAsGiven,
        "4.3.12",
        _LIFECYCLE,
        "period_one_substrings matched without lowering",
    ),
    "one-pass-period-search": (
        _OnePassPeriodSearch,
        "1.5.4",
        _LIFECYCLE,
        "the period search's variances in one fp32 pass",
    ),
    "reduction-tiled-at-the-cap": (
        _ReductionTiledAtTheCap,
        "1.8.3",
        _LIFECYCLE,
        "a block reduction sums only its first 2048 elements",
    ),
    "bucket-assumed-in-order": (
        _BucketAssumedInOrder,
        "4.3.12",
        _LIFECYCLE,
        "a gradient bucket sliced in parameter order whatever its packing",
    ),
}
CATALOGUE.update(
    {
        name: Entry(_backend(name, cls), clause, select, bug)
        for name, (cls, clause, select, bug) in LIFECYCLE_MUTANTS.items()
    }
)
for _name in LIFECYCLE_MUTANTS:
    globals()["mutant_" + _name.replace("-", "_")] = CATALOGUE[_name].implementation
    globals()["tolerant_" + _name.replace("-", "_")] = as_kernel(CATALOGUE[_name].implementation)


# ------------------------------------------------------------- async saves at scale (SPEC 4.3.7)

_LARGE_SLOT = 65536


def _split_off_small_placeholders(tree):
    """The async writer's staging with a memory saving: a slot of more than 64Ki elements is not
    snapshotted at the call but left deferred, so its dense form is built when the background
    write reaches it, from whatever the optimizer holds by then."""
    rest, snapshots = {}, {}
    for key, value in tree.items():
        if placeholder.is_placeholder(value):
            snapshots[key] = value if value.numel() > _LARGE_SLOT else value.snapshot()
        elif isinstance(value, dict):
            sub_rest, sub_snapshots = _split_off_small_placeholders(value)
            rest[key] = sub_rest
            if sub_snapshots:
                snapshots[key] = sub_snapshots
        else:
            rest[key] = value
    return rest, snapshots


_LAZY_WRITER = clone(writer_module, _split_off_placeholders=_split_off_small_placeholders)
_lazy_large = replace(
    _dcp_mutant("async-large-slots-deferred", reference_dcp),
    async_writer=lambda path: _LAZY_WRITER.GefenFileSystemWriter(path),
)
CATALOGUE["async-large-slots-deferred"] = Entry(
    _lazy_large,
    "2.6.1",
    "async_checkpoint_of_large_slots",
    "an async save snapshots slots up to 64Ki elements at the call and builds larger ones at write time",
)
mutant_async_large_slots_deferred = _lazy_large
tolerant_async_large_slots_deferred = as_kernel(_lazy_large)


# ------------------------------------------------------- restores by the target's rules (SPEC 3.6)


def _uniform_when_none(pieces, device):
    """The rank's codebook after a restore, with a default for a rank left without one: a uniform
    grid, so that no kernel ever sees None, where SPEC 3.6.3 leaves None and the next step learns
    one from the gradients."""
    learned = reblock.relearn_codebook(pieces, device)
    return torch.linspace(-1.0, 1.0, 256, dtype=torch.float32, device=device) if learned is None else learned


CATALOGUE["restore-default-period-rules"] = Entry(
    _dcp_mutant(
        "restore-default-period-rules",
        _state_with(
            restore=clone(
                restore,
                optimizer_view=proxy(optimizer_view, period_rules_of=lambda opt: periods.PeriodRules()),
            )
        ),
    ),
    "3.6.2",
    "continuation and forced",
    "a restore re-derives periods with default rules, ignoring the target's force-period-one options",
)
CATALOGUE["restore-uniform-codebook"] = Entry(
    _dcp_mutant(
        "restore-uniform-codebook",
        _state_with(restore=clone(restore, reblock=proxy(reblock, relearn_codebook=_uniform_when_none))),
    ),
    "3.6.3",
    "continuation and never",
    "a rank that a restore leaves without a codebook gets a uniform one instead of learning one",
)


# ------------------------------------------------------- the load's collective (SPEC 3.2)


def _layouts_compared_at_save_only(identities, message=agreement.DIVERGENT_LAYOUT_MESSAGE):
    """The cross-rank layout comparison of a save, skipped by a load (which trusts ``dcp.load``'s
    ``state_dict()`` to have made it)."""
    if message != agreement.DIVERGENT_LAYOUT_LOAD_MESSAGE:
        agreement.require_identical_layouts(identities, message)


class _MappingCheckedFirst(state.GefenDCPState):
    """A load that refuses a state dict that is not a mapping at once, before the agreement: the
    other ranks wait in its collective for the refusing one."""

    def load_state_dict(self, state_dict):
        if not isinstance(state_dict, dict):
            raise TypeError(f"a Gefen DCP state dict must be a dict, got {type(state_dict).__name__}")
        super().load_state_dict(state_dict)


CATALOGUE["load-layouts-unchecked"] = Entry(
    _dcp_mutant(
        "load-layouts-unchecked",
        _state_with(agreement=proxy(agreement, require_identical_layouts=_layouts_compared_at_save_only)),
    ),
    "3.2.4",
    "direct_load and renamed",
    "a direct load_state_dict() does not compare the ranks' layouts",
)
CATALOGUE["load-refused-before-agreement"] = Entry(
    _dcp_mutant("load-refused-before-agreement", SimpleNamespace(GefenDCPState=_MappingCheckedFirst)),
    "3.2.1",
    "direct_load and not-a-mapping",
    "a load refuses a state dict that is not a mapping before its agreement: the other ranks hang",
)


# ------------------------------------------------------------ an adapter kept across saves (SPEC 2.3.3)


class _SlotsNumberedOnce(state.GefenDCPState):
    """The adapter numbers the optimizer's slots at its first save and keeps that numbering, where
    SPEC 2.3.3 re-derives it on every call: a retained adapter misses ``add_param_group``."""

    def state_dict(self):
        first = getattr(self, "_numbered", None)
        if first is None:
            result = super().state_dict()
            self._numbered = self._slots
            return result
        numbering = clone(layout, collect_slots=lambda optimizer: first)
        adapter = clone(state, layout=numbering).GefenDCPState(self.optimizer)
        return adapter.state_dict()


class _PlaceholdersKept(state.GefenDCPState):
    """The adapter keeps the placeholders of its first save (and so the dense buffers DCP's default
    path builds in them) and hands them to every later save of the same layout, where each
    ``state_dict()`` reflects the live state (SPEC 2.3.3)."""

    def state_dict(self):
        result = super().state_dict()
        kept = self.__dict__.setdefault("_kept", {})
        for key, value in result.items():
            if not placeholder.is_placeholder(value):
                continue
            old = kept.get(key)
            if old is not None and old.shape == value.shape:
                result[key] = old
            else:
                kept[key] = value
        return result


for _name, _adapter, _bug in (
    (
        "adapter-numbers-slots-once",
        _SlotsNumberedOnce,
        "a retained adapter keeps the slots of its first save",
    ),
    (
        "adapter-keeps-placeholders",
        _PlaceholdersKept,
        "a retained adapter reuses its first save's placeholders",
    ),
):
    CATALOGUE[_name] = Entry(
        _dcp_mutant(_name, SimpleNamespace(GefenDCPState=_adapter)), "2.3.3", "retained_adapter", _bug
    )
    globals()["mutant_" + _name.replace("-", "_")] = CATALOGUE[_name].implementation
    globals()["tolerant_" + _name.replace("-", "_")] = as_kernel(CATALOGUE[_name].implementation)

for _name in (
    "restore-default-period-rules",
    "restore-uniform-codebook",
    "load-layouts-unchecked",
    "load-refused-before-agreement",
):
    globals()["mutant_" + _name.replace("-", "_")] = CATALOGUE[_name].implementation
    globals()["tolerant_" + _name.replace("-", "_")] = as_kernel(CATALOGUE[_name].implementation)
