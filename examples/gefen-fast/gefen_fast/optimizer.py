"""``gefen_fast.Gefen``: the Gefen optimizer with fused CPU kernels (SPEC Part 1, tolerance profile).

Everything except the arithmetic is the reference's: the constructor and its validation,
parameter groups and names, the step's orchestration (gradient preflight, the GradScaler
protocol, state creation: SPEC 1.10), the native state dict and its validating load (SPEC 1.1-1.3,
1.11, 1.12) are inherited from ``reference.Gefen``. Three methods are this backend's own:

* :meth:`Gefen._update` runs the steady-step kernels of :mod:`gefen_fast.kernels` for CPU
  fp32/bf16/fp16 tensors, and the reference's torch operations elsewhere (CUDA, fp64);
* :meth:`Gefen._learn_codebook` and :meth:`Gefen._prepare_state` are the reference's with the
  period search and the codebook learning replaced by the exact C versions
  (:mod:`gefen_fast.period_search`, :mod:`gefen_fast.codebook_learning`): the same periods and
  the same codebook, bit for bit, computed faster.

So the state layout is the reference's in every case and the reference's DCP adapter serves this
class through its declared state layout (``reference.dcp.STATE_LAYOUT``, SPEC 2.3.6).
"""

from __future__ import annotations

import gefen_reference as reference
import torch
from gefen_reference.dcp import STATE_LAYOUT
from gefen_reference.native_state import local_tensor
from gefen_reference.periods import check_period_divides
from gefen_reference.steps import StepHyper

from . import codebook_learning, kernels, period_search


class Gefen(reference.Gefen):
    """Gefen with fused kernels; the reference's constructor, step order, state format and checkpoint rules."""

    #: Declares the reference's state layout protocol, so ``reference.dcp.GefenDCPState`` accepts it.
    gefen_state_layout = STATE_LAYOUT

    @torch.no_grad()
    def step(self, closure=None):
        """The reference's step (SPEC 1.10); the kernel updates it collects run in one call at its end.

        Parameters are independent, so running their kernels together after the orchestration
        changes no result. If the orchestration raises part-way (a period that does not divide,
        say), the parameters it had reached are still updated, as the reference would have done.
        """
        batch = self.__dict__["_kernel_batch"] = []
        try:
            return super().step(closure)
        finally:
            self.__dict__["_kernel_batch"] = None
            kernels.run(batch)

    def _update(self, p, grad, state, hyper: StepHyper, factored: bool) -> None:
        local = local_tensor(p)
        if kernels.handles(local, grad):
            tables = self.__dict__.setdefault("_codeword_tables", kernels.CodewordTables())
            pending = kernels.prepare(local, grad, state, tables, self.codebook, hyper, factored)
            if pending is not None:
                batch = self.__dict__.get("_kernel_batch")
                if batch is None:
                    kernels.run([pending])
                else:
                    batch.append(pending)
                return
        super()._update(p, grad, state, hyper, factored)

    @torch.no_grad()
    def _learn_codebook(self) -> None:
        """The reference's ``_learn_codebook`` (SPEC 1.6.1, 1.6.9, 1.6.10: periods staged and committed
        only with the codebook) with the C period search and codebook learning."""
        periods, pieces = {}, []
        for _, name, p in self.named_params():
            if p.grad is None:
                continue
            flat = local_tensor(p.grad).detach().reshape(-1)
            if flat.numel() == 0:
                continue
            period = self.state[p].get("automatic_period")
            if period is None:
                period = period_search.choose_period(self.period_rules, name, tuple(p.shape), flat)
            check_period_divides(name, flat.numel(), period)
            periods[p] = period
            pieces.append((flat, period))
        first = self.param_groups[0]["params"][0]
        device = local_tensor(first.grad if first.grad is not None else first).device
        codebook = codebook_learning.learn_codebook(pieces, device)
        if codebook is None:
            return
        for p, period in periods.items():
            self.state[p]["automatic_period"] = period
        self.codebook = codebook

    def _prepare_state(self, name: str, p, grad, state: dict, factored: bool) -> None:
        """The reference's, with the period of a parameter first stepped after the codebook step
        chosen by the C search (the same period)."""
        if "step" not in state and state.get("automatic_period") is None:
            state["automatic_period"] = period_search.choose_period(self.period_rules, name, tuple(p.shape), grad)
        super()._prepare_state(name, p, grad, state, factored)
