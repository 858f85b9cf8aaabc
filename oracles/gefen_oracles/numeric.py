"""Numeric comparison primitives and the two numeric profiles (SPEC 0.4, 5.3, 5.6).

* *bitwise* (``torch-exact`` profile, implementations declaring ``cpu-bit-exact``): dtype, shape
  and every element's bit pattern equal (:func:`bitwise_mismatch`, :func:`bitwise_comparison`);
* *tolerance* (every other implementation): float results within the bounds of SPEC 5.6, which
  :mod:`gefen_oracles.kernel_bounds` derives stage by stage and :mod:`gefen_oracles.pinned_step`,
  :mod:`gefen_oracles.free_running` and :mod:`gefen_oracles.checkpoint_compare` apply. Integers, flags,
  counters, names, identities, periods and hyperparameters stay exact in both profiles.

Checkers return :class:`Comparison` objects (what was compared, worst error, the bound at that
place, how many elements differed, the problems found, and for a failing one its worst elements,
:class:`Offender`) and never record anything themselves: the suite records them as margins
(``gefen_conformance.judging``) and ``gefen-conformance repro`` prints the offenders (SPEC 4.5.6).
:func:`profile_description` is what the certificate embeds: every rule and bound applied, in words and
numbers.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

import torch

from . import kernel_bounds


class Profile(str, enum.Enum):
    """The two numeric profiles (SPEC 0.4.3); the values are the names certificates record."""

    TORCH_EXACT = "torch-exact"  # bitwise against the reference (SPEC 5.3.1)
    TOLERANCE = "tolerance"  # the stage-by-stage rounding bounds of SPEC 5.6 (SPEC 5.3.2)

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Mismatch:
    what: str
    detail: str

    def __str__(self) -> str:
        return f"{self.what}: {self.detail}"


#: How many of its worst elements a failing comparison keeps (:attr:`Comparison.offenders`).
OFFENDERS = 10


@dataclass(frozen=True)
class Offender:
    """One element of a failing comparison: the tensor it lies in (``label``), its index there,
    the expected and observed values, and ``allowed``, the largest ``|observed - expected|`` the
    bound admits at that element (0.0 in a bitwise comparison)."""

    label: str
    index: tuple
    expected: float
    observed: float
    allowed: float

    @property
    def difference(self) -> float:
        d = abs(self.observed - self.expected)
        return math.inf if math.isnan(d) else d

    @property
    def share(self) -> float:
        """``|observed - expected| / allowed`` (inf where nothing is allowed and they differ)."""
        return _used(self.difference, self.allowed)


def worst_elements(
    label: str,
    expected: torch.Tensor,
    observed: torch.Tensor,
    allowed,
    *,
    shape=None,
    bitwise: bool = False,
    count: int = OFFENDERS,
) -> list:
    """The ``count`` elements of ``observed`` farthest outside their allowance ``allowed`` (a number
    or a tensor of absolute differences, broadcast to ``expected``), worst first: by
    ``|observed - expected| / allowed``, then by the difference. Elements equal to their expected
    value are left out; ``bitwise`` compares bit patterns (signed zeros and NaN payloads differ).
    ``shape`` (default ``expected``'s) turns flat positions into indices."""
    e = expected.detach().cpu().reshape(-1)
    o = observed.detach().cpu().reshape(-1)
    shape = tuple(expected.shape if shape is None else shape)
    if e.numel() == 0 or e.numel() != o.numel():
        return []
    if bitwise:
        differs = differing_bits(e, o) if e.dtype == o.dtype else torch.ones(e.shape, dtype=torch.bool)
    e, o = e.double(), o.double()
    diff = (o - e).abs()
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, math.inf), diff)
    if not bitwise:
        differs = diff > 0
    room = (
        torch.as_tensor(allowed, dtype=torch.float64).reshape(-1).expand_as(e)
        if torch.is_tensor(allowed)
        else torch.full_like(e, float(allowed))
    )
    share = torch.where(room > 0, diff / room, torch.full_like(diff, math.inf))
    share = torch.where(differs, torch.nan_to_num(share, nan=math.inf), torch.zeros_like(share))
    order = torch.argsort(diff, descending=True, stable=True)
    order = order[torch.argsort(share[order], descending=True, stable=True)]
    order = order[differs[order]][:count]
    out = []
    for i in order.tolist():
        index = _unravel(i, shape) if shape else ()
        out.append(Offender(label, index, e[i].item(), o[i].item(), float(room[i])))
    return out


