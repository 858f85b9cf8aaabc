"""The cases a reproducer holds by value: the inputs hypothesis drew (SPEC 4.5.6).

A test whose inputs are drawn judges a *replayable case*: an object with the
:class:`ReplayableCase` protocol whose :meth:`~ReplayableCase.payload` (plain values and tensors,
what ``gefen-conformance repro`` reads back with ``torch.load(weights_only=True)``) is every input
of the comparison. ``repro`` rebuilds it with :func:`from_payload` and runs
:meth:`~ReplayableCase.comparisons` again in one process. A class becomes a kind with the
:func:`replayable` decorator, in the module that defines it:

===============  ====================================================================
``input-space``  :class:`gefen_conformance.suite.space_checks.InputSpaceCase`
``staging``      :class:`gefen_conformance.suite.staging.StagingCase`
===============  ====================================================================

A kind is known once its module is imported (each test module imports its own; ``repro`` imports
both).
Every other suite test is deterministic: its inputs follow from its test id, so its reproducer
records that id and ``repro`` runs the test again.
"""

from __future__ import annotations

from typing import Any, ClassVar, Protocol, runtime_checkable

from gefen_oracles.numeric import Comparisons

__all__ = ["ReplayableCase", "from_payload", "kinds", "replayable"]


@runtime_checkable
class ReplayableCase(Protocol):
    """One drawn input of a suite test, held by value."""

    #: The name a reproducer records (set by :func:`replayable`).
    kind: ClassVar[str]

    def payload(self) -> dict:
        """Every input as plain values and tensors, with ``"kind"``."""
        ...

    @classmethod
    def from_payload(cls, payload: dict) -> ReplayableCase:
        """The case :meth:`payload` describes; ``ValueError`` naming what is wrong with it."""
        ...

    def describe(self) -> str:
        """The input in words (the certificate's ``input``)."""
        ...

    def comparisons(self, impl: Any, *, bitwise: bool) -> Comparisons:
        """Both sides run on these inputs and judged: the implementation ``impl`` against the
        reference, bitwise or by the tolerance profile."""
        ...


_KINDS: dict[str, type] = {}


def replayable(kind: str):
    """Class decorator: the class is the replayable case of ``kind`` (one class per kind)."""

    def register(cls: type) -> type:
        known = _KINDS.get(kind)
        if known is not None and known.__qualname__ != cls.__qualname__:
            raise ValueError(f"case kind {kind!r} is already {known.__module__}.{known.__qualname__}")
        cls.kind = kind
        _KINDS[kind] = cls
        return cls

    return register


def kinds() -> dict[str, type]:
    """``{kind: class}`` of every kind registered so far."""
    return dict(_KINDS)


def from_payload(payload: dict) -> ReplayableCase:
    """The case a reproducer holds; ``ValueError`` naming what is wrong with it."""
    if not isinstance(payload, dict):
        raise ValueError("a case payload is a dict")
    kind = payload.get("kind")
    if kind not in _KINDS:
        raise ValueError(f"unknown case kind {kind!r} (known: {', '.join(sorted(_KINDS)) or 'none'})")
    return _KINDS[kind].from_payload(payload)
