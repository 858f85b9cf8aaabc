"""The reference, registered like any other implementation."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import reference

from ..implementation import KNOWN_CAPABILITIES, Implementation


def _version() -> str:
    try:
        return version("gefen-conformance")
    except PackageNotFoundError:
        return "0+source"


def _make_optimizer(params, **hyperparameters):
    return reference.Gefen(params, **hyperparameters)


def _dcp_state(optimizer):
    from reference.dcp import GefenDCPState

    return GefenDCPState(optimizer)


def _save_planner():
    from reference.dcp import GefenSavePlanner

    return GefenSavePlanner()


def _async_writer(path):
    from reference.dcp import GefenFileSystemWriter

    return GefenFileSystemWriter(path)


IMPLEMENTATION = Implementation(
    name="reference",
    version=_version(),
    make_optimizer=_make_optimizer,
    dcp_state=_dcp_state,
    save_planner=_save_planner,
    async_writer=_async_writer,
    capabilities=KNOWN_CAPABILITIES,  # every capability, bit-exactness on CPU included
)
