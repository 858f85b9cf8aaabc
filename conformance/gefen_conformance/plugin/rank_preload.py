"""What the suite's rank processes import before they report ready (SPEC 4.2.11; private).

The plugin names this module as the pool's preload (``harness.pool.prepare_workers``), so the
fork server imports it once and so every rank worker forked from it starts with
the suite's scenario modules and the parts of torch their first DTensor and DCP calls would
otherwise import inside a call's deadline (``torch._dynamo`` and ``torch._inductor`` modules from
``distribute_tensor``, the DCP planners and writers). torchrun ranks import it at start-up
(``--prepare gefen_conformance.plugin.warmup:prepare_rank``). The harness itself never imports it.

Only imports, and none that starts a thread or touches an accelerator: a fork server must stay
single-threaded. What they made is then frozen (``gc.freeze``, as Python's documentation advises
before a fork). A module that fails to import is skipped here; the call that needs it reports
the error with its traceback.
"""

from __future__ import annotations

import gc
import importlib
import pkgutil

#: torch's modules that a scenario's first DTensor, mesh and DCP calls import lazily
TORCH_MODULES = (
    "torch.distributed.tensor",
    "torch.distributed.device_mesh",
    "torch.distributed.checkpoint",
    "torch.distributed.checkpoint.state_dict_saver",
    "torch.distributed.checkpoint.state_dict_loader",
    "torch.distributed.checkpoint.default_planner",
    "torch.distributed.checkpoint.filesystem",
    "torch.distributed.checkpoint.staging",
    "torch.distributed.checkpoint._fsspec_filesystem",  # imports fsspec where it is installed
    "torch.distributed.checkpoint.state_dict",
    "torch.distributed.fsdp",  # the training stack's fully_shard (SPEC 4.3.14)
    "torch.amp",
    "torch.utils.serialization",
    "torch.profiler",
    "torch._dynamo",
)
#: the suite's own modules whose functions run in ranks
SUITE_MODULES = (
    "gefen_reference",
    "gefen_reference.dcp",
    "gefen_conformance.workload.models",
    "gefen_conformance.workload.runs",
    "gefen_conformance.workload.saving",
    "gefen_conformance.workload.stack",
    "gefen_conformance.golden",
    "gefen_conformance.harness.sharding",
    "gefen_conformance.implementations.registry",
)


def modules() -> list[str]:
    """Every module imported here: torch's, the suite's shared ones, and each scenario module."""
    names = list(TORCH_MODULES) + list(SUITE_MODULES)
    try:
        suite = importlib.import_module("gefen_conformance.suite")
        names += [f"gefen_conformance.suite.{info.name}" for info in pkgutil.iter_modules(suite.__path__)]
    except Exception:  # noqa: BLE001
        pass
    return names


def load() -> None:
    for name in modules():
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - see the module docstring
            pass
    # What the fork server imported, out of the cyclic garbage collector's reach in it and in every
    # rank worker forked from it: a worker's collections traverse what its calls made, not torch's
    # modules again each time, and leave the pages it shares with the server unwritten.
    gc.freeze()


load()
