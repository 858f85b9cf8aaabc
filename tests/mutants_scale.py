"""Mutants that fire only at scale or over long runs (SPEC 4.3.16), each modelled on a bug users of
large models met: an element index formed in fp32, a histogram that reads a prefix sample of a
large parameter, a bf16 write that truncates past 2^20 elements, a handle table of fixed size, an
empty tensor ending a launch, and a schedule kept every 1000 steps (of the global step, or of the
optimizer object's own count).

Each passes the default tier of the suite (its cases are small and short) and is caught by the
case of :mod:`gefen_conformance.suite.scale_examples` it names. ``SCALE_MUTANTS`` maps a name to
``(make_optimizer, case table, case name, profiles it is caught in, bug)``, the table by its name in
that module (read when a case is needed: this module imports into a suite that has none, so that
``mutant_<name>`` can be certified against an older suite); tests/test_scale_mutants.py
proves each in-process against its case: the cheap ones in every run, the 2^25-element ones under
the ``scale`` marker (minutes; benchmarks/scale_tier.py runs them and commits the results).

A period search that scores a prefix sample is not among them: the drifting case's whole
parameter and its prefix both search to no period (the search finds a period where a larger block
spreads less, which neither half shows), so both fall back to the same one; a case that separates
them is not built yet.

Nor are histogram counts accumulated in fp32 (they stop at 2^24): on the tier's one-bin
case the saturated bin keeps a codeword of its own, so the codebook is bitwise the same (an
equivalent mutant there); moving a codeword needs two bins past 2^24, a first step of more than 2^25
elements, which the tier does not run.
"""

from __future__ import annotations

import dataclasses

import gefen_reference as reference
from gefen_conformance.implementations import registry
from gefen_conformance.implementations.contract import CPU_BIT_EXACT

from .source_mutants import mutated_gefen

BOTH = ("torch-exact", "tolerance")

_FP32_INDEXED = '''def _fp32_indexed(magnitude, shape):
    """Each element's block magnitude through an element index formed in fp32."""
    rows, period = shape
    index = torch.arange(rows * period, dtype=torch.float32)
    block = torch.floor(index / period).long().clamp(max=rows - 1)
    return magnitude.reshape(-1)[block].reshape(rows, period)


def block_mean_square('''

_TRUNCATING_WRITE = '''def _subtract_flat(param: Tensor, update: Tensor) -> None:
    """``param -= update``; a bf16 parameter's elements past 2^20 truncated, not rounded."""
    work = param if param.is_contiguous() else param.contiguous()
    if work.dtype == torch.bfloat16 and work.numel() > 1 << 20:
        exact = work.view(-1).float() - update.reshape(-1).float()
        truncated = (exact.view(torch.int32) & ~0xFFFF).view(torch.float32).to(torch.bfloat16)
        work.view(-1).add_(update.reshape(-1), alpha=-1)
        work.view(-1)[1 << 20 :] = truncated[1 << 20 :]
    else:
        work.view(-1).add_(update.reshape(-1), alpha=-1)
    if work is not param:
        param.copy_(work)


def _unused_subtract_flat('''


def _declared(cls):
    """``cls`` declaring the reference's state layout in its own class body, as a backend built on
    it does (SPEC 2.3.6), so that the reference's DCP adapter takes it."""
    from gefen_reference import dcp

    cls.gefen_state_layout = dcp.STATE_LAYOUT
    return cls


def _from(**edits):
    gefen = _declared(mutated_gefen(**edits))
    return lambda params, **kw: gefen(params, **kw)


class _HandleTable(reference.Gefen):
    """Parameters past the 16,384th of a step keep their values (their state advances)."""

    HANDLES = 16384

    def update_parameters(self, updates):
        for k, u in enumerate(updates):
            param = u.param if k < self.HANDLES else u.param.detach().clone()
            self.update_parameter(param, u.grad, u.state, u.hyper, u.factored)


class _EmptyEndsLaunch(reference.Gefen):
    """A group whose last parameter is empty and has a gradient updates none of its parameters."""

    def update_parameters(self, updates):
        skipped = set()
        for group in self.param_groups:
            last = group["params"][-1] if group["params"] else None
            if last is not None and last.numel() == 0 and last.grad is not None:
                skipped |= {id(p) for p in group["params"]}
        super().update_parameters([u for u in updates if id(u.param) not in skipped])