def _unravel(flat: int, shape) -> tuple:
    """The index of element ``flat`` of a row-major tensor of ``shape`` (``torch.unravel_index``
    imports torch's symbolic-shapes machinery, about a second, on its first call)."""
    index = []
    for size in reversed(tuple(shape)):
        flat, k = divmod(flat, int(size))
        index.append(k)
    return tuple(reversed(index))


#: A bound above this is no bound: it came out of an overflow (a division by a tiny value), and
#: a message that quotes it says so.
OVERFLOWED_ABOVE = 1e300


def nonfinite_text(expected: torch.Tensor, observed) -> str | None:
    """In words, the elements of ``observed`` that are NaN or infinite where ``expected`` is finite
    ("1920 of 1920 elements NaN; the reference is finite"), or None when there are none."""
    if not torch.is_tensor(observed) or observed.numel() == 0 or observed.numel() != expected.numel():
        return None
    e = expected.detach().reshape(-1).cpu().double()
    o = observed.detach().reshape(-1).cpu().double()
    finite_here = torch.isfinite(e)
    nan = int((torch.isnan(o) & finite_here).sum())
    inf = int((torch.isinf(o) & finite_here).sum())
    if not nan and not inf:
        return None
    parts = [
        f"{nan} of {o.numel()} elements NaN" if nan else "",
        f"{inf} of {o.numel()} infinite" if inf else "",
    ]
    where = "the reference is finite" if bool(finite_here.all()) else "the reference is finite there"
    return f"{', '.join(p for p in parts if p)}; {where}"


def bound_text(bound: float) -> str:
    """A bound as a message quotes it: its value, or that it overflowed."""
    if not math.isfinite(bound) or bound > OVERFLOWED_ABOVE:
        return f"bound {bound:.3e} (it overflowed: no bound holds there)"
    return f"bound {bound:.3e}"


def _worst_of(offenders: list) -> list:
    return sorted(offenders, key=lambda x: (x.share, x.difference), reverse=True)[:OFFENDERS]


@dataclass
class Comparison:
    """One compared quantity. ``kind`` is "tolerance" (``error`` and ``bound`` in one unit, the
    worst place) or "bitwise" (``differing`` of ``total`` elements differ). ``problems`` holds one
    message per violation; empty means the comparison passed."""

    what: str
    kind: str
    error: float = 0.0
    bound: float = 0.0
    differing: int = 0
    total: int = 0
    problems: list = field(default_factory=list)
    offenders: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def worse_than(self, other: Comparison) -> bool:
        if self.kind == "bitwise":
            return self.differing > other.differing
        return _used(self.error, self.bound) > _used(other.error, other.bound)


def _used(error: float, bound: float) -> float:
    if error == 0.0:
        return 0.0
    return math.inf if bound <= 0.0 or not math.isfinite(error) else error / bound


