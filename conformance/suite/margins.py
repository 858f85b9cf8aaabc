"""Recording the oracles' comparisons as margins of the running test (SPEC 4.4, 5.6).

Oracles return :class:`oracles.numeric.Comparisons` and never import ``conformance``; the suite
records every comparison it makes here, in the test process, so that each one reaches the
certificate with its worst error and bound (tolerance) or differing count (bitwise).
"""

from __future__ import annotations

from gefen_conformance.plugin import observations
from gefen_oracles.numeric import Comparison, Comparisons


def record(comparisons) -> list[str]:
    """Record every comparison (a :class:`Comparisons` or an iterable of :class:`Comparison`);
    return the problems found."""
    if isinstance(comparisons, Comparison):
        comparisons = [comparisons]
    problems = list(comparisons.problems) if isinstance(comparisons, Comparisons) else []
    for c in comparisons:
        if c.kind == "bitwise":
            observations.bitwise(c.what, differing=c.differing, total=c.total)
        else:
            observations.margin(c.what, error=c.error, bound=c.bound)
        if not isinstance(comparisons, Comparisons):
            problems.extend(c.problems)
    return problems


def exact(what: str, differing: int, total: int) -> None:
    """Record a comparison that must be exact in every profile (counts, names, digests)."""
    observations.bitwise(what, differing=differing, total=total)
