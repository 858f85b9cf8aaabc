"""``gefen_fast.Gefen``: the Gefen optimizer with fused CPU kernels (SPEC Part 1, tolerance profile).

Everything except the arithmetic is the reference's: the constructor and its validation,
parameter groups and names, the step's orchestration (gradient preflight, the GradScaler
protocol, state creation: SPEC 1.10), the native state dict and its validating load (SPEC 1.1-1.3,
1.11, 1.12) are inherited from ``gefen_reference.Gefen``. This backend overrides only the
reference's three extension hooks (SPEC 4.1.8):

* :meth:`Gefen.update_parameters` runs the steady-step kernels of :mod:`gefen_fast.kernels` for
  CPU fp32/bf16/fp16 tensors in one kernel call per step, and hands every other parameter (CUDA,
  fp64, a state layout the kernels do not take) to the reference's per-parameter update;
* :meth:`Gefen.choose_period` and :meth:`Gefen.learn_codebook` are the exact C versions of the
  period search and the codebook learning (:mod:`gefen_fast.period_search`,
  :mod:`gefen_fast.codebook_learning`): the same periods and the same codebook, bit for bit,
  computed faster.

So the state layout is the reference's in every case and the reference's DCP adapter serves this
class through its declared state layout (``gefen_reference.dcp.STATE_LAYOUT``, SPEC 2.3.6).
"""

from __future__ import annotations

import gefen_reference as reference
from gefen_reference.dcp import STATE_LAYOUT
from gefen_reference.native_state import local_tensor

from . import codebook_learning, kernels, period_search


class Gefen(reference.Gefen):
    """Gefen with fused kernels; the reference's constructor, step order, state format and checkpoint
    rules."""

    #: Declares the reference's state layout protocol, so ``gefen_reference.dcp.GefenDCPState`` accepts it.
    gefen_state_layout = STATE_LAYOUT

    def update_parameters(self, updates) -> None:
        """Every update the kernels take, in one kernel call at the end; the others, in order, by
        the reference's :meth:`update_parameter`.

        Parameters are independent (SPEC 4.1.8 item 1), so running the kernels last changes no
        result. The kernel work is prepared without changing anything and committed only after the
        call succeeded (:func:`gefen_fast.kernels.run`). If a reference update raises, the kernel
        updates collected before it still run, as the reference would have left those parameters."""
        tables = self.__dict__.setdefault("_codeword_tables", kernels.CodewordTables())
        batch = []
        try:
            for u in updates:
                local = local_tensor(u.param)
                pending = (
                    kernels.prepare(local, u.grad, u.state, tables, self.codebook, u.hyper, u.factored)
                    if kernels.handles(local, u.grad)
                    else None
                )
                if pending is None:
                    self.update_parameter(u.param, u.grad, u.state, u.hyper, u.factored)
                else:
                    batch.append(pending)
        finally:
            kernels.run(batch)

    def choose_period(self, name: str, global_shape: tuple, local_grad) -> int:
        """The reference's period (SPEC 1.5.2) by the C search
        (:func:`gefen_fast.period_search.choose_period`)."""
        return period_search.choose_period(self.period_rules, name, tuple(global_shape), local_grad)

    def learn_codebook(self, pieces, device):
        """The reference's codebook (SPEC 1.6) by the C histogram and solver."""
        return codebook_learning.learn_codebook(pieces, device)
