"""What a suite test observed beyond pass or fail: numeric margins and notes (SPEC 4.4, 5.3).

A suite test, or a check it calls in the test process, records here:

* :func:`margin` for every tolerance comparison: the worst error it saw, the bound it was held
  to, and their ratio ``used`` (0 = exact, 1 = at the bound, > 1 = outside it);
* :func:`bitwise` for every bitwise comparison: how many elements differed out of how many;
* :func:`note` for a fact the reader of the certificate must know (a check that could not run
  in this environment, for example).

The plugin calls :func:`drain` when a test's call phase ends and attaches the result to the test's
report, so the entries travel with it (from xdist workers too) into the certificate. Entries with
the same ``what`` inside one test are merged: the worst one is kept, so a check may record per
step or per element group without bloating the certificate. Outside a suite run nothing drains
the entries; :func:`drain` at the start of a test drops anything left over.
"""

from __future__ import annotations

import math

_margins: dict[str, dict] = {}
_notes: list[str] = []


def _ratio(error: float, bound: float) -> float:
    if error == 0.0:
        return 0.0
    if bound <= 0.0 or not math.isfinite(error):
        return math.inf
    return error / bound


def _keep_worst(what: str, entry: dict) -> None:
    old = _margins.get(what)
    if old is None or _severity(entry) > _severity(old):
        _margins[what] = entry


def _severity(entry: dict) -> float:
    return entry["used"] if entry["kind"] == "tolerance" else float(entry["differing"] > 0) * math.inf


def margin(what: str, *, error: float, bound: float) -> float:
    """Record a tolerance comparison of ``what``; returns the share of the bound used."""
    error, bound = float(error), float(bound)
    used = _ratio(error, bound)
    _keep_worst(what, {"what": what, "kind": "tolerance", "error": error, "bound": bound, "used": used})
    return used


def bitwise(what: str, *, differing: int, total: int) -> None:
    """Record a bitwise comparison of ``what``: ``differing`` of ``total`` elements differ."""
    _keep_worst(what, {"what": what, "kind": "bitwise", "differing": int(differing), "total": int(total)})


def note(text: str) -> None:
    """Record a fact the certificate's reader must see (said once per test however often noted)."""
    if text not in _notes:
        _notes.append(text)


def drain() -> dict:
    """``{"margins": [...], "notes": [...]}`` recorded since the last drain, then forget them.

    Infinite ratios are written as None (JSON has no infinity): the comparison failed outright.
    """
    margins = [
        dict(e, used=e["used"] if math.isfinite(e["used"]) else None) if e["kind"] == "tolerance" else dict(e)
        for e in _margins.values()
    ]
    notes = list(_notes)
    _margins.clear()
    _notes.clear()
    return {"margins": margins, "notes": notes}
