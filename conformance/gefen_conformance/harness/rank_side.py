"""What every launcher does inside a rank process (SPEC 4.2.1-4.2.4, 4.7.3-4.7.4).

A rank of either launcher (a pool worker, :mod:`~gefen_conformance.harness.pool.worker`; a
torchrun rank, :mod:`~gefen_conformance.harness.torchrun.rank`) runs its part in a call with
:func:`run_body`: unpickle ``fn``, form the call's default process group and wait until every
rank has it, bind the :class:`~gefen_conformance.harness.world.World`, run ``fn``, release the
group, and report a plain dict (``status`` and the fields of
:class:`~gefen_conformance.harness.outcomes.RankOutcome`; ``value`` and ``exc_bytes`` pickled)
that never raises. Every call starts with fresh random state and the caller's ``sys.path`` and
directory (:func:`reseed`, :func:`take_paths`) and ends with torch's global defaults put back
(:class:`TorchDefaults`). A rank whose parent is gone leaves (:func:`watch_parent`, exit code
:data:`EXIT_PARENT_GONE`).

Cheap to import: torch is imported by the functions that need it, never at module level (the
pool's worker imports this module before torch, after setting its thread variables).
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, NoReturn

from gefen_conformance.harness.exception_text import format_exception, qualified_name, safe_str
from gefen_conformance.harness.world import World, scope

__all__ = [
    "EXIT_PARENT_GONE",
    "SINGLE_THREAD_ENV",
    "TorchDefaults",
    "exception_report",
    "flush_streams",
    "make_current",
    "process_gone",
    "reseed",
    "run_body",
    "take_paths",
    "value_report",
    "wait_for_every_group",
    "watch_parent",
]

#: exit code of a rank process that noticed its parent (or the test process) is gone
EXIT_PARENT_GONE = 70
#: thread-pool variables set to 1 in every rank process (and in the pool's fork server)
SINGLE_THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")

#: the store keys of the barrier after group creation (:func:`wait_for_every_group`)
_INIT_COUNTER_KEY = "initialised"
_INIT_DONE_KEY = "all-initialised"
_WATCHDOG_PERIOD_S = 0.5


# --------------------------------------------------------------------------------------------
# Reports
# --------------------------------------------------------------------------------------------


def exception_report(exc: BaseException, prefix: str = "") -> dict:
    """The "raised" report of ``exc``: its type, ``prefix`` + message, traceback, and the
    exception itself pickled (None when it cannot be: it still travels as text)."""
    try:
        exc_bytes = pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException:  # noqa: BLE001 - unpicklable exceptions still travel as text
        exc_bytes = None
    return {
        "status": "raised",
        "exc_type": qualified_name(type(exc)),
        "message": prefix + safe_str(exc),
        "traceback": format_exception(exc),
        "exc_bytes": exc_bytes,
    }


def value_report(value: Any) -> dict:
    """The "ok" report of ``value`` (pickled); a "raised" one when it cannot be pickled."""
    try:
        return {"status": "ok", "value": pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)}
    except BaseException as exc:  # noqa: BLE001
        return exception_report(exc, f"the return value ({type(value).__name__}) is not picklable: ")


# --------------------------------------------------------------------------------------------
# One rank's part in one call
# --------------------------------------------------------------------------------------------


def run_body(
    payload: bytes,
    *,
    rank: int,
    world_size: int,
    device,
    backend: str,
    form_group: Callable[[], None],
    release_group: Callable[[], None],
    on_failure: Callable[[], None],
    die_hook: Callable[[int], NoReturn],
) -> dict:
    """Rank ``rank``'s part in a call whose ``(fn, args, kwargs)`` is ``payload``; its report.

    ``form_group()`` makes the call's default process group (and waits for every rank's,
    :func:`wait_for_every_group`); ``release_group()`` destroys it after ``fn`` returned;
    ``on_failure()`` runs when anything raised (the pool does nothing: its worker exits, which
    closes its connections; torchrun cuts them). ``die_hook`` is the World's (SPEC 4.2.4).
    Never raises: a failure before or after ``fn`` is reported with the stage it happened in.
    """
    import torch.distributed as dist

    stage = "unpickling fn/args/kwargs"
    try:
        fn, args, kwargs = pickle.loads(payload)
        stage = f"initialising the {backend} process group on {device}"
        form_group()
        if "torch.distributed.tensor" in sys.modules:
            # DTensor sharding caches are keyed on meshes without their rank (SPEC 4.2.3): a
            # process that served as another rank before would otherwise reuse its placements.
            from gefen_conformance.harness.sharding import forget_dtensor_caches

            forget_dtensor_caches()
        world = World(rank=rank, size=world_size, group=dist.group.WORLD, device=device, die_hook=die_hook)
        stage = "running fn"
        with scope(world):
            value = fn(*args, **kwargs)
        stage = "destroying the process group"
        release_group()
    except BaseException as exc:  # noqa: BLE001 - every failure is reported, none escapes
        on_failure()
        return exception_report(exc, "" if stage == "running fn" else f"[while {stage}] ")
    return value_report(value)


def wait_for_every_group(store, world_size: int) -> None:
    """Return once every rank of the call has its process group (a barrier on the call's store,
    no collective). gloo's connectFullMesh can return on one rank before a peer has finished its
    side; a rank whose ``fn`` is quick would then tear its sockets down under that peer."""
    if store.add(_INIT_COUNTER_KEY, 1) == world_size:
        store.set(_INIT_DONE_KEY, b"1")
    store.wait([_INIT_DONE_KEY])


def make_current(device) -> None:
    """Make an accelerator ``device`` this process's current one (NCCL's implicit device, and that
    of a body's bare ``.cuda()``); nothing for CPU."""
    if device.type == "cpu":
        return
    import torch

    setter = getattr(getattr(torch, device.type, None), "set_device", None)
    if setter is not None:
        setter(device)


