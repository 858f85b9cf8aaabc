"""Recording the oracles' comparisons as margins of the running test (SPEC 4.4, 5.6).

Oracles return :class:`oracles.numeric.Comparisons` and never import ``conformance``; the suite
records every comparison it makes here, in the test process, so that each one reaches the
certificate with its worst error and bound (tolerance) or differing count (bitwise).
"""

from __future__ import annotations

from gefen_conformance.plugin import observations, reproducers
from gefen_oracles.numeric import Comparison, Comparisons


def record(comparisons, *, case=None, bitwise: bool | None = None) -> list[str]:
    """Record every comparison (a :class:`Comparisons` or an iterable of :class:`Comparison`);
    return the problems found. ``case``: the replayable case the comparisons judged
    (:mod:`gefen_conformance.suite.optimizer_cases`), judged bitwise or not (``bitwise``); when
    they found a problem it is offered as the test's reproducer (SPEC 4.5.6)."""
    if isinstance(comparisons, Comparison):
        comparisons = [comparisons]
    problems = list(comparisons.problems) if isinstance(comparisons, Comparisons) else []
    recorded = []
    for c in comparisons:
        if c.kind == "bitwise":
            observations.bitwise(c.what, differing=c.differing, total=c.total)
        else:
            observations.margin(c.what, error=c.error, bound=c.bound)
        recorded.append(c)
        if not isinstance(comparisons, Comparisons):
            problems.extend(c.problems)
    if case is not None and problems:
        reproducers.offer(case, bool(bitwise), recorded, problems)
    return problems


def exact(what: str, differing: int, total: int) -> None:
    """Record a comparison that must be exact in every profile (counts, names, digests)."""
    observations.bitwise(what, differing=differing, total=total)
