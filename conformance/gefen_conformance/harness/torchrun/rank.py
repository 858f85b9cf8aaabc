"""One torchrun rank's part in one scenario call (SPEC 4.7.3-4.7.4; used by
:mod:`gefen_conformance.harness.torchrun.serve`).

A scenario call of ``k`` ranks runs on global ranks ``0..k-1`` of the torchrun job (rank 0's part
in the rank-0 server, a child of the process that runs pytest). Each of them runs ``fn`` in a
thread of its own (a :class:`Participation`), so that the serving process's main thread stays
free to watch it: to report it when it ends, or to dump every thread's stack when the coordinator
says the call is overdue.

For the call the participants form a *fresh default process group* of ``k`` ranks, rendezvousing
on the job's TCPStore under a prefix of their own, and destroy it afterwards. A default group
rather than a ``new_group`` of the job's world because DCP adapters (the reference's and gefen-x
0.5.0's) run their agreement collectives on the default group whatever ``process_group`` DCP was
given; it also means a call needs nothing from the ranks that do not take part, and a rank never
joins a collective over the whole job.

The body runs as every launcher runs it (:func:`gefen_conformance.harness.rank_side.run_body`),
and its outcome is the same plain report dict:

* ``"ok"``: ``fn`` returned, the group was destroyed, the value pickled (``value``: the bytes);
* ``"raised"``: an exception escaped ``fn``, the group set-up or teardown; the group's
  connections are cut at once (:meth:`Participation._cut_group`), so peers blocked in a
  collective with this rank fail within milliseconds, as a pool rank's exit makes them fail;
* ``"died"``: ``fn`` called ``World.die(code)``. The process lives on (it is a torchrun worker and
  serves later calls); the die hook cuts the group's connections exactly as a crash closes its
  sockets, then unwinds ``fn`` with :class:`RankDied`. Whatever ``fn`` does after that, the
  outcome stays "died" with ``exitcode`` ``code``;
* ``"hung"``: ``fn`` was still running when the coordinator gave up on the call; every thread's
  stack is dumped with ``faulthandler`` into ``traceback``. The thread cannot be stopped, so the
  rank never takes part in a call again and the job ends
  (:mod:`gefen_conformance.harness.torchrun.launcher`).
"""

from __future__ import annotations

import datetime
import faulthandler
import os
import socket
import tempfile
import threading
import traceback as traceback_module

from gefen_conformance.harness import rank_side

__all__ = ["Participation", "RankDied", "hung_report"]


class RankDied(BaseException):
    """Unwinds a rank body after ``World.die(exitcode)`` under torchrun (a BaseException, so that
    ``except Exception`` in a body does not turn a death into a result)."""

    def __init__(self, exitcode: int) -> None:
        super().__init__(exitcode)
        self.exitcode = exitcode


def stacks_of_every_thread() -> str:
    """Every thread's Python stack, as ``faulthandler`` writes it (works while threads hold locks)."""
    with tempfile.TemporaryFile(mode="w+") as handle:
        faulthandler.dump_traceback(file=handle, all_threads=True)
        handle.flush()
        handle.seek(0)
        return handle.read()


def hung_report(rank: int, why: str) -> dict:
    """The "hung" outcome of this rank, with the stacks of all its threads."""
    message = f"{why}; stacks dumped, the torchrun job ends after this call"
    return {
        "status": "hung",
        "message": message,
        "traceback": f"rank {rank} (pid {os.getpid()}) {message}\n{stacks_of_every_thread()}",
    }


def _socket_fds() -> set[int]:
    """The file descriptors of this process that are sockets (Linux ``/proc``; empty elsewhere)."""
    found = set()
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return found
    for name in names:
        try:
            if os.readlink(f"/proc/self/fd/{name}").startswith("socket:"):
                found.add(int(name))
        except (OSError, ValueError):
            pass
    return found


def _shut_down_connections(fds: set[int]) -> None:
    """``shutdown()`` every connected socket among ``fds``, leaving listeners alone (gloo's
    listener thread aborts the process when its socket is shut down under it)."""
    for fd in fds:
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            probe = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if not probe.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                probe.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # not connected (any more): nothing to cut
        finally:
            probe.close()


