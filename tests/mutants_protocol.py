"""Mutants of the optimizer's calling protocol (GradScaler, closures, zero_grad, hyperparameter
changes, state_dict), in the catalogue of tests/mutants.py.

``ENTRIES`` maps a mutant's name to its :class:`tests.mutants.Entry`; tests/mutants.py adds them to
``CATALOGUE`` (and their ``--impl`` spec strings); ``SLOW`` names those whose selections are slow.
"""

from __future__ import annotations

ENTRIES: dict = {}
SLOW: frozenset = frozenset()
