"""``fast`` as the conformance suite sees it: ``pytest --impl=fast`` (SPEC 4.1).

Registered in this distribution's ``pyproject.toml`` under the entry-point group
``gefen_conformance.implementations``. The DCP adapter, planner and async writer are the
reference's (``gefen_conformance.with_reference_adapter``): ``gefen_fast.Gefen`` declares the
reference's state layout (``gefen_reference.dcp.STATE_LAYOUT``), which is the adapter's documented
extension point (SPEC 2.3.6). Judged by the tolerance profile: no ``cpu-bit-exact`` claim.
"""

from __future__ import annotations

import gefen_fast
from gefen_conformance import (
    DCP_ASYNC_SAVE,
    DCP_RESHARD,
    DCP_SAVE_PLANNER,
    FACTORED_V,
    NATIVE_STATE_DICT,
    with_reference_adapter,
)


def _make_optimizer(params, **hyperparameters):
    return gefen_fast.Gefen(params, **hyperparameters)


def _prepare(device):
    """Load the C kernels in this process (building them first where no build fits this machine),
    so that no scenario pays for it inside a deadline (SPEC 4.2.11). Idempotent."""
    from gefen_fast import kernels

    kernels.available()


#: Every capability it has; not ``cpu-bit-exact`` (fp32 sums in another order, IEEE sqrt).
CAPABILITIES = frozenset({NATIVE_STATE_DICT, FACTORED_V, DCP_RESHARD, DCP_SAVE_PLANNER, DCP_ASYNC_SAVE})

IMPLEMENTATION = with_reference_adapter(
    "fast", gefen_fast.__version__, _make_optimizer, capabilities=CAPABILITIES, prepare=_prepare
)