class Participation:
    """Rank ``rank``'s part in the call described by ``task`` (see
    :mod:`gefen_conformance.harness.torchrun.serve`).

    ``pg_store`` is the store the call's process group rendezvouses on (a TCPStore client of this
    rank, not shared with the thread that watches the call). The rank takes the test process's
    ``sys.path`` and working directory from the task, and fresh random state, for every call.
    """

    def __init__(self, task: dict, rank: int, device, pg_store) -> None:
        self.task = task
        self.rank = rank
        self.device = device
        self.pg_store = pg_store
        self.died: dict | None = None
        self._report: dict | None = None
        self._owns_group = False
        self._group_sockets: set[int] = set()
        self.thread = threading.Thread(
            target=self._main, name=f"gefen-torchrun-call-{task['call_id']}", daemon=True
        )

    def start(self) -> Participation:
        self.thread.start()
        return self

    def finished(self) -> bool:
        return not self.thread.is_alive()

    def report(self) -> dict:
        """The outcome (only once :meth:`finished`)."""
        if self.thread.is_alive():
            raise RuntimeError("the call is still running on this rank")
        return (
            self.died
            or self._report
            or {
                "status": "raised",
                "exc_type": "RuntimeError",
                "message": "the rank's call thread ended without a report",
                "traceback": "",
                "exc_bytes": None,
            }
        )

    # -- the call thread ------------------------------------------------------------------

    def _main(self) -> None:
        import torch.distributed as dist

        task = self.task
        defaults = rank_side.TorchDefaults()
        try:
            rank_side.take_paths(
                task["sys_path"], task["cwd"]
            )  # another node: the checkout may live elsewhere
            rank_side.reseed()
            self._report = rank_side.run_body(
                task["payload"],
                rank=self.rank,
                world_size=task["world_size"],
                device=self.device,
                backend=task["backend"],
                form_group=lambda: self._init_group(dist),
                release_group=lambda: self._release_group(dist),
                on_failure=lambda: self._release_group(dist, cut=True),
                die_hook=self._die,
            )
        except BaseException as exc:  # noqa: BLE001 - every failure is reported, none escapes
            self._report = rank_side.exception_report(exc, "[while taking the caller's paths] ")
        finally:
            defaults.restore()
            rank_side.flush_streams()

    def _init_group(self, dist) -> None:
        task = self.task
        if dist.is_initialized():
            raise RuntimeError(
                f"rank {self.rank} already has a default process group (left by an earlier call that "
                "hung?); a scenario call under torchrun forms its own default group"
            )
        rank_side.make_current(self.device)
        timeout = datetime.timedelta(seconds=task["pg_timeout"])
        store = dist.PrefixStore(f"call/{task['call_id']}/pg/", self.pg_store)
        store.set_timeout(timeout)
        before = _socket_fds()
        dist.init_process_group(
            task["backend"], store=store, rank=self.rank, world_size=task["world_size"], timeout=timeout
        )
        self._owns_group = True
        # gloo connects its full mesh during init: these are the group's connections (and listener)
        self._group_sockets = _socket_fds() - before
        rank_side.wait_for_every_group(store, task["world_size"])

    def _release_group(self, dist, *, cut: bool = False) -> None:
        """Destroy the call's group if this rank still holds it; with ``cut``, first cut its
        connections (see :meth:`_cut_group`)."""
        if not self._owns_group:
            return
        self._owns_group = False
        if cut:
            self._cut_group()
        try:
            if dist.is_initialized():
                if self.task["backend"] == "nccl":
                    # NCCL: abort, so that pending work on a dead peer cannot block the teardown
                    dist.distributed_c10d._abort_process_group()
                else:
                    dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - the report says what went wrong in fn, not here
            pass

    def _cut_group(self) -> None:
        """End this rank's connections to its peers now, as the exit of a pool rank does.

        Destroying a gloo group does not close its sockets while anything still references it
        (DCP's wrapper, a mesh, a DTensor, a traceback's frames), and gloo has no abort: peers
        blocked in a collective with this rank would wait for the group timeout. Shutting the
        group's connected sockets down makes them fail at once, and leaves this process's later
        groups unaffected (measured with torch 2.13, SPEC 4.7.4). NCCL groups are aborted in
        :meth:`_release_group` instead (unverified: no GPU was available)."""
        if self.task["backend"] == "gloo":
            _shut_down_connections(self._group_sockets)
        self._group_sockets = set()

    def _die(self, exitcode: int):
        """``World.die`` under torchrun: the rank abandons its group (as a crash would) and the call."""
        import torch.distributed as dist

        where = "".join(traceback_module.format_stack()[:-2])
        message = (
            f"rank {self.rank} (pid {os.getpid()}) ended its part of the call with World.die({exitcode}); "
            "under torchrun the process lives on; its connections to the group were cut as a crash "
            "would cut them"
        )
        self.died = {
            "status": "died",
            "exitcode": exitcode,
            "message": message,
            "traceback": f"{message}\nWorld.die was called at:\n{where}",
        }
        self._release_group(dist, cut=True)
        raise RankDied(exitcode)
