"""Worker side of :mod:`gefen_conformance.harness.pool` (private; the public contract is documented there).

One worker is one long-lived OS process that runs scenario calls, one at a time, for whichever
rank the parent assigns it. The parent and the worker talk over a ``multiprocessing`` pipe:

* worker -> parent ``("ready", pid, own_group)`` once the worker has finished its one-time
  setup: torch and the ``preload`` modules imported (``own_group``: the worker leads its own
  process group, see ``os.setpgid``);
* parent -> worker ``("run", task)`` with ``task`` a dict (see :func:`_run_call`);
* worker -> parent ``("prepared", call_id)`` once the caller's environment is applied and the
  call's one-time preparation (``task["prepare"]``: the implementation's, run once per worker
  and device, SPEC 4.2.11) is done; or a "raised" ``("result", ...)`` when it failed;
* parent -> worker ``("go", call_id)`` once every rank of the call is prepared (the call's
  deadline starts then), or ``("cancel", call_id)`` when another rank failed to prepare;
* worker -> parent ``("result", call_id, report)`` with ``report`` a dict of plain, picklable
  values: ``status`` ("ok" or "raised"), ``value`` (pickled bytes, for "ok"), or ``exc_type``,
  ``message``, ``traceback`` (text) and ``exc_bytes`` (the pickled exception, or None); the
  worker binds a :class:`gefen_conformance.harness.world.World` (the default group, its rank's device of
  ``task["device"]``) around ``fn``;
* parent -> worker ``("exit",)``: leave the loop and exit 0.

After a "raised" report the worker exits at once (exit code :data:`EXIT_AFTER_FAILURE`) without
destroying its process group: closing its gloo sockets is what makes peers that are blocked in a
collective with it fail promptly, and the parent discards it anyway.

This module must stay cheap to import and must not import torch at module level: torch is
imported in :func:`worker_main` after the thread environment variables are set.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import signal
import sys
import threading
import time

from gefen_conformance.harness.exception_text import format_exception, qualified_name, safe_str
from gefen_conformance.harness.world import World, scope

#: exit code of a worker that reported a "raised" outcome and then left on purpose
EXIT_AFTER_FAILURE = 10
#: exit code of a worker that noticed its parent (the test process) is gone
EXIT_PARENT_GONE = 70
#: thread-pool variables set to 1 in every worker and in the fork server it is forked from
SINGLE_THREAD_ENV = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")

_PR_SET_PDEATHSIG = 1
_INIT_COUNTER_KEY = "gefen_conformance.harness.pool/initialised"
_INIT_DONE_KEY = "gefen_conformance.harness.pool/all-initialised"
_WATCHDOG_PERIOD_S = 0.5
# Process groups the previous call destroyed, freed at the start of the next call. torch 2.5 frees a
# gloo group by joining its worker threads while holding the GIL, and a worker thread still releasing
# a finished collective's tensors needs the GIL: rank 0 then hangs in destroy_process_group. Between
# calls the worker waits on its pipe without the GIL, so by the next call those threads are idle.
_RETIRED_GROUPS: list = []


def _set_parent_death_signal() -> None:
    """Ask Linux to SIGKILL this process when the thread that forked it exits (best effort)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    except Exception:  # pragma: no cover - the watchdog thread still covers this case
        pass


def _process_gone(pid: int) -> bool:
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


def _watch_parent(direct_parent: int, client_pid: int) -> None:
    """Exit when the process that forked us, or the test process that owns us, is gone."""
    while True:
        time.sleep(_WATCHDOG_PERIOD_S)
        if os.getppid() != direct_parent or _process_gone(client_pid):
            os._exit(EXIT_PARENT_GONE)


def _exception_report(exc: BaseException, *, message_prefix: str = "") -> dict:
    try:
        exc_bytes = pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException:  # noqa: BLE001 - unpicklable exceptions still travel as text
        exc_bytes = None
    return {
        "status": "raised",
        "exc_type": qualified_name(type(exc)),
        "message": message_prefix + safe_str(exc),
        "traceback": format_exception(exc),
        "exc_bytes": exc_bytes,
    }


class _Baseline:
    """Torch global state put back after every call, so a warm worker looks like a fresh one.

    (Environment, ``sys.path``, working directory and random seeds are set at the start of
    every call instead, see :func:`_run_call`.)
    """

    def __init__(self, torch) -> None:
        self.default_dtype = torch.get_default_dtype()

    def restore(self, torch) -> None:
        # Only touch what changed: use_deterministic_algorithms() costs ~1 s of imports the
        # first time it is called, which would land on the next call's clock.
        if torch.get_default_dtype() != self.default_dtype:
            torch.set_default_dtype(self.default_dtype)
        if not torch.is_grad_enabled():
            torch.set_grad_enabled(True)
        if torch.are_deterministic_algorithms_enabled():
            torch.use_deterministic_algorithms(False)
        if torch.get_num_threads() != 1:
            torch.set_num_threads(1)