class _RefreshSinceConstruction(reference.Gefen):
    """The codebook relearned every 1000 steps this object made (its own count since construction,
    which a synthesized or loaded state does not move)."""

    def step(self, closure=None):
        loss = super().step(closure)
        self._made = getattr(self, "_made", 0) + 1
        if self._made % 1000 == 0:
            self.codebook = None
        return loss


class _RefreshEvery1000(reference.Gefen):
    """The codebook relearned at every 1000th global step (a refresh schedule left on)."""

    def step(self, closure=None):
        loss = super().step(closure)
        if self.global_step % 1000 == 0:
            self.codebook = None
        return loss


SCALE_MUTANTS = {
    "fp32-element-index": (
        _from(
            steps=[
                ("def block_mean_square(", _FP32_INDEXED),
                ("updated.div_(magnitude)", "updated.div_(_fp32_indexed(magnitude, updated.shape))"),
            ]
        ),
        "SCALE",
        "block-2^25-fp32-from-state",
        BOTH,
        "each element's block magnitude found through an element index formed in fp32",
    ),
    "prefix-histogram": (
        _from(
            codebook=(
                "u = block_normalised(flat, period).reshape(-1)",
                "u = block_normalised(flat[: (1 << 24) // period * period], period).reshape(-1)",
            )
        ),
        "SCALE",
        "fresh-2^25-drifting",
        ("torch-exact",),
        "the codebook's histogram counts the first 2^24 elements of a larger parameter",
    ),
    "bf16-truncation-past-2^20": (
        _from(steps=[("def _subtract_flat(", _TRUNCATING_WRITE)]),
        "SCALE",
        "block-2^25-bf16-from-state",
        BOTH,
        "a bf16 parameter's elements past 2^20 written by truncation instead of rounding to nearest",
    ),
    "handle-table-of-16384": (
        _declared(_HandleTable),
        "SCALE",
        "count-20480-last-empty",
        BOTH,
        "parameters past the 16,384th of a step are not written (their state advances)",
    ),
    "empty-tensor-ends-launch": (
        _declared(_EmptyEndsLaunch),
        "EVERY_TIER",
        "zero-element-last-of-its-group",
        BOTH,
        "an empty tensor last in a group makes the group's other tensors skip their update",
    ),
    "codebook-refresh-every-1000": (
        _declared(_RefreshEvery1000),
        "EVERY_TIER",
        "across-1000",
        BOTH,
        "the codebook relearned every 1000 global steps",
    ),
    "refresh-every-1000-own-steps": (
        _declared(_RefreshSinceConstruction),
        "LONG_LIFE",
        "long_life",
        BOTH,
        "the codebook relearned every 1000 steps the optimizer object made since construction",
    ),
}

#: The mutants whose case is the scale tier's (2^25 elements, or 10^4 steps): minutes each.
LARGE = sorted(name for name, entry in SCALE_MUTANTS.items() if entry[1] in ("SCALE", "LONG_LIFE"))
CHEAP = sorted(name for name, entry in SCALE_MUTANTS.items() if entry[1] == "EVERY_TIER")


def case_of(name: str):
    """The input-space case that catches mutant ``name``, or ``"long_life"`` for the scale tier's
    long life (gefen_conformance.suite.scale_examples.long_life_problems)."""
    from gefen_conformance.suite import scale_examples

    _, table, case, _, _ = SCALE_MUTANTS[name]
    return case if table == "LONG_LIFE" else getattr(scale_examples, table)[case]


def implementation(name: str, profile: str = "torch-exact"):
    """Mutant ``name`` declared as the reference is (torch-exact) or as a kernel is (tolerance)."""
    base = registry.resolve("reference")
    caps = base.capabilities - ({CPU_BIT_EXACT} if profile == "tolerance" else set())
    return dataclasses.replace(
        base, name=f"scale-{name}", make_optimizer=SCALE_MUTANTS[name][0], capabilities=caps
    )


for _name in SCALE_MUTANTS:
    globals()["mutant_" + _name.replace("-", "_").replace("^", "")] = implementation(_name)
    globals()["tolerant_" + _name.replace("-", "_").replace("^", "")] = implementation(_name, "tolerance")
