"""A progress line per suite module while the suite runs (SPEC 4.4.11).

The suite's modules are its scenario groups (``test_dcp_reshard.py``, ``test_optimizer.py``, ...).
When the last selected test of a module finishes, one line says how long the module took and
where the run stands: tests done of the tests this run selected (its own census: the collection
of this process, or under xdist the collection the workers report), the time since the first
test started, and an estimate of the time left from the rate so far::

    gefen: test_dcp_reshard.py done, 14 tests in 3.0 s; 64 of 127 tests in 31 s, about 30 s left

The estimate assumes the remaining tests take as long on average as those done; it needs no
earlier run. Printed by the process that reports the tests: the single pytest process, the xdist
controller (workers print nothing), rank 0 of a torchrun job (the only rank that runs pytest).
Quiet under ``-q``, and without a terminal reporter.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from gefen_conformance.plugin.selection import suite_id

#: ``gefen: ...``, so that the line reads apart from pytest's own progress
PREFIX = "gefen:"


def module_of(test_id: str) -> str:
    return suite_id(test_id).partition("::")[0]


def duration(seconds: float) -> str:
    """``"42 s"``, ``"3 min 05 s"``, ``"1 h 02 min"``: seconds as people read them."""
    seconds = max(0.0, float(seconds))
    if seconds < 60:
        return f"{seconds:.1f} s" if seconds < 10 else f"{seconds:.0f} s"
    minutes, secs = divmod(int(round(seconds)), 60)
    if minutes < 60:
        return f"{minutes} min {secs:02d} s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours} h {minutes:02d} min"


class Progress:
    """Counts finished suite tests per module and writes a line when a module is done.

    ``write`` takes one line of text; ``clock`` is the monotonic clock (a test gives its own).
    """

    def __init__(self, write: Callable[[str], None], clock: Callable[[], float] = time.monotonic):
        self.write = write
        self.clock = clock
        self.expected: dict | None = None  # module -> set of suite ids this run selected
        self.done: dict = {}  # module -> set of suite ids finished
        self.module_start: dict = {}  # module -> clock at its first test's start
        self.started: float | None = None  # clock at the first test's start

    @property
    def total(self) -> int:
        return sum(map(len, self.expected.values())) if self.expected else 0

    def expect(self, test_ids: Iterable[str]) -> None:
        """The suite tests this run will run (set once: xdist's workers each report the same)."""
        if self.expected is not None:
            return
        expected: dict = {}
        for test_id in test_ids:
            sid = suite_id(test_id)
            expected.setdefault(module_of(sid), set()).add(sid)
        self.expected = expected

    def _module(self, test_id: str) -> str | None:
        """The module of ``test_id`` when it is a test this run expects, else None."""
        sid = suite_id(test_id)
        module = module_of(sid)
        return module if self.expected and sid in self.expected.get(module, ()) else None

    def started_test(self, test_id: str) -> None:
        module = self._module(test_id)
        if module is None:
            return
        now = self.clock()
        if self.started is None:
            self.started = now
        self.module_start.setdefault(module, now)

    def finished_test(self, test_id: str) -> None:
        module = self._module(test_id)
        if module is None:
            return
        done = self.done.setdefault(module, set())
        if suite_id(test_id) in done:
            return
        done.add(suite_id(test_id))
        if len(done) == len(self.expected[module]):
            self.write(self.line(module))

    def line(self, module: str) -> str:
        now = self.clock()
        started = self.started if self.started is not None else now
        module_s = now - self.module_start.get(module, started)
        count = len(self.expected[module])
        finished = sum(map(len, self.done.values()))
        total, elapsed = self.total, now - started
        text = (
            f"{PREFIX} {module} done, {count} test{'s' if count != 1 else ''} in {duration(module_s)}; "
            f"{finished} of {total} tests in {duration(elapsed)}"
        )
        if finished < total and finished:
            text += f", about {duration(elapsed / finished * (total - finished))} left"
        return text
