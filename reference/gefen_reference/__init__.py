"""Reference implementation of the Gefen optimizer and its DCP adapter: what every implementation is compared
with.

Readable and strict rather than fast. Imports neither ``conformance`` nor ``oracles``
and never imports the published ``gefen`` package.

``gefen_reference.Gefen`` is the optimizer. The DCP adapter (``GefenDCPState``, ``GefenSavePlanner``,
``GefenFileSystemWriter``, from :mod:`gefen_reference.dcp`) is also reachable here, loaded on first
use, so that ``import reference`` does not import ``torch.distributed.checkpoint``.
"""

import importlib

from .optimizer import Gefen

_DCP_EXPORTS = ("GefenDCPState", "GefenSavePlanner", "GefenFileSystemWriter")

__all__ = ["Gefen", *_DCP_EXPORTS]


def __getattr__(name: str):
    if name in _DCP_EXPORTS:
        return getattr(importlib.import_module(".dcp", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
