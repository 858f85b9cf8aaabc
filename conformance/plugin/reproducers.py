"""Reproducers of failing comparisons, in the test process (SPEC 4.5.6).

A suite test that judges a replayable case (:mod:`gefen_conformance.suite.optimizer_cases`: a
pinned step or a free-running trajectory) records it with
:func:`gefen_conformance.suite.margins.record`, which :func:`offer` s it here when its comparisons
found a problem. When the test's call phase ends the plugin asks :func:`drain` for the test's
reproducer: when the test failed, the bytes of a ``torch.save`` d dict of schema :data:`SCHEMA`
holding the test id and clauses, the implementation (name, version, spec), the device, the torch
version, and per case its inputs, the profile it was judged in and its failing comparisons (what,
kind, error and bound or differing and total, problems). The bytes travel with the test's report
(from xdist workers too) to the process that writes the certificate, which writes them beside it
(:mod:`gefen_conformance.certificate.repro_files`). Nothing is written here, and a test that
passed leaves nothing.
"""

from __future__ import annotations

SCHEMA = "gefen-conformance-repro/1"

_offered: list = []


def offer(case, bitwise: bool, comparisons, problems) -> None:
    """The running test judged ``case`` (``bitwise`` or by tolerance) and its ``comparisons`` found
    ``problems``."""
    failing = [_summary(c) for c in comparisons if c.problems]
    _offered.append({"case": case, "bitwise": bool(bitwise), "failing": failing, "problems": list(problems)})


def _summary(c) -> dict:
    return {
        "what": c.what,
        "kind": c.kind,
        "error": float(c.error),
        "bound": float(c.bound),
        "differing": int(c.differing),
        "total": int(c.total),
        "problems": list(c.problems),
    }


def clear() -> None:
    """Forget what was offered (a new test starts)."""
    _offered.clear()


def drain(test_id: str, clauses: list, implementation: dict, device: str, *, keep: bool) -> bytes | None:
    """The reproducer of the test that just ran, when ``keep`` (it failed) and it offered a case;
    else None. Forgets what was offered either way."""
    offered = list(_offered)
    _offered.clear()
    if not keep or not offered:
        return None
    import io

    import torch

    payload = {
        "schema": SCHEMA,
        "test_id": test_id,
        "clauses": [str(c) for c in clauses],
        "implementation": dict(implementation),
        "device": str(device),
        "torch": str(torch.__version__),
        "cases": [
            {
                "case": o["case"].payload(),
                "bitwise": o["bitwise"],
                "failing": o["failing"],
                "problems": o["problems"],
            }
            for o in offered
        ],
    }
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.getvalue()
