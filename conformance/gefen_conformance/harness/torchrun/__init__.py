"""The torchrun launcher (SPEC 4.7): every rank of a ``torchrun`` job runs ``python -m
gefen_conformance.harness.torchrun`` (:mod:`~gefen_conformance.harness.torchrun.entry`); rank 0 runs
pytest with a :class:`~gefen_conformance.harness.torchrun.launcher.TorchrunLauncher` installed
(:mod:`~gefen_conformance.harness.torchrun.job`: the job's store and its commands), and the other
ranks serve scenario calls (:mod:`~gefen_conformance.harness.torchrun.serve`, each call's
:mod:`~gefen_conformance.harness.torchrun.rank` participation). What a rank prepares before the
first call is named on its command line (``--prepare``), never imported from here.
"""

from gefen_conformance.harness.torchrun.entry import PYTEST_ARGS, main, pytest_arguments

__all__ = ["PYTEST_ARGS", "main", "pytest_arguments"]
