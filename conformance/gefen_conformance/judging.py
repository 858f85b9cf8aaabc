"""Judging a suite test's comparisons: record every margin, then pass or fail with the message
(SPEC 4.4.8, 5.3.4).

A suite test asks for the ``gefen_judge`` fixture, a :class:`Judge` bound to the implementation
under test, the run's numeric profile and this test's record. The oracles return
:class:`~gefen_oracles.numeric.Comparisons` and record nothing; the test hands them to the judge::

    def test_reshard(gefen_impl, gefen_checkpoints, gefen_judge, model, source, target):
        saved = gefen_checkpoints.trained_and_saved(gefen_impl, model, ranks=source)
        restore = gefen_checkpoints.restored(saved, by=gefen_impl, ranks=target)
        gefen_judge.assert_comparisons(restore_checks.resaved(restore), inputs=restore.describe())

:meth:`Judge.assert_comparisons` records every comparison as a margin of the test (a tolerance
comparison's worst error and bound, a bitwise one's differing count: the certificate's
``margins``), keeps the notes, keeps the last failing comparisons for the test's reproducer (SPEC
4.5.6: the drawn case they judged, or the test's id), and raises ``AssertionError`` listing the
problems. :meth:`Judge.record` does the same without raising, for a test that judges in stages.
What a test recorded reaches its report through the judge alone (the plugin reads it from the test
item), so nothing of it is module state.
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
        self._failure: dict | None = None
        #: the failing input in words (the last failure's case or inputs), for the certificate
        self.failing_input: str | None = None

    # ---------------------------------------------------------------------------------- recording

    def record(
        self, comparisons, *, case=None, inputs: str | None = None, bitwise: bool | None = None
    ) -> list[str]:
        """Record every comparison (a :class:`Comparisons`, a :class:`Comparison` or an iterable of
        them) and its notes; return the problems found. When they found a problem they are the
        test's reproducer (the last failure recorded): ``case``, the replayable case they judged
        (drawn inputs, :mod:`gefen_conformance.suite.replayable`), is held by value; without one
        the reproducer names the test, which ``gefen-conformance repro`` runs again. ``inputs``
        says a deterministic test's inputs in words (a case says its own); ``bitwise`` (default:
        the run's profile) says how they were judged."""
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
        if problems:
            self._remember(case, inputs, self.bitwise if bitwise is None else bitwise, comparisons, problems)
        return problems

    def assert_comparisons(
        self,
        comparisons,
        *,
        case=None,
        inputs: str | None = None,
        bitwise: bool | None = None,
        prefix: str = "",
        limit: int = SHOWN_PROBLEMS,
    ) -> None:
        """:meth:`record`, then raise ``AssertionError`` listing the problems (each after ``prefix``)."""
        problems = self.record(comparisons, case=case, inputs=inputs, bitwise=bitwise)
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

    def _remember(self, case, inputs, bitwise: bool, comparisons: Comparisons, problems: list) -> None:
        """The test's reproducer holds the last failure it recorded (hypothesis runs the smallest
        failing example last)."""
        failing = [_failing_entry(c) for c in comparisons if c.problems]
        self.failing_input = case.describe() if case is not None else inputs
        self._failure = {
            "case": case,
            "input": self.failing_input,
            "bitwise": bool(bitwise),
            "failing": failing,
            "problems": problems,
        }

    def reproducer(self, test_id: str, clauses: list, implementation: dict, device: str) -> bytes | None:
        """The failed test's reproducer (SPEC 4.5.6): the bytes of a ``torch.save`` d dict of schema
        :data:`REPRO_SCHEMA` with the test id and clauses, the implementation (name, version, spec),
        the device, the torch version and its case: the drawn case's inputs (``case``), or the test
        id to run again (``rerun``) with its inputs in words (``input``, None when the test gave
        none); the profile and the failing comparisons; None when no comparison failed. Forgets the
        failure."""
        failure, self._failure = self._failure, None
        if failure is None:
            return None
        import torch

        case = failure["case"]
        replay = (
            {"case": case.payload()} if case is not None else {"rerun": test_id, "input": failure["input"]}
        )
        payload = {
            "schema": REPRO_SCHEMA,
            "test_id": test_id,
            "clauses": [str(c) for c in clauses],
            "implementation": dict(implementation),
            "device": str(device),
            "torch": str(torch.__version__),
            "cases": [
                {
                    **replay,
                    "bitwise": failure["bitwise"],
                    "failing": failure["failing"],
                    "problems": failure["problems"],
                }
            ],
        }
        buffer = io.BytesIO()
        torch.save(payload, buffer)
        return buffer.getvalue()

    def forget_reproducers(self) -> None:
        self._failure = None


def _failing_entry(c: Comparison) -> dict:
    """A failing comparison as a reproducer records it: its margin, its problems and its worst
    elements (plain values)."""
    return {
        "what": c.what,
        "kind": c.kind,
        "error": float(c.error),
        "bound": float(c.bound),
        "differing": int(c.differing),
        "total": int(c.total),
        "problems": list(c.problems),
        "worst": [
            {
                "label": str(o.label),
                "index": [int(i) for i in o.index],
                "expected": float(o.expected),
                "observed": float(o.observed),
                "allowed": float(o.allowed),
            }
            for o in c.offenders
        ],
    }
