"""The published gefen-x package (imports as ``gefen``), certified as ``--impl=gefenx``.

Only gefen-x's public API is used. Its non-fused CPU path is the torch-exact profile, so it
claims CPU bit-exactness; ``fused`` is forced off because on a machine without CUDA gefen-x
would turn it off itself, with a warning.
"""

from __future__ import annotations

import warnings

from ..implementation import (
    CPU_BIT_EXACT,
    DCP_ASYNC_SAVE,
    DCP_RESHARD,
    DCP_SAVE_PLANNER,
    FACTORED_SECOND_MOMENT,
    NATIVE_STATE_DICT,
    Implementation,
)


def _gefen():
    import gefen

    return gefen


def _make_optimizer(params, **hyperparameters):
    hyperparameters.setdefault("fused", False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return _gefen().Gefen(params, **hyperparameters)


def _dcp_state(optimizer):
    return _gefen().GefenDCPState(optimizer)


def _save_planner():
    return _gefen().GefenSavePlanner()


def _async_writer(path):
    return _gefen().GefenFileSystemWriter(path)


def _version() -> str:
    try:
        return _gefen().__version__
    except ImportError:
        return "not installed"


def implementation() -> Implementation:
    """Built lazily so that listing implementations works without gefen-x installed."""
    _gefen()
    return Implementation(
        name="gefenx",
        version=_version(),
        make_optimizer=_make_optimizer,
        dcp_state=_dcp_state,
        save_planner=_save_planner,
        async_writer=_async_writer,
        capabilities={NATIVE_STATE_DICT, CPU_BIT_EXACT, FACTORED_SECOND_MOMENT, DCP_RESHARD, DCP_SAVE_PLANNER, DCP_ASYNC_SAVE},
        expected_failures={},
    )
