"""Implementations whose DCP adapter, save planner and async writer are a package's
``GefenDCPState``, ``GefenSavePlanner`` and ``GefenFileSystemWriter`` (SPEC 2.3.6, 4.1).

The reference and gefen-x expose those three names, each in its own module; a kernel backend that
keeps the reference's state layout reuses the reference's (:func:`with_reference_adapter`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable
from typing import Any

from gefen_conformance.implementations.contract import KNOWN_CAPABILITIES, Capability, Implementation

#: the reference's DCP adapter module
REFERENCE_ADAPTER = "gefen_reference.dcp"


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


def with_reference_adapter(
    name: str,
    version: str,
    make_optimizer: Callable[..., Any],
    *,
    capabilities: Iterable[Capability | str],
    **fields: Any,
) -> Implementation:
    """An :class:`~gefen_conformance.Implementation` of an optimizer that the reference's DCP adapter
    serves: its ``dcp_state``, ``save_planner`` and ``async_writer`` are
    :class:`gefen_reference.dcp.GefenDCPState`, ``GefenSavePlanner`` and ``GefenFileSystemWriter``
    (imported on first use, so that listing implementations does not import
    ``torch.distributed.checkpoint``).

    For an optimizer class that declares the reference's state layout
    (``gefen_state_layout = gefen_reference.dcp.STATE_LAYOUT`` in its own body, SPEC 2.3.6), as a
    kernel backend built on ``gefen_reference.Gefen`` does. ``capabilities`` are the ones it really
    has (no default: ``CPU_BIT_EXACT`` claims bitwise equality with the reference, SPEC 0.4.1);
    ``fields`` are the other fields of :class:`~gefen_conformance.Implementation`
    (``prepare``, ``expected_failures``). ``make_optimizer(params, **hyperparameters)`` is best
    defined in the module that registers the implementation: the certificate names its module as
    the implementation's provenance (SPEC 4.4.3)::

        def _make_optimizer(params, **hyperparameters):
            return gefen_fast.Gefen(params, **hyperparameters)


        IMPLEMENTATION = with_reference_adapter(
            "fast",
            gefen_fast.__version__,
            _make_optimizer,
            capabilities={NATIVE_STATE_DICT, FACTORED_V, DCP_RESHARD, DCP_SAVE_PLANNER, DCP_ASYNC_SAVE},
            prepare=_prepare,
        )
    """
    return adapter_declared(
        name, version, make_optimizer, REFERENCE_ADAPTER, capabilities=capabilities, **fields
    )
