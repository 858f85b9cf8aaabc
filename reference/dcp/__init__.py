"""Reference DCP resharding adapter for the Gefen optimizer.

Public API: :class:`GefenDCPState` (``state_dict()`` to save, ``load_state_dict()``
to restore at any world size), :class:`GefenSavePlanner`,
:class:`GefenFileSystemWriter`. The normative rules are SPEC.md Part 2 (format
and save) and Part 3 (load, resharding and hyperparameter staging; the staging
rules are the pure module :mod:`reference.dcp.hyper_staging`).
"""

from .planner import GefenSavePlanner
from .state import GefenDCPState
from .writer import GefenFileSystemWriter

__all__ = ["GefenDCPState", "GefenSavePlanner", "GefenFileSystemWriter"]
