"""gefen-conformance: the conformance suite for Gefen implementations.

``gefen_conformance.Implementation`` is the plugin contract (SPEC Part 4); the pytest plugin lives in
``gefen_conformance.plugin.hooks`` and the suite in ``gefen_conformance.suite``.
"""

from gefen_conformance.implementations.contract import (
    CPU_BIT_EXACT,
    DCP_ASYNC_SAVE,
    DCP_RESHARD,
    DCP_SAVE_PLANNER,
    FACTORED_V,
    NATIVE_STATE_DICT,
    Capability,
    Implementation,
)

__all__ = [
    "CPU_BIT_EXACT",
    "DCP_ASYNC_SAVE",
    "DCP_RESHARD",
    "DCP_SAVE_PLANNER",
    "FACTORED_V",
    "NATIVE_STATE_DICT",
    "Capability",
    "Implementation",
]
