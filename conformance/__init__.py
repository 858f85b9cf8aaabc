"""gefen-conformance: the conformance suite for Gefen implementations.

``conformance.Implementation`` is the plugin contract (SPEC Part 4); the pytest plugin lives in
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


def __getattr__(name: str):
    if name == "FACTORED_SECOND_MOMENT":  # renamed FACTORED_V; kept working, with a warning
        from gefen_conformance.implementations import contract

        return getattr(contract, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