def reseed() -> None:
    """Fresh, independent random state (torch, ``random`` and numpy if imported), as a newly
    started process has: ranks never share a random stream, whatever calls they served before.
    Scenarios that need reproducible numbers seed explicitly."""
    import random

    import torch

    random.seed()
    torch.manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        try:
            numpy.random.seed(int.from_bytes(os.urandom(4), "little"))
        except Exception:  # noqa: BLE001
            pass


def take_paths(sys_path: list[str], cwd: str) -> None:
    """The caller's ``sys.path`` and working directory (a directory that does not exist here,
    another node's say, is left alone)."""
    sys.path[:] = sys_path
    try:
        os.chdir(cwd)
    except OSError:
        pass


class TorchDefaults:
    """torch's global defaults as they are now (default dtype, grad mode, deterministic
    algorithms, thread count); :meth:`restore` puts back those a call changed, so that a rank
    that served a call looks like a fresh one."""

    def __init__(self) -> None:
        import torch

        self.dtype = torch.get_default_dtype()
        self.grad = torch.is_grad_enabled()
        self.deterministic = torch.are_deterministic_algorithms_enabled()
        self.threads = torch.get_num_threads()

    def restore(self) -> None:
        import torch

        # Only touch what changed: use_deterministic_algorithms() costs ~1 s of imports the
        # first time it is called, which would land on the next call's clock.
        if torch.get_default_dtype() != self.dtype:
            torch.set_default_dtype(self.dtype)
        if torch.is_grad_enabled() != self.grad:
            torch.set_grad_enabled(self.grad)
        if torch.are_deterministic_algorithms_enabled() != self.deterministic:
            torch.use_deterministic_algorithms(self.deterministic)
        if torch.get_num_threads() != self.threads:
            torch.set_num_threads(self.threads)


def flush_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001 - a closed stream must not stop a rank
            pass


# --------------------------------------------------------------------------------------------
# The rank process and its parent
# --------------------------------------------------------------------------------------------


def process_gone(pid: int) -> bool:
    """Whether process ``pid`` no longer runs (absent, or a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            stat = handle.read()
        return stat[stat.rindex(b")") + 2 : stat.rindex(b")") + 3] in (b"Z", b"X")
    except (OSError, ValueError):
        return False


def watch_parent(
    on_gone: Callable[[], None], *, parent: int | None = None, client: int | None = None, name: str
) -> None:
    """Call ``on_gone()`` (from a daemon thread) once this process's parent is no longer
    ``parent`` (default: the parent it has now), or the ``client`` process (the test process that
    owns a pool worker) is gone."""
    parent = os.getppid() if parent is None else parent

    def watch() -> None:
        while True:
            time.sleep(_WATCHDOG_PERIOD_S)
            if os.getppid() != parent or (client is not None and process_gone(client)):
                on_gone()
                return

    threading.Thread(target=watch, name=name, daemon=True).start()
