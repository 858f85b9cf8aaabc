"""The words a certificate records for a test and for a run (SPEC 4.4.1, 4.4.2).

:class:`Outcome` is one suite test's result, :class:`Verdict` the run's. Both are ``str``
enums whose values are what the JSON holds, so a certificate reads the same whether it was
written from members or read back as plain strings (``Outcome("passed") is Outcome.PASSED``).
"""

from __future__ import annotations

import enum


class Outcome(str, enum.Enum):
    """One test's result; setup, call and teardown collapse into the worst (:data:`SEVERITY`)."""

    PASSED = "passed"
    FAILED = "failed"
    ERROR = "error"
    SKIPPED = "skipped"
    XFAILED = "xfailed"  # a declared expected failure that failed (SPEC 4.1.4)
    XPASSED = "xpassed"  # a declared expected failure that passed: the list is stale for it

    def __str__(self) -> str:
        return self.value


class Verdict(str, enum.Enum):
    """A run's verdict (SPEC 4.4.2), best first: a later one is worse (:func:`verdict_rank`)."""

    CONFORMANT = "conformant"
    CONFORMANT_WITH_EXPECTED_FAILURES = "conformant-with-expected-failures"
    # a chosen subset that passed beats a run that stopped, which beats one where nothing passed
    PARTIAL = "partial"
    INCOMPLETE = "incomplete"
    INCONCLUSIVE = "inconclusive"
    NOT_CONFORMANT = "not-conformant"

    def __str__(self) -> str:
        return self.value


#: The certificate's order of outcomes (``summary``, ``clauses``).
OUTCOMES = tuple(Outcome)
#: Outcomes that make a run not conformant.
BAD_OUTCOMES = frozenset({Outcome.FAILED, Outcome.ERROR, Outcome.XPASSED})
#: Setup, call and teardown of one test collapse into one record: the latest of these wins.
SEVERITY = (Outcome.PASSED, Outcome.SKIPPED, Outcome.XFAILED, Outcome.XPASSED, Outcome.FAILED, Outcome.ERROR)
#: Verdicts best first.
VERDICTS = tuple(Verdict)