def _reseed(torch) -> None:
    """Fresh, independent random state, as a newly started process would have.

    Without this, workers forked from the same fork server would share one torch (and numpy)
    generator state, and a warm worker's draws would depend on the calls it ran before.
    Deterministic scenarios must seed explicitly, exactly as with fresh processes.
    """
    import random

    random.seed()
    torch.manual_seed(int.from_bytes(os.urandom(8), "little") >> 1)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        try:
            numpy.random.seed(int.from_bytes(os.urandom(4), "little"))
        except Exception:
            pass


def _rank_device(name: str, rank: int, torch):
    """Rank ``rank``'s device for a call on ``name`` (``conformance.devices.for_rank``, imported
    here because this module must not import torch at import time): ``cpu`` for every rank; on an accelerator
    ``type:index+rank``, made this process's current device so that a backend's implicit device
    (NCCL's) is the rank's own."""
    from gefen_conformance.harness.devices import for_rank

    device = for_rank(torch.device(name), rank)
    if device.type != "cpu":
        module = getattr(torch, device.type, None)
        setter = getattr(module, "set_device", None)
        if setter is not None:
            setter(device)
    return device


#: (preparation key, device) pairs this worker has prepared (SPEC 4.2.11)
_PREPARED: set = set()


def _apply_caller(task: dict, torch) -> None:
    """The caller's environment as of this call (as a freshly spawned rank would inherit it),
    with the thread limits and rendezvous variables on top; its ``sys.path`` and directory."""
    rank = task["rank"]
    world_size = task["world_size"]
    os.environ.clear()
    os.environ.update(task["environ"])
    for name in SINGLE_THREAD_ENV:
        os.environ[name] = "1"
    os.environ.update(
        {
            "MASTER_ADDR": task["master_addr"],
            "MASTER_PORT": str(task["master_port"]),
            "RANK": str(rank),
            "WORLD_SIZE": str(world_size),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(world_size),
        }
    )
    os.environ.pop("TORCH_GLOO_LAZY_INIT", None)
    if os.path.isdir("/sys/class/net/lo"):
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    sys.path[:] = task["sys_path"]
    try:
        os.chdir(task["cwd"])
    except OSError:
        pass
    torch.set_num_threads(1)


def _prepare(task: dict, torch) -> dict | None:
    """The call's one-time preparation on this worker (once per preparation and device), before the
    call's deadline starts; a "raised" report when it fails, else None."""
    _apply_caller(task, torch)
    payload = task.get("prepare")
    if payload is None:
        return None
    device = "?"
    try:
        device = _rank_device(task["device"], task["rank"], torch)
        key, fn, args = pickle.loads(payload)
        if (key, str(device)) in _PREPARED:
            return None
        fn(*args, device=device)
        _PREPARED.add((key, str(device)))
    except BaseException as exc:  # noqa: BLE001 - reported, never escapes
        return _exception_report(exc, message_prefix=f"[while preparing this rank on {device}] ")
    return None


def _run_call(task: dict, torch, dist) -> dict:
    """Run one scenario call (the caller's environment already applied); returns the report
    dict. Never raises."""
    import datetime

    _RETIRED_GROUPS.clear()
    rank = task["rank"]
    world_size = task["world_size"]
    _reseed(torch)

    stage = "unpickling fn/args/kwargs"
    try:
        fn, args, kwargs = pickle.loads(task["payload"])
        device = _rank_device(task["device"], rank, torch)
        from gefen_conformance.harness.devices import backend_for  # torch is imported by now

        backend = backend_for(device)
        stage = f"initialising the {backend} process group on {device}"
        pg_timeout = datetime.timedelta(seconds=task["pg_timeout"])
        # A FileStore, new for every call, rather than a TCPStore hosted by the caller: the
        # TCPStore client's connect stalled for exactly 5 s in about one call in six with four
        # ranks on a 2-core machine; the FileStore rendezvous has not shown that.
        store = dist.FileStore(task["store_path"], world_size)
        store.set_timeout(pg_timeout)
        dist.init_process_group(
            backend, store=store, rank=rank, world_size=world_size, timeout=pg_timeout
        )
        # gloo's connectFullMesh can return on one rank before a peer has finished its side; a
        # rank whose fn is quick would then tear its sockets down under that peer. So nobody
        # starts fn before every rank has its group (a store barrier: no gloo traffic).
        if store.add(_INIT_COUNTER_KEY, 1) == world_size:
            store.set(_INIT_DONE_KEY, b"1")
        store.wait([_INIT_DONE_KEY])
        del store
        if "torch.distributed.tensor" in sys.modules:
            # DTensor sharding caches are keyed on meshes without their rank; a worker that
            # served as another rank before would otherwise reuse that rank's placements.
            from gefen_conformance.harness.sharding import forget_dtensor_caches

            forget_dtensor_caches()
        # The pool's World: the whole (fresh) default group; a rank dies by leaving the process.
        world = World(
            rank=rank,
            size=world_size,
            group=dist.group.WORLD,
            device=device,
            die_hook=os._exit,
        )
        stage = "running fn"
        with scope(world):
            value = fn(*args, **kwargs)
        stage = "destroying the process group"
        if dist.is_initialized():
            c10d_world = getattr(dist.distributed_c10d, "_world", None)
            _RETIRED_GROUPS.extend(getattr(c10d_world, "pg_map", {}) or [dist.group.WORLD])
            dist.destroy_process_group()
    except BaseException as exc:  # noqa: BLE001 - every failure is reported, none escapes
        prefix = "" if stage == "running fn" else f"[while {stage}] "
        return _exception_report(exc, message_prefix=prefix)
    try:
        value_bytes = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except BaseException as exc:  # noqa: BLE001
        return _exception_report(
            exc, message_prefix=f"the return value ({type(value).__name__}) is not picklable: "
        )
    return {"status": "ok", "value": value_bytes}


