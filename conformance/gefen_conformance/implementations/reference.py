"""The reference, registered like any other implementation."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import gefen_reference as reference
from gefen_conformance.implementations.contract import KNOWN_CAPABILITIES
from gefen_conformance.implementations.dcp_adapter import with_reference_adapter


def _version() -> str:
    try:
        return version("gefen-conformance")
    except PackageNotFoundError:
        return "0+source"


def _make_optimizer(params, **hyperparameters):
    return reference.Gefen(params, **hyperparameters)


IMPLEMENTATION = with_reference_adapter(
    "reference", _version(), _make_optimizer, capabilities=KNOWN_CAPABILITIES
)
