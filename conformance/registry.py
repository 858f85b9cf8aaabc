"""Finding implementations: entry points and ``package.module:attribute`` specs (SPEC 4.1.2)."""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from .implementation import Implementation

ENTRY_POINT_GROUP = "gefen_conformance.implementations"


def registered() -> dict[str, str]:
    """Registered names mapped to their ``module:attribute`` targets."""
    return {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}


def _load_target(target: str) -> object:
    module_name, _, attribute = target.partition(":")
    if not module_name or not attribute:
        raise LookupError(f"implementation spec {target!r} must look like 'package.module:attribute'")
    obj = importlib.import_module(module_name)
    for part in attribute.split("."):
        obj = getattr(obj, part)
    return obj


def resolve(spec: str) -> Implementation:
    """An :class:`Implementation` from a registered name or a ``package.module:attribute`` spec.

    The attribute may be the instance or a zero-argument callable returning it.
    """
    names = registered()
    if ":" in spec:
        target = spec
    elif spec in names:
        target = names[spec]
    else:
        known = ", ".join(sorted(names)) or "none"
        raise LookupError(f"no implementation named {spec!r} is registered (registered: {known})")
    obj = _load_target(target)
    if not isinstance(obj, Implementation) and callable(obj):
        obj = obj()
    if not isinstance(obj, Implementation):
        raise TypeError(f"{target} is {type(obj).__name__}, not a conformance.Implementation")
    return obj
