"""Every kind of case a failed test can leave as its reproducer, and how to rebuild one (SPEC 4.5.6).

A *replayable case* has a ``kind``, a :meth:`payload` (plain values and tensors: what
``gefen-conformance repro`` reads back with ``torch.load(weights_only=True)``), a ``describe()``
(the input in words, for the certificate and the reports) and a ``replay(impl, *, bitwise)`` that
runs the failing comparison again and returns its
:class:`~gefen_oracles.numeric.Comparisons`. Each kind lives beside the checks it replays:

====================  ===========================================================================
``pinned-step``       ``optimizer_cases.PinnedCase`` (one process)
``trajectory``        ``optimizer_cases.TrajectoryCase`` (one process)
``long-trajectory``   ``optimizer_cases.LongCase`` (one process)
``input-space``       ``space_checks.InputSpaceCase`` (one process)
``staging``           ``test_hyper_staging.StagingCase`` (one process, a group of one)
``golden``            ``test_goldens.GoldenCase`` (the goldens' world sizes, on the active launcher)
``restore``           ``restore_checks.RestoreCase`` (the restore's world size, on the launcher)
``continuation``      ``test_dcp_continuation.ContinuationCase`` (likewise)
``calling-protocol``  ``test_calling_protocol.ProtocolCase`` (one process)
====================  ===========================================================================
"""

from __future__ import annotations

import importlib

KINDS = {
    "pinned-step": "gefen_conformance.suite.optimizer_cases:PinnedCase",
    "trajectory": "gefen_conformance.suite.optimizer_cases:TrajectoryCase",
    "long-trajectory": "gefen_conformance.suite.optimizer_cases:LongCase",
    "input-space": "gefen_conformance.suite.space_checks:InputSpaceCase",
    "staging": "gefen_conformance.suite.test_hyper_staging:StagingCase",
    "golden": "gefen_conformance.suite.test_goldens:GoldenCase",
    "restore": "gefen_conformance.suite.restore_checks:RestoreCase",
    "continuation": "gefen_conformance.suite.test_dcp_continuation:ContinuationCase",
    "calling-protocol": "gefen_conformance.suite.test_calling_protocol:ProtocolCase",
}


def case_class(kind: str):
    if kind not in KINDS:
        raise ValueError(f"unknown case kind {kind!r} (known: {', '.join(KINDS)})")
    module, _, name = KINDS[kind].partition(":")
    return getattr(importlib.import_module(module), name)


def from_payload(payload: dict):
    """The case a reproducer holds; ValueError naming what is wrong with it."""
    if not isinstance(payload, dict):
        raise ValueError("a case payload is a dict")
    kind = payload.get("kind")
    if kind in ("pinned-step", "trajectory", "long-trajectory"):
        from gefen_conformance.suite import optimizer_cases

        return optimizer_cases.from_payload(payload)
    return case_class(kind).from_payload(payload)


def replay(case, impl, *, bitwise: bool):
    """The case's comparisons, run again for ``impl``."""
    own = getattr(case, "replay", None)
    if callable(own):
        return own(impl, bitwise=bitwise)
    return case.compare(impl.make_optimizer, bitwise=bitwise)


def runs_ranks(case) -> bool:
    """Whether replaying ``case`` runs rank processes (it then needs the launcher's ranks)."""
    return bool(getattr(case, "ranks", False))
