"""Cross-rank agreement for the collective ``state_dict()``.

``dcp.save`` and ``dcp.load`` call ``state_dict()`` on every rank before their own
planning collectives. A rank that raised alone would leave its peers waiting in
those collectives, so every rank-local failure is first made known to the whole
group, and every rank's layout is compared with every other rank's.

Both collectives run on the default (WORLD) group, with their small control
tensors on a device the backend can reduce.
"""

from __future__ import annotations

import hashlib

import torch
import torch.distributed as dist

ABORT_MESSAGE = (
    "Gefen DCP state_dict stopped on every rank before anything was written or read: "
    "another rank failed its checkpoint checks (that rank raised the actual error)."
)

LOAD_ABORT_MESSAGE = (
    "Gefen DCP load aborted before commit on every rank: another rank failed to validate "
    "or stage its part of the restore (that rank raised the actual error), so no rank "
    "changed its optimizer."
)

DIVERGENT_LAYOUT_MESSAGE = (
    "Gefen DCP save aborted: ranks hold different parameter layouts (name, group "
    "or global shape differ for the same slot), so DCP would stitch one tensor "
    "together from different parameters. Build every rank's optimizer from the "
    "same named parameters in the same group order."
)


def _world_size() -> int:
    if not dist.is_available() or not dist.is_initialized():
        return 1
    return dist.get_world_size()


def control_device(group=None) -> torch.device:
    """Where a control tensor for ``group`` must live."""
    group = dist.group.WORLD if group is None else group
    bound = getattr(group, "bound_device_id", None)
    if bound is not None:
        return torch.device(bound)
    backend = str(dist.get_backend(group)).lower()
    if "nccl" in backend:
        return torch.device("cuda", torch.cuda.current_device())
    if "xccl" in backend:
        return torch.device("xpu", torch.xpu.current_device())
    return torch.device("cpu")


@torch.no_grad()
def any_rank_failed(failed_here: bool) -> bool:
    """True on every rank if any rank reports a failure (one MAX all-reduce)."""
    if _world_size() < 2:
        return bool(failed_here)
    flag = torch.tensor([1 if failed_here else 0], dtype=torch.int32, device=control_device())
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def settle(local_error, abort_message: str) -> None:
    """End an agreement region (SPEC 2.3.4, 3.2.3). **Collective.**

    If any rank failed, every rank raises: a failing rank its own ``local_error``, the others
    RuntimeError(``abort_message``). Returns only when every rank succeeded.
    """
    if any_rank_failed(local_error is not None):
        if local_error is not None:
            raise local_error
        raise RuntimeError(abort_message)


def layout_fingerprint(identities) -> list:
    """Two nonnegative 63-bit words summarizing an identity list."""
    canonical = repr([(d["name"], d["group"], tuple(d["shape"])) for d in identities])
    digest = hashlib.sha256(canonical.encode("utf-8")).digest()
    mask = (1 << 63) - 1
    return [int.from_bytes(digest[0:8], "big") & mask, int.from_bytes(digest[8:16], "big") & mask]


@torch.no_grad()
def require_identical_layouts(identities, message: str = DIVERGENT_LAYOUT_MESSAGE) -> None:
    """Raise on every rank unless all ranks hold the same identity list.

    One MIN all-reduce over ``[w0, w1, -w0, -w1]`` yields the group-wide minimum
    and maximum of each word; they agree exactly when every rank's fingerprint
    is the same. The verdict is the same on every rank, so all raise or none do.
    """
    if _world_size() < 2:
        return
    words = layout_fingerprint(identities)
    packed = torch.tensor(words + [-w for w in words], dtype=torch.int64, device=control_device())
    dist.all_reduce(packed, op=dist.ReduceOp.MIN)
    lowest = packed[:2].tolist()
    highest = [-v for v in packed[2:].tolist()]
    if lowest != highest:
        raise RuntimeError(message)


DIVERGENT_LAYOUT_LOAD_MESSAGE = (
    "Gefen DCP load aborted before commit: ranks hold different parameter layouts (name, "
    "group or global shape differ for the same slot), so their restores would not describe "
    "the same model. Build every rank's optimizer from the same named parameters in the "
    "same group order."
)

# The per-slot scalars every rank writes; DCP keeps one rank's copy of each.
SLOT_SCALARS = ("initialized", "step", "vmean_step")

_NO_VOTE = torch.iinfo(torch.int64).max


@torch.no_grad()
def agreed_slot_scalars(local) -> list:
    """Settle each slot's replicated scalars across ranks (SPEC 2.4.5). **Collective.**

    ``local`` holds one ``(votes, (initialized, step, vmean_step))`` per slot, in
    slot order, with the same length on every rank. A rank votes for a slot when
    it holds part of the parameter (or, for a parameter with no elements at all,
    always). A rank whose shard of a non-empty parameter is empty never stepped
    it, so its fresh zeros say nothing about the slot and it does not vote.

    Returns the agreed triple per slot, identical on every rank. Voters must all
    hold the same triple; if they do not, every rank raises the same
    RuntimeError, since no single value would describe the slot.

    One MIN all-reduce over ``[v, -v]`` per slot (non-voters contribute the
    largest int64, which never wins) yields the voters' minimum and maximum.
    """
    if _world_size() < 2:
        return [tuple(triple) for _, triple in local]
    rows = []
    for votes, triple in local:
        values = [int(v) for v in triple]
        rows.append(values + [-v for v in values] if votes else [_NO_VOTE] * 6)
    packed = torch.tensor(rows, dtype=torch.int64, device=control_device()).reshape(len(rows), 6)
    dist.all_reduce(packed, op=dist.ReduceOp.MIN)
    agreed = []
    for index, row in enumerate(packed.tolist()):
        lowest, highest = row[:3], [-v for v in row[3:]]
        if lowest != highest:
            raise RuntimeError(
                f"Gefen DCP save aborted: the ranks holding slot {index} disagree on its "
                f"(initialized, step, vmean_step): between {tuple(lowest)} and {tuple(highest)}. "
                "DCP would keep one rank's copy and write a torn slot; the ranks sharing a "
                "parameter must step it together."
            )
        agreed.append(tuple(lowest))
    return agreed
