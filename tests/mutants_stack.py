"""Mutants that only the real training stack catches (FSDP2 ``fully_shard``, mixed precision, a
real GradScaler, schedulers, an app-state checkpoint resumed on another world size), in the
catalogue of tests/mutants.py.

``ENTRIES`` maps a mutant's name to its :class:`tests.mutants.Entry`; tests/mutants.py adds them to
``CATALOGUE`` (and their ``--impl`` spec strings); ``SLOW`` names those whose selections are slow.
"""

from __future__ import annotations

ENTRIES: dict = {}
SLOW: frozenset = frozenset()
