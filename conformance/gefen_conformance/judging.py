"""Judging a suite test's comparisons: record every margin, then pass or fail with the message
(SPEC 4.4.8, 5.3.4).

A suite test asks for the ``gefen_judge`` fixture, a :class:`Judge` bound to the implementation
under test, the run's numeric profile and this test's record. The oracles return
:class:`~gefen_oracles.numeric.Comparisons` and record nothing; the test hands them to the judge::

    def test_reshard(gefen_impl, gefen_checkpoints, gefen_judge, model, source, target):
        restore = gefen_checkpoints.restored(gefen_impl, gefen_impl, model, source, target)
        gefen_judge.assert_comparisons(restore_checks.restore(restore, gefen_judge.bitwise))

:meth:`Judge.assert_comparisons` records every comparison as a margin of the test (a tolerance
comparison's worst error and bound, a bitwise one's differing count: the certificate's
``margins``), keeps the notes, offers a replayable case as the test's reproducer when one failed
(SPEC 4.5.6), and raises ``AssertionError`` listing the problems. :meth:`Judge.record` does the
same without raising, for a test that judges in stages. What a test recorded reaches its report
through the judge alone (the plugin reads it from the test item), so nothing of it is module state.
"""

from __future__ import annotations

import io
import math
from collections.abc import Iterable
from typing import Any

import pytest

from gefen_oracles.numeric import Comparison, Comparisons

__all__ = ["JUDGE", "REPRO_SCHEMA", "Judge", "Observations", "assert_no_problems"]

#: Where the ``gefen_judge`` fixture leaves the test's judge on the test item, for the plugin.
JUDGE = pytest.StashKey["Judge"]()
#: The schema of a reproducer's payload (``gefen-conformance repro``).
REPRO_SCHEMA = "gefen-conformance-repro/1"
#: How many problems an assertion message lists before it says how many more there were.
SHOWN_PROBLEMS = 20


def assert_no_problems(problems: Iterable[str], limit: int = SHOWN_PROBLEMS) -> None:
    """Raise ``AssertionError`` listing ``problems`` (the first ``limit``, then how many more), if any."""
    problems = [str(p) for p in problems]
    if not problems:
        return
    shown = problems[:limit]
    if len(problems) > limit:
        shown.append(f"... and {len(problems) - limit} more problems")
    raise AssertionError("\n".join(shown))


def _used(error: float, bound: float) -> float:
    if error == 0.0:
        return 0.0
    if bound <= 0.0 or not math.isfinite(error):
        return math.inf
    return error / bound


class Observations:
    """One test's margins and notes (SPEC 4.4.8): entries with the same ``what`` merge to the worst,
    so a check may record per step or per element group without bloating the certificate."""

    def __init__(self) -> None:
        self._margins: dict[str, dict] = {}
        self._notes: list[str] = []

    def margin(self, what: str, *, error: float, bound: float) -> float:
        """A tolerance comparison of ``what``; returns the share of the bound it used."""
        error, bound = float(error), float(bound)
        used = _used(error, bound)
        self._keep(what, {"what": what, "kind": "tolerance", "error": error, "bound": bound, "used": used})
        return used

    def bitwise(self, what: str, *, differing: int, total: int) -> None:
        """A bitwise (or exact) comparison of ``what``: ``differing`` of ``total`` elements differ."""
        self._keep(what, {"what": what, "kind": "bitwise", "differing": int(differing), "total": int(total)})

    def note(self, text: str) -> None:
        if text not in self._notes:
            self._notes.append(text)

    def _keep(self, what: str, entry: dict) -> None:
        old = self._margins.get(what)
        if old is None or self._severity(entry) > self._severity(old):
            self._margins[what] = entry

    @staticmethod
    def _severity(entry: dict) -> float:
        return entry["used"] if entry["kind"] == "tolerance" else float(entry["differing"] > 0) * math.inf

    def drain(self) -> dict:
        """``{"margins": [...], "notes": [...]}`` recorded since the last drain, then forget them.
        An infinite ratio is written as None (JSON has no infinity): the comparison failed outright."""
        margins = [
            dict(e, used=e["used"] if math.isfinite(e["used"]) else None)
            if e["kind"] == "tolerance"
            else dict(e)
            for e in self._margins.values()
        ]
        notes = list(self._notes)
        self._margins.clear()
        self._notes.clear()
        return {"margins": margins, "notes": notes}


