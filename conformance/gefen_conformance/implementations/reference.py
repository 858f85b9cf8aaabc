"""The reference, registered like any other implementation."""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version

import gefen_reference as reference
from gefen_conformance.implementations import adapter_declared


def _version() -> str:
    try:
        return version("gefen-conformance")
    except PackageNotFoundError:
        return "0+source"


def _make_optimizer(params, **hyperparameters):
    return reference.Gefen(params, **hyperparameters)


IMPLEMENTATION = adapter_declared("reference", _version(), _make_optimizer, "gefen_reference.dcp")
