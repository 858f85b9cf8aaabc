"""An exception as plain text, for rank outcomes that must survive a process boundary (SPEC 4.2.1).

Used on both sides of a rank: by the worker that reports a failure and by the caller that
reports a result it could not unpickle. Cheap to import (no torch).
"""

from __future__ import annotations

import traceback

__all__ = ["format_exception", "qualified_name", "safe_str"]


def qualified_name(kind: type) -> str:
    """``module.QualName`` of an exception type; builtins by their bare name."""
    module = getattr(kind, "__module__", None)
    name = getattr(kind, "__qualname__", getattr(kind, "__name__", repr(kind)))
    if module in (None, "builtins", "__builtin__"):
        return name
    return f"{module}.{name}"


def safe_str(value: object) -> str:
    """``str(value)``, or a note saying it failed: a broken ``__str__`` must not hide a failure."""
    try:
        return str(value)
    except BaseException as exc:  # noqa: BLE001
        return f"<str() of {type(value).__name__} failed: {type(exc).__name__}>"


def format_exception(exc: BaseException) -> str:
    """The full formatted traceback, or the type and message when it cannot be formatted."""
    try:
        return "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    except BaseException:  # noqa: BLE001
        head = f"{qualified_name(type(exc))}: {safe_str(exc)}"
        return head + "\n(the traceback could not be formatted)\n"
