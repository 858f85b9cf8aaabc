"""Reference DCP resharding adapter for the Gefen optimizer.

Public API: :class:`GefenDCPState` (``state_dict()`` to save, ``load_state_dict()``
to restore at any world size), :class:`GefenSavePlanner`,
:class:`GefenFileSystemWriter`, and :data:`STATE_LAYOUT`, the declaration by which an
optimizer class other than ``gefen_reference.Gefen`` opts in to this adapter (see
:mod:`gefen_reference.dcp.optimizer_view`, SPEC 2.3.6). The normative rules are SPEC.md Part 2 (format
and save) and Part 3 (load, resharding and hyperparameter staging; the staging
rules are the pure module :mod:`gefen_reference.dcp.hyper_staging`).
"""

from .optimizer_view import STATE_LAYOUT
from .planner import GefenSavePlanner
from .state import GefenDCPState
from .writer import GefenFileSystemWriter

__all__ = ["GefenDCPState", "GefenSavePlanner", "GefenFileSystemWriter", "STATE_LAYOUT"]