class Judge:
    """Judges one suite test's comparisons for ``impl`` under the run's profile (``bitwise``: the
    ``torch-exact`` profile, SPEC 4.6.4) and records them (:class:`Observations`)."""

    def __init__(self, impl: Any, *, bitwise: bool) -> None:
        self.impl = impl
        self.bitwise = bool(bitwise)
        self.observations = Observations()
        self._offered: dict | None = None
        #: the failing input in words (:meth:`describe` of the last failing case), for the certificate
        self.failing_input: str | None = None

    # ---------------------------------------------------------------------------------- recording

    def record(self, comparisons, *, case=None, bitwise: bool | None = None) -> list[str]:
        """Record every comparison (a :class:`Comparisons`, a :class:`Comparison` or an iterable of
        them) and its notes; return the problems found. ``case``: the replayable case they judged
        (``gefen_conformance.suite.optimizer_cases``), offered as the test's reproducer when they
        found a problem; ``bitwise`` (default: the run's profile) says how it was judged."""
        if isinstance(comparisons, Comparison):
            comparisons = Comparisons([comparisons])
        elif not isinstance(comparisons, Comparisons):
            comparisons = Comparisons(comparisons)
        for c in comparisons:
            if c.kind == "bitwise":
                self.observations.bitwise(c.what, differing=c.differing, total=c.total)
            else:
                self.observations.margin(c.what, error=c.error, bound=c.bound)
        for text in comparisons.notes:
            self.observations.note(text)
        problems = list(comparisons.problems)
        if case is not None and problems:
            self._offer(case, self.bitwise if bitwise is None else bitwise, comparisons, problems)
        return problems

    def assert_comparisons(
        self,
        comparisons,
        *,
        case=None,
        bitwise: bool | None = None,
        prefix: str = "",
        limit: int = SHOWN_PROBLEMS,
    ) -> None:
        """:meth:`record`, then raise ``AssertionError`` listing the problems (each after ``prefix``)."""
        problems = self.record(comparisons, case=case, bitwise=bitwise)
        assert_no_problems([f"{prefix}{p}" for p in problems], limit)

    def assert_exact(self, what: str, differing: int, total: int, problems: Iterable[str] = ()) -> None:
        """An exact comparison (counts, names, digests; exact in every profile): recorded, and raised
        with ``problems`` (or a count) when ``differing`` is not 0."""
        problems = list(problems)
        self.observations.bitwise(what, differing=differing, total=total)
        if differing and not problems:
            problems = [f"{what}: {differing} of {total} differ"]
        assert_no_problems(problems if differing else [])

    def assert_within(self, what: str, error: float, bound: float, message: str) -> None:
        """A tolerance comparison of one number: recorded, and raised with ``message`` when ``error``
        exceeds ``bound``."""
        self.observations.margin(what, error=error, bound=bound)
        if not float(error) <= float(bound):
            raise AssertionError(message)

    def note(self, text: str) -> None:
        """A fact the certificate's reader must see (said once per test however often noted)."""
        self.observations.note(text)

    # -------------------------------------------------------------------------------- reproducers

    def _offer(self, case, bitwise: bool, comparisons: Comparisons, problems: list) -> None:
        """The test's reproducer holds the last failing case it judged (hypothesis runs the smallest
        failing example last)."""
        """The test's reproducer holds the last failing case it judged (hypothesis runs the
        smallest failing example last)."""
        failing = [
            {
                "what": c.what,
                "kind": c.kind,
                "error": float(c.error),
                "bound": float(c.bound),
                "differing": int(c.differing),
                "total": int(c.total),
                "problems": list(c.problems),
            }
            for c in comparisons
            if c.problems
        ]
        self._offered = {"case": case, "bitwise": bool(bitwise), "failing": failing, "problems": problems}
        describe = getattr(case, "describe", None)
        self.failing_input = describe() if callable(describe) else None

    def reproducer(self, test_id: str, clauses: list, implementation: dict, device: str) -> bytes | None:
        """The failed test's reproducer (SPEC 4.5.6): the bytes of a ``torch.save`` d dict of schema
        :data:`REPRO_SCHEMA` with the test id and clauses, the implementation (name, version, spec),
        the device, the torch version and per offered case its inputs, profile and failing
        comparisons; None when the test offered no case. Forgets what was offered."""
        offered, self._offered = self._offered, None
        if offered is None:
            return None
        import torch

        payload = {
            "schema": REPRO_SCHEMA,
            "test_id": test_id,
            "clauses": [str(c) for c in clauses],
            "implementation": dict(implementation),
            "device": str(device),
            "torch": str(torch.__version__),
            "cases": [
                {
                    "case": offered["case"].payload(),
                    "bitwise": offered["bitwise"],
                    "failing": offered["failing"],
                    "problems": offered["problems"],
                }
            ],
        }
        buffer = io.BytesIO()
        torch.save(payload, buffer)
        return buffer.getvalue()

    def forget_reproducers(self) -> None:
        self._offered = None