class Comparisons:
    """Comparisons merged by ``what``: the worst of each kept, every problem kept, and notes: facts
    the certificate's reader must know about what was (not) compared."""

    def __init__(self, comparisons: Iterable[Comparison] = ()):
        self._by_what: dict[str, Comparison] = {}
        self.problems: list[str] = []
        self.notes: list[str] = []
        self.extend(comparisons)

    def add(self, comparison: Comparison) -> Comparison:
        self._keep(comparison)
        self.problems.extend(comparison.problems)
        return comparison

    def merge(self, other: Comparisons) -> None:
        """Take over every comparison and every problem of ``other``."""
        for comparison in other:
            self._keep(comparison)
        self.problems.extend(other.problems)
        for text in other.notes:
            self.note(text)

    def _keep(self, comparison: Comparison) -> None:
        old = self._by_what.get(comparison.what)
        if old is None:
            self._by_what[comparison.what] = comparison
        else:
            if comparison.worse_than(old):
                merged = Comparison(
                    comparison.what,
                    comparison.kind,
                    comparison.error,
                    comparison.bound,
                    comparison.differing,
                    comparison.total + (old.total if old.kind == "bitwise" else 0),
                )
            else:
                merged = Comparison(
                    old.what,
                    old.kind,
                    old.error,
                    old.bound,
                    old.differing,
                    old.total + (comparison.total if old.kind == "bitwise" else 0),
                )
            merged.problems = old.problems + comparison.problems
            merged.offenders = _worst_of(old.offenders + comparison.offenders)
            self._by_what[comparison.what] = merged

    def extend(self, comparisons: Iterable[Comparison]) -> None:
        for c in comparisons:
            self.add(c)

    def problem(self, message: str) -> None:
        """A violation of an exact rule that has no numeric margin (a missing key, a wrong dtype)."""
        self.problems.append(message)

    def exact(self, what: str, differing: int, total: int, problems: Iterable[str] = ()) -> Comparison:
        """An exact comparison of ``total`` items (counts, names, digests), ``differing`` of them wrong,
        with the messages ``problems`` saying which (kept only when some differ; a count otherwise);
        exact in every profile."""
        problems = (list(problems) or [f"{what}: {differing} of {total} differ"]) if differing else []
        return self.add(
            Comparison(what, "bitwise", differing=int(differing), total=int(total), problems=list(problems))
        )

    def note(self, text: str) -> None:
        """A fact the certificate's reader must see (kept once)."""
        if text not in self.notes:
            self.notes.append(text)

    def __iter__(self):
        return iter(self._by_what.values())

    @property
    def ok(self) -> bool:
        return not self.problems


def _bits(t: torch.Tensor) -> torch.Tensor:
    view = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()]
    return t.detach().contiguous().view(view) if t.is_floating_point() else t.detach()


def differing_bits(expected: torch.Tensor, actual: torch.Tensor) -> torch.Tensor:
    """Boolean mask of elements whose bit patterns differ (same dtype and shape assumed)."""
    return _bits(expected.cpu()) != _bits(actual.cpu())


def bitwise_mismatch(what: str, expected: torch.Tensor, actual: torch.Tensor) -> Mismatch | None:
    """None when ``actual`` has the dtype, shape and exact bits of ``expected`` (SPEC 5.3.1)."""
    if not torch.is_tensor(actual):
        return Mismatch(what, f"expected a tensor, got {type(actual).__name__}")
    if expected.dtype != actual.dtype:
        return Mismatch(what, f"dtype {actual.dtype}, expected {expected.dtype}")
    if tuple(expected.shape) != tuple(actual.shape):
        return Mismatch(what, f"shape {tuple(actual.shape)}, expected {tuple(expected.shape)}")
    differs = differing_bits(expected, actual)
    if bool(differs.any()):
        n = int(differs.sum())
        i = int(differs.reshape(-1).nonzero()[0])
        e, a = expected.reshape(-1)[i].item(), actual.reshape(-1)[i].item()
        return Mismatch(
            what,
            f"{n} of {expected.numel()} elements differ; first at flat index {i}: {a!r} vs expected {e!r}",
        )
    return None


