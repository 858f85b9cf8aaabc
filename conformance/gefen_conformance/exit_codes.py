"""The exit statuses of a suite run and of every ``gefen-conformance`` command (SPEC 4.1.6, 4.4.9,
4.4.13).

One :class:`ExitCode` for the whole package: the suite run's statuses are pytest's own
(``pytest.ExitCode``: 0 to 5) and two more verdicts (6, 7); the commands that read files reuse
2 and 3 for what they mean there, under their own names (aliases of the same values). What each
status means to each command is in that command's ``--help`` (:mod:`gefen_conformance.cli`).

This module imports nothing, so that every layer that has a status to give (the certificate's
verdicts, the torchrun ranks, the command line) can import it.
"""

from __future__ import annotations

import enum


class ExitCode(enum.IntEnum):
    """An exit status; a member is the ``int`` a process exits with."""

    #: conformant; a command that did what it was asked (written, verified, passed)
    OK = 0
    #: not-conformant; problems found, a regression, a vector or replay that fails
    FAILED = 1
    #: a suite run that was interrupted (verdict incomplete)
    INTERRUPTED = 2
    #: pytest's internal error (no certificate)
    INTERNAL_ERROR = 3
    #: a command line or an implementation that cannot run: nothing ran, nothing written
    USAGE_ERROR = 4
    #: pytest collected no test (no certificate)
    NO_TESTS_COLLECTED = 5
    #: a narrowed suite run, or scenarios that did not run here (verdict partial)
    PARTIAL = 6
    #: no test passed (verdict inconclusive)
    INCONCLUSIVE = 7

    #: a certificate, manifest, vector or reproducer that cannot be read (report, diff, verify,
    #: merge, expectations, repro, vectors check)
    UNREADABLE = 2
    #: ``verify``: the certificate does not verify
    DOES_NOT_VERIFY = 3
