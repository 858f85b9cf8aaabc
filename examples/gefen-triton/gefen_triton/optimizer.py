"""``gefen_triton.Gefen``: the Gefen optimizer with Triton kernels (SPEC Part 1, tolerance profile).

Everything but the per-element arithmetic is the reference's (``gefen_reference.Gefen``): the
constructor and its validation, groups and names, the step's order (gradient preflight, the
GradScaler protocol, codebook learning, state creation: SPEC 1.10), the period search and the
codebook learning (exact obligations, SPEC 0.4.2), and the native state dict and its load (SPEC
1.11, 1.12). This backend overrides one extension hook (SPEC 4.1.8): :meth:`Gefen.update_parameters`
hands the step's parameters to :class:`gefen_triton.launch.StepKernels`, a few multi-tensor
launches per step; a parameter the kernels do not take (fp64, a gradient of another dtype, a state
of an unexpected layout) gets the reference's per-parameter step.

The kernels run on GPU tensors when compiled and on CPU tensors under Triton's interpreter
(``TRITON_INTERPRET=1``, read when triton is first imported). A parameter on a device the current
mode cannot reach is refused when the optimizer is built and at every step, with an error that
names the fix: this backend never falls back silently and never changes the environment.

The state layout is the reference's, declared with ``gefen_state_layout``, so the reference's DCP
adapter serves this class (SPEC 2.3.6).
"""

from __future__ import annotations

import gefen_reference as reference
from gefen_reference.dcp import STATE_LAYOUT
from gefen_reference.native_state import local_tensor

from . import launch


class Gefen(reference.Gefen):
    """Gefen with Triton kernels; the reference's constructor, step order, state format and
    checkpoint rules."""

    #: Declares the reference's state layout protocol, so ``gefen_reference.dcp.GefenDCPState`` accepts it.
    gefen_state_layout = STATE_LAYOUT

    def __init__(self, params, *args, **kwargs):
        super().__init__(params, *args, **kwargs)
        for _, name, p in self.named_params():
            launch.check_device(local_tensor(p).device, f"parameter {name!r}")
        self._kernels = launch.StepKernels()

    def update_parameters(self, updates) -> None:
        """The step's parameters the kernels take, in one set of launches after the others, which
        get the reference's :meth:`update_parameter` in order.

        Parameters are independent (SPEC 4.1.8 item 1), so running the kernels last changes no
        result. Counters advance and staged copies are written back only once every launch
        returned. If a reference update raises, the kernel updates collected before it still run,
        as the reference would have left those parameters."""
        batch = []
        try:
            for u in updates:
                local = local_tensor(u.param)
                if launch.takes(local, u.grad, u.state, u.factored):
                    launch.check_device(local.device, f"parameter {u.name!r}")
                    batch.append(launch.Entry(local, u.grad, u.state, u.hyper, u.factored))
                else:
                    self.update_parameter(u.param, u.grad, u.state, u.hyper, u.factored)
        finally:
            if batch:
                self._kernels.run(batch, self.codebook)