def worker_main(conn, client_pid: int, dump_path: str, output_path: str, preload=()) -> None:
    """Entry point of a pool worker process (the ``target`` of its ``Process``). ``preload``: modules
    imported before the worker reports ready (no-ops for those its fork server imported already)."""
    for name in SINGLE_THREAD_ENV:
        os.environ[name] = "1"
    # Ctrl-C is the parent's business: it kills us after cleaning up, we must not race it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # Own process group, so the parent can kill whatever the scenario itself started with us.
    try:
        os.setpgid(0, 0)
        own_group = True
    except OSError:
        own_group = False
    direct_parent = os.getppid()
    _set_parent_death_signal()
    if _process_gone(direct_parent) or _process_gone(client_pid):
        os._exit(EXIT_PARENT_GONE)
    threading.Thread(
        target=_watch_parent,
        args=(direct_parent, client_pid),
        name="ranks-parent-watchdog",
        daemon=True,
    ).start()

    # Fatal signals (SIGSEGV, SIGABRT, ...) and SIGUSR1 (sent by the parent before it kills a hung
    # worker) both dump every thread's Python stack into dump_path, which the parent reads back.
    dump_file = open(dump_path, "a", buffering=1)
    faulthandler.enable(file=dump_file, all_threads=True)
    faulthandler.register(signal.SIGUSR1, file=dump_file, all_threads=True, chain=False)

    # Everything the scenario prints, at the Python or the C level, lands in output_path.
    output_fd = os.open(output_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    for stream, fd in ((sys.stdout, 1), (sys.stderr, 2)):
        try:
            if stream is not None:
                stream.flush()
        except Exception:
            pass
        os.dup2(output_fd, fd)
    os.close(output_fd)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.reconfigure(line_buffering=True)
        except Exception:
            pass

    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    _import_quietly(preload)
    baseline = _Baseline(torch)
    conn.send(("ready", os.getpid(), own_group))

    while True:
        message = _receive(conn)
        if message[0] == "exit":
            break
        if message[0] != "run":
            continue
        task = message[1]
        report = _prepare(task, torch)
        if report is None:
            _send(conn, ("prepared", task["call_id"]))
            while True:
                message = _receive(conn)
                if message[0] in ("go", "cancel") and message[1] == task["call_id"]:
                    break
                if message[0] == "exit":
                    os._exit(0)
            if message[0] == "cancel":
                baseline.restore(torch)
                continue
            report = _run_call(task, torch, dist)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        try:
            conn.send(("result", task["call_id"], report))
        except BaseException:  # noqa: BLE001 - the parent is gone or the pipe is broken
            os._exit(EXIT_PARENT_GONE)
        if report["status"] != "ok":
            os._exit(EXIT_AFTER_FAILURE)
        baseline.restore(torch)
    conn.close()
    dump_file.close()


def _receive(conn) -> tuple:
    try:
        return conn.recv()
    except (EOFError, OSError):
        os._exit(EXIT_PARENT_GONE)


def _send(conn, message: tuple) -> None:
    try:
        conn.send(message)
    except BaseException:  # noqa: BLE001 - the parent is gone or the pipe is broken
        os._exit(EXIT_PARENT_GONE)


def _import_quietly(modules) -> None:
    """Import ``modules`` (a failure here is not this worker's to report: a call that needs the
    module raises it with its traceback)."""
    import importlib

    for name in modules:
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001
            pass
