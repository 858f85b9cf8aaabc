"""Reference DCP resharding adapter for the Gefen optimizer (save side).

Public API: :class:`GefenDCPState`, :class:`GefenSavePlanner`,
:class:`GefenFileSystemWriter`. The normative rules are SPEC.md Part 2.
"""

from .planner import GefenSavePlanner
from .state import GefenDCPState
from .writer import GefenFileSystemWriter

__all__ = ["GefenDCPState", "GefenSavePlanner", "GefenFileSystemWriter"]
