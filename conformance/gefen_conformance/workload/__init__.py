"""What the suite feeds an implementation (SPEC 4.2.4, 4.3).

``from gefen_conformance import workload`` gives one vocabulary: ``models`` (the named models and
their deterministic initial values and gradients), ``saving`` (save and load through an
implementation's DCP adapter) and ``runs`` (the optimizer comparisons' runs of the reference and
an implementation), their public names all reachable as ``workload.NAME``. Apart, imported by
name: ``space``, the optimizer's input space (SPEC 4.3.10), and ``space_driver``, which drives one
side through a case; and
``checkpoint_in_memory``, DCP storage held in memory for scenarios that inspect what an adapter
writes.
"""

from gefen_conformance.workload import models, runs, saving
from gefen_conformance.workload.models import *  # noqa: F401,F403
from gefen_conformance.workload.runs import *  # noqa: F401,F403
from gefen_conformance.workload.saving import *  # noqa: F401,F403

__all__ = [*models.__all__, *runs.__all__, *saving.__all__]
