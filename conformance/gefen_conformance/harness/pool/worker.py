"""The rank side of the pool: one worker process serving calls (SPEC 4.2.1-4.2.3, 4.2.11; the
caller's side is :mod:`gefen_conformance.harness.pool.caller`).

One worker is one long-lived OS process that runs scenario calls, one at a time, for whichever
rank the parent assigns it. The parent and the worker talk over a ``multiprocessing`` pipe:

* worker -> parent ``("ready", pid, own_group)`` once the worker has finished its one-time
  setup: torch and the ``preload`` modules imported (``own_group``: the worker leads its own
  process group, see ``os.setpgid``);
* parent -> worker ``("run", task)`` with ``task`` a dict of plain values (made by the caller);
* worker -> parent ``("prepared", call_id)`` once the caller's environment is applied and the
  call's one-time preparation (``task["prepare"]``: the implementation's, run once per worker
  and device, SPEC 4.2.11) is done; or a "raised" ``("result", ...)`` when it failed;
* parent -> worker ``("go", call_id)`` once every rank of the call is prepared (the call's
  deadline starts then), or ``("cancel", call_id)`` when another rank failed to prepare;
* worker -> parent ``("result", call_id, report)``: the call run in a fresh default group by
  :func:`gefen_conformance.harness.rank_side.run_body`, whose plain report dict ("ok" or
  "raised") this is;
* parent -> worker ``("exit",)``: leave the loop and exit 0.

After a "raised" report the worker exits at once (exit code :data:`EXIT_AFTER_FAILURE`) without
destroying its process group: closing its gloo sockets is what makes peers that are blocked in a
collective with it fail promptly, and the parent discards it anyway.

Before every call the worker takes the caller's environment, ``sys.path`` and directory, and fresh
random state; after it, torch's defaults as they were at start-up. This module must stay cheap to
import and must not import torch at module level: torch is imported in :func:`worker_main` after
the thread environment variables are set.
"""

from __future__ import annotations

import faulthandler
import os
import pickle
import signal
import sys

from gefen_conformance.harness import rank_side
from gefen_conformance.harness.rank_side import EXIT_PARENT_GONE, SINGLE_THREAD_ENV, exception_report

#: exit code of a worker that reported a "raised" outcome and then left on purpose
EXIT_AFTER_FAILURE = 10

_PR_SET_PDEATHSIG = 1
# Process groups the previous call destroyed, freed at the start of the next call. torch 2.5 frees a
# gloo group by joining its worker threads while holding the GIL, and a worker thread still releasing
# a finished collective's tensors needs the GIL: rank 0 then hangs in destroy_process_group. Between
# calls the worker waits on its pipe without the GIL, so by the next call those threads are idle.
_RETIRED_GROUPS: list = []
#: (preparation key, device) pairs this worker has prepared (SPEC 4.2.11)
_PREPARED: set = set()


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


def _rank_device(task: dict):
    """The rank's device for the call (``devices.for_rank``: ``cpu``, or ``type:index+rank`` on an
    accelerator), made this process's current one."""
    import torch

    from gefen_conformance.harness.devices import for_rank

    device = for_rank(torch.device(task["device"]), task["rank"])
    rank_side.make_current(device)
    return device


def _apply_caller(task: dict) -> None:
    """The caller's environment as of this call (as a freshly spawned rank would inherit it),
    with the thread limits and rendezvous variables on top; its ``sys.path`` and directory."""
    import torch

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
    rank_side.take_paths(task["sys_path"], task["cwd"])
    torch.set_num_threads(1)


def _prepare(task: dict) -> dict | None:
    """The call's one-time preparation on this worker (once per preparation and device), before the
    call's deadline starts; a "raised" report when it fails, else None."""
    _apply_caller(task)
    payload = task.get("prepare")
    if payload is None:
        return None
    device = "?"
    try:
        device = _rank_device(task)
        key, fn, args = pickle.loads(payload)
        if (key, str(device)) in _PREPARED:
            return None
        fn(*args, device=device)
        _PREPARED.add((key, str(device)))
    except BaseException as exc:  # noqa: BLE001 - reported, never escapes
        return exception_report(exc, f"[while preparing this rank on {device}] ")
    return None


def _run_call(task: dict) -> dict:
    """Run one scenario call (the caller's environment already applied) in the call's fresh
    default group; returns the report dict. Never raises."""
    import datetime

    import torch.distributed as dist

    from gefen_conformance.harness.devices import backend_for

    _RETIRED_GROUPS.clear()
    rank, world_size = task["rank"], task["world_size"]
    rank_side.reseed()
    try:
        device = _rank_device(task)
    except BaseException as exc:  # noqa: BLE001
        return exception_report(exc, "[while choosing the rank's device] ")
    backend = backend_for(device)

    def form_group() -> None:
        pg_timeout = datetime.timedelta(seconds=task["pg_timeout"])
        # A FileStore, new for every call, rather than a TCPStore hosted by the caller: the
        # TCPStore client's connect stalled for exactly 5 s in about one call in six with four
        # ranks on a 2-core machine; the FileStore rendezvous has not shown that.
        store = dist.FileStore(task["store_path"], world_size)
        store.set_timeout(pg_timeout)
        dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=pg_timeout)
        rank_side.wait_for_every_group(store, world_size)

    def release_group() -> None:
        if dist.is_initialized():
            c10d_world = getattr(dist.distributed_c10d, "_world", None)
            _RETIRED_GROUPS.extend(getattr(c10d_world, "pg_map", {}) or [dist.group.WORLD])
            dist.destroy_process_group()

    # After a failure the worker exits without a teardown (see the module docstring); a rank dies
    # by leaving the process.
    return rank_side.run_body(
        task["payload"],
        rank=rank,
        world_size=world_size,
        device=device,
        backend=backend,
        form_group=form_group,
        release_group=release_group,
        on_failure=lambda: None,
        die_hook=os._exit,
    )


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
    if rank_side.process_gone(direct_parent) or rank_side.process_gone(client_pid):
        os._exit(EXIT_PARENT_GONE)
    rank_side.watch_parent(
        lambda: os._exit(EXIT_PARENT_GONE),
        parent=direct_parent,
        client=client_pid,
        name="ranks-parent-watchdog",
    )

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

    torch.set_num_threads(1)
    try:
        torch.set_num_interop_threads(1)
    except RuntimeError:
        pass
    _import_quietly(preload)
    defaults = rank_side.TorchDefaults()  # a warm worker looks like a fresh one after every call
    conn.send(("ready", os.getpid(), own_group))

    while True:
        message = _receive(conn)
        if message[0] == "exit":
            break
        if message[0] != "run":
            continue
        task = message[1]
        report = _prepare(task)
        if report is None:
            _send(conn, ("prepared", task["call_id"]))
            while True:
                message = _receive(conn)
                if message[0] in ("go", "cancel") and message[1] == task["call_id"]:
                    break
                if message[0] == "exit":
                    os._exit(0)
            if message[0] == "cancel":
                defaults.restore()
                continue
            report = _run_call(task)
        rank_side.flush_streams()
        try:
            conn.send(("result", task["call_id"], report))
        except BaseException:  # noqa: BLE001 - the parent is gone or the pipe is broken
            os._exit(EXIT_PARENT_GONE)
        if report["status"] != "ok":
            os._exit(EXIT_AFTER_FAILURE)
        defaults.restore()
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
