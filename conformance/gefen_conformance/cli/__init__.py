"""The ``gefen-conformance`` command line (SPEC 4.4, 4.5, 5.5): it parses, dispatches to the
library, and maps what the library returns to exit statuses (:class:`~gefen_conformance.exit_codes.ExitCode`).

    gefen-conformance certify [--impl NAME] [--out PATH] [TEST_ID ...] [-- PYTEST_ARGS...]   certify
    gefen-conformance golden generate|check|compare ...                                     golden
    gefen-conformance report|diff|merge|verify|expectations ...                             certificates
    gefen-conformance repro CERT TEST_ID                                                    repro
    gefen-conformance vectors export|check ...                                              vectors

One module per command or family of commands (the last column), each with a ``register``
function; ``command`` builds the parser (:func:`build_parser`) and runs it (:func:`main`);
``usage`` holds what they share (usage errors, ``--version``, the exit-status tables).
"""

from gefen_conformance.cli.command import build_parser, main

__all__ = ["build_parser", "main"]
