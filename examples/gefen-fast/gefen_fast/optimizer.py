"""``gefen_fast.Gefen``: the Gefen optimizer with fused CPU kernels (SPEC Part 1, tolerance profile).

Everything except the arithmetic of a step is the reference's: the constructor and its
validation, parameter groups and names, the step's orchestration (gradient preflight, the
GradScaler protocol, periods and the codebook, state creation: SPEC 1.6, 1.10), the native
state dict and its validating load (SPEC 1.1-1.3, 1.11, 1.12) are inherited from
``reference.Gefen``, which calls :meth:`Gefen._update` once per parameter. That one method runs
the kernels of :mod:`gefen_fast.cpu_kernels` for CPU fp32/bf16/fp16 tensors, and the reference's
torch operations elsewhere (CUDA, fp64), so the state layout is the same in every case and the
reference's DCP adapter serves this class through its declared state layout
(``reference.dcp.STATE_LAYOUT``, SPEC 2.3.6).
"""

from __future__ import annotations

import gefen_reference as reference
from gefen_reference.dcp import STATE_LAYOUT
from gefen_reference.native_state import local_tensor
from gefen_reference.steps import StepHyper

from . import kernels


class Gefen(reference.Gefen):
    """Gefen with fused kernels; the reference's constructor, step order, state format and checkpoint rules."""

    #: Declares the reference's state layout protocol, so ``reference.dcp.GefenDCPState`` accepts it.
    gefen_state_layout = STATE_LAYOUT

    def _update(self, p, grad, state, hyper: StepHyper, factored: bool) -> None:
        local = local_tensor(p)
        if not kernels.handles(local, grad):
            return super()._update(p, grad, state, hyper, factored)
        tables = self.__dict__.setdefault("_codeword_tables", kernels.CodewordTables())
        if factored:
            kernels.factored_update(local, grad, state, tables, self.codebook, hyper)
        else:
            kernels.block_update(local, grad, state, tables, self.codebook, hyper)
