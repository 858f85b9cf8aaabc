"""gefen-conformance: the conformance suite for Gefen implementations.

``gefen_conformance.Implementation`` is the plugin contract (SPEC Part 4), with its capabilities;
``gefen_conformance.with_reference_adapter`` builds one for an optimizer that the reference's DCP
adapter serves (a kernel backend built on ``gefen_reference.Gefen``, SPEC 2.3.6). The pytest
plugin lives in ``gefen_conformance.plugin.hooks`` and the suite in ``gefen_conformance.suite``.
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
from gefen_conformance.implementations.dcp_adapter import with_reference_adapter

__all__ = [
    "CPU_BIT_EXACT",
    "DCP_ASYNC_SAVE",
    "DCP_RESHARD",
    "DCP_SAVE_PLANNER",
    "FACTORED_V",
    "NATIVE_STATE_DICT",
    "Capability",
    "Implementation",
    "with_reference_adapter",
]
