"""Deadlines that a slow machine stretches and a hung rank does not escape (SPEC 4.2.10).

Every bound of the harness is stated in *quiet seconds* and counted by a :class:`Deadline` on a
clock that advances by the wall time divided by the machine's stretch (runnable threads other
than the waiter per CPU, clamped to 1 .. :data:`MAX_STRETCH`, sampled whenever the waiter wakes,
at least every :data:`SAMPLE_S`), times the run's deadline scale (:func:`scale`, set by
:func:`set_scale` and exported to child processes as ``GEFEN_DEADLINE_SCALE``). A bound that must
be fixed in wall time in advance (gloo's collective timeout) is :func:`wall_bound`. SPEC 4.2.10
gives the formula and why it neither takes a slow rank for a hung one nor lets a hung one escape.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable

__all__ = [
    "Deadline",
    "wait_until",
    "MAX_STRETCH",
    "SAMPLE_S",
    "parse_scale",
    "scale",
    "set_scale",
    "settled_stretch",
    "stretch_now",
    "wall_bound",
]

#: the most a machine's load stretches a deadline: a rank that truly hangs is reported within
#: ``MAX_STRETCH * scale * seconds`` of wall time, whatever the load
MAX_STRETCH = 20.0
#: how often a supervisor samples the load while it waits (seconds)
SAMPLE_S = 0.2
#: the environment variable that carries the deadline scale to child processes
SCALE_ENV = "GEFEN_DEADLINE_SCALE"

_scale: float | None = None


def parse_scale(text) -> float:
    """A deadline scale: a finite number > 0 (``ValueError`` naming the problem otherwise)."""
    try:
        value = float(text)
    except (TypeError, ValueError):
        raise ValueError(f"the deadline scale must be a number > 0, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"the deadline scale must be a finite number > 0, got {text!r}")
    return value


def scale() -> float:
    """This process's deadline scale: :func:`set_scale`'s, else ``$GEFEN_DEADLINE_SCALE``, else 1."""
    if _scale is not None:
        return _scale
    text = os.environ.get(SCALE_ENV)
    if not text:
        return 1.0
    try:
        return parse_scale(text)
    except ValueError:
        return 1.0  # the plugin and the CLI refuse a bad value; a stray one here changes nothing


def set_scale(value: float | None) -> float | None:
    """Set this process's deadline scale (None: back to the environment's); returns the previous
    setting. Also exported in ``$GEFEN_DEADLINE_SCALE`` for the processes this one starts."""
    global _scale
    previous = _scale
    if value is None:
        _scale = None
        os.environ.pop(SCALE_ENV, None)
    else:
        _scale = parse_scale(value)
        os.environ[SCALE_ENV] = repr(_scale)
    return previous


def _cpus() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def _others() -> float:
    """Runnable threads on the machine other than the caller (`/proc/loadavg`'s fourth field; the
    1-minute load average where that file does not exist)."""
    try:
        with open("/proc/loadavg", "rb") as handle:
            running = handle.read().split()[3].split(b"/")[0]
        return max(0.0, float(running) - 1.0)
    except (OSError, IndexError, ValueError):
        try:
            return os.getloadavg()[0]
        except (AttributeError, OSError):
            return 0.0


def stretch_now() -> float:
    """How much slower than quiet the machine runs a runnable process right now (1 .. MAX_STRETCH)."""
    return min(MAX_STRETCH, max(1.0, _others() / _cpus()))


def settled_stretch(samples: int = 5, spacing_s: float = 0.002) -> float:
    """The median of a few :func:`stretch_now` samples (one sample of the kernel's runnable count
    is noisy): for a wall timeout that must be fixed in advance, such as gloo's collective timeout."""
    values = []
    for index in range(samples):
        if index:
            time.sleep(spacing_s)
        values.append(stretch_now())
    return sorted(values)[len(values) // 2]


def wall_bound(seconds: float) -> float:
    """The wall seconds to allow, from now, for ``seconds`` of quiet work when the bound must be
    fixed in advance (gloo's collective timeout, a wait for stack dumps): scaled, and stretched by
    the machine's load as it is now (:func:`settled_stretch`)."""
    return seconds * scale() * settled_stretch()


class Deadline:
    """``seconds`` quiet seconds (times the deadline scale), counted from now on the load clock.

    Call :meth:`expired` (or :meth:`tick`) whenever the waiter wakes up, and wake at least every
    :meth:`wait_s`; the clock advances between two looks by the wall time divided by the stretch
    sampled at the later look.
    """

    def __init__(self, seconds: float, *, scaled: bool = True) -> None:
        if not seconds > 0:
            raise ValueError(f"a deadline must be positive, got {seconds!r}")
        self.seconds = float(seconds)
        self.scale = scale() if scaled else 1.0
        self.quiet = self.seconds * self.scale
        self.started = self._last = time.monotonic()
        self.spent = 0.0  # quiet seconds so far
        self.stretch = 1.0  # the stretch at the last look
        self.peak_stretch = 1.0

    def tick(self) -> float:
        """Advance the clock to now; the quiet seconds spent."""
        now = time.monotonic()
        if now > self._last:
            self.stretch = stretch_now()
            self.peak_stretch = max(self.peak_stretch, self.stretch)
            self.spent += (now - self._last) / self.stretch
            self._last = now
        return self.spent

    def expired(self) -> bool:
        return self.tick() >= self.quiet

    def remaining(self) -> float:
        """Quiet seconds left (0 once expired)."""
        return max(0.0, self.quiet - self.tick())

    def wait_s(self) -> float:
        """How long a waiter may sleep before it looks again (wall seconds, at most :data:`SAMPLE_S`)."""
        return max(0.0, min(SAMPLE_S, self.remaining() * self.stretch))

    def wall_elapsed(self) -> float:
        return time.monotonic() - self.started

    def describe(self, what: str = "deadline") -> str:
        """ "the 60 s deadline" with what scaled and stretched it, for a hung rank's message."""
        text = f"the {self.seconds:g} s {what}"
        if self.scale != 1.0:
            text += f" (scaled by {self.scale:g} to {self.quiet:g} s)"
        wall = self.wall_elapsed()
        if wall > self.quiet * 1.05:
            text += (
                f", which the machine's load stretched to {wall:.1f} s of wall time "
                f"(up to {self.peak_stretch:.1f}x)"
            )
        return text


def wait_until(wait: Callable[[float], bool], seconds: float) -> bool:
    """Wait up to ``seconds`` quiet seconds (a :class:`Deadline`) for something: ``wait(t)`` blocks
    at most ``t`` wall seconds and returns True once it happened (``threading.Event.wait`` is
    one). Returns True when it happened, False when the deadline passed first."""
    deadline = Deadline(seconds)
    while True:
        if wait(max(deadline.wait_s(), 0.01)):
            return True
        if deadline.expired():
            return bool(wait(0))
