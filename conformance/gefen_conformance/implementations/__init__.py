"""Adapters that register implementations with the suite (the reference and gefen-x).

Both packages expose the same DCP adapter names, so both are declared by :func:`adapter_declared`.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from gefen_conformance.implementations.contract import KNOWN_CAPABILITIES, Implementation


def adapter_declared(
    name: str, version: str, make_optimizer: Callable[..., Any], adapter_module: str, **fields
) -> Implementation:
    """An :class:`~gefen_conformance.Implementation` with every capability whose DCP adapter, save planner
    and async writer are ``GefenDCPState``, ``GefenSavePlanner`` and ``GefenFileSystemWriter`` of
    ``adapter_module`` (imported on first use); ``fields`` adds or overrides the rest."""

    def module():
        return importlib.import_module(adapter_module)

    return Implementation(
        **{
            "name": name,
            "version": version,
            "make_optimizer": make_optimizer,
            "dcp_state": lambda optimizer: module().GefenDCPState(optimizer),
            "save_planner": lambda: module().GefenSavePlanner(),
            "async_writer": lambda path: module().GefenFileSystemWriter(path),
            "capabilities": KNOWN_CAPABILITIES,  # bit-exactness on CPU included
            **fields,
        }
    )
