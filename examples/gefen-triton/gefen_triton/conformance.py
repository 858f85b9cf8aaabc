"""``triton`` as the conformance suite sees it: ``pytest --impl=triton`` (SPEC 4.1).

Registered in this distribution's ``pyproject.toml`` under the entry-point group
``gefen_conformance.implementations``. The DCP adapter, planner and async writer are the
reference's (``gefen_conformance.with_reference_adapter``): ``gefen_triton.Gefen`` declares the
reference's state layout (``gefen_reference.dcp.STATE_LAYOUT``, SPEC 2.3.6). Judged by the
tolerance profile: no ``cpu-bit-exact`` claim (fp32 sums in another order, an IEEE square root,
fp32 squares for bf16).
"""

from __future__ import annotations

import gefen_triton
from gefen_conformance import (
    DCP_ASYNC_SAVE,
    DCP_RESHARD,
    DCP_SAVE_PLANNER,
    FACTORED_V,
    NATIVE_STATE_DICT,
    with_reference_adapter,
)


def _make_optimizer(params, **hyperparameters):
    return gefen_triton.Gefen(params, **hyperparameters)


def _prepare(device):
    """Import triton and run every kernel variant once on ``device`` (compiling each when compiled),
    so that no scenario pays for it inside a deadline (SPEC 4.2.11); refuses a CPU device without
    ``TRITON_INTERPRET=1`` and a GPU under it, naming the fix."""
    from gefen_triton import warmup

    warmup.prepare(device)


#: Every capability it has; not ``cpu-bit-exact``.
CAPABILITIES = frozenset({NATIVE_STATE_DICT, FACTORED_V, DCP_RESHARD, DCP_SAVE_PLANNER, DCP_ASYNC_SAVE})

IMPLEMENTATION = with_reference_adapter(
    "triton", gefen_triton.__version__, _make_optimizer, capabilities=CAPABILITIES, prepare=_prepare
)
