"""What the plugin attaches to a suite test's report: one typed record (SPEC 4.4.1, 4.4.8).

pytest carries ``report.user_properties`` from xdist workers to the controller, so the plugin puts
one :class:`ReportRecord` there, serialized as plain JSON-able values under :data:`KEY`, and the
controller reads it back with :meth:`ReportRecord.of` to write the certificate. A failed test's
reproducer travels beside it as a report attribute (:data:`REPRO`): its bytes stay out of junit XML
and logs.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

#: The user property that holds a suite test's record.
KEY = "gefen_conformance_record"
#: The report attribute that holds a failed test's reproducer (bytes).
REPRO = "gefen_conformance_repro"


@dataclass
class ReportRecord:
    """One phase's report of one suite test.

    ``id``: the suite's test id; ``clauses``: the SPEC clauses it checks; ``reason``: a one-line
    reason when it did not pass; ``margins`` and ``notes``: what its judge recorded in this phase;
    ``world_sizes``: the world sizes of the scenario calls it made; ``missing``: the capabilities it
    needs and the implementation lacks (a skip); ``where``: the failed ranks' source lines;
    ``not_run_here``: skipped because this launcher or machine is too small (SPEC 4.4.2);
    ``warm_up``: this process's warm-up, carried by its first report; ``input``: the failing input
    in words, when its judge recorded a failing comparison with its inputs.
    """

    id: str
    clauses: list = field(default_factory=list)
    reason: str = ""
    margins: list = field(default_factory=list)
    notes: list = field(default_factory=list)
    world_sizes: list = field(default_factory=list)
    missing: list = field(default_factory=list)
    where: list = field(default_factory=list)
    not_run_here: bool = False
    warm_up: dict | None = None
    input: str | None = None

    def attach(self, report) -> None:
        report.user_properties.append((KEY, asdict(self)))

    @classmethod
    def of(cls, report) -> ReportRecord | None:
        """The record attached to ``report``, or None (not a suite test's report)."""
        for key, value in report.user_properties:
            if key == KEY:
                return cls(**value)
        return None