def bitwise_comparison(what: str, expected: torch.Tensor, actual, *, label: str | None = None) -> Comparison:
    """A bitwise :class:`Comparison` of two tensors (dtype and shape first)."""
    total = int(expected.numel())
    mismatch = bitwise_mismatch(label or what, expected, actual)
    if mismatch is None:
        return Comparison(what, "bitwise", total=total)
    same_form = torch.is_tensor(actual) and actual.dtype == expected.dtype and actual.shape == expected.shape
    differing = int(differing_bits(expected, actual).sum()) if same_form else total
    offenders = worst_elements(label or what, expected, actual, 0.0, bitwise=True) if same_form else []
    return Comparison(
        what,
        "bitwise",
        differing=max(differing, 1),
        total=total,
        problems=[str(mismatch)],
        offenders=offenders,
    )


def relative_comparison(
    what: str,
    expected: torch.Tensor,
    actual: torch.Tensor,
    rtol: torch.Tensor | float,
    *,
    label: str | None = None,
    atol: float = 0.0,
) -> Comparison:
    """``|actual - expected| <= rtol * |expected| + atol`` elementwise (``rtol`` may vary per element).

    The recorded error is the worst ``|actual - expected| / |expected|`` (relative to the
    expected value) and the bound the ``rtol`` at that element.
    """
    label = label or what
    if not torch.is_tensor(actual) or tuple(actual.shape) != tuple(expected.shape):
        shape = tuple(actual.shape) if torch.is_tensor(actual) else type(actual).__name__
        return Comparison(
            what,
            "tolerance",
            math.inf,
            0.0,
            problems=[f"{label}: shape {shape}, expected {tuple(expected.shape)}"],
        )
    e, a = expected.detach().double().cpu(), actual.detach().double().cpu()
    if e.numel() == 0:
        return Comparison(what, "tolerance", 0.0, 0.0)
    rtol_t = torch.as_tensor(rtol, dtype=torch.float64).expand_as(e)
    err = (a - e).abs()
    allowed = rtol_t * e.abs() + atol
    bad = ~(err <= allowed)
    scale = e.abs().clamp_min(torch.finfo(torch.float64).tiny)
    ratio = torch.where(
        allowed > 0,
        err / allowed,
        torch.where(err > 0, torch.full_like(err, math.inf), torch.zeros_like(err)),
    )
    i = int(ratio.reshape(-1).argmax())
    error = float((err / scale).reshape(-1)[i]) if float(err.reshape(-1)[i]) > 0 else 0.0
    bound = float((allowed / scale).reshape(-1)[i])
    problems, offenders = [], []
    if bool(bad.any()):
        nonfinite = nonfinite_text(e, a)
        problems.append(
            f"{label}: {nonfinite}"
            if nonfinite
            else f"{label}: {int(bad.sum())} of {e.numel()} elements outside the bound; worst at flat index "
            f"{i}: {a.reshape(-1)[i].item()!r} vs {e.reshape(-1)[i].item()!r} (relative error {error:.3e}, "
            f"{bound_text(bound)})"
        )
        offenders = worst_elements(label, e, a, allowed, shape=expected.shape)
    return Comparison(what, "tolerance", error, bound, problems=problems, offenders=offenders)


def profile_description(profile: Profile | str) -> dict:
    """The numeric profile ``profile`` (a :class:`Profile` or its name) as the certificate states it:
    every rule applied and every bound, with the SPEC clause that derives it (SPEC 0.4, 5.3, 5.6)."""
    try:
        profile = Profile(profile)
    except ValueError:
        raise ValueError(f"unknown numeric profile {profile!r} (known: torch-exact, tolerance)") from None
    if profile is Profile.TORCH_EXACT:
        return {
            "name": profile.value,
            "comparison": "bitwise: dtype, shape and every element's bits, for every result the suite "
            "compares "
            "with the reference, and md5 identity of checkpoint payloads (SPEC 5.3.1, 5.2)",
            "continuation_after_reshard": {"max_abs": kernel_bounds.CONTINUATION_MAX_ABS, "clause": "5.3.3"},
            "bounds": kernel_bounds.stated("torch-exact"),
        }
    return dict(name=profile.value, **kernel_bounds.describe())
