"""The torchrun job as each rank sees it, and the store its ranks talk on (SPEC 4.7.3).

:class:`Job` reads the rank's place in the job from the environment torchrun sets and opens
clients of the job's TCPStore under the prefix ``gefen-conformance/``. The keys on it, written by
the launcher (rank 0) and the serving ranks:

* start-up: ``hello/<rank>``, ``run-dir``, ``markers``, ``markers-done``, ``seen/<rank>``,
  ``prepared/<rank>``, ``server-ready/0``;
* a call ``n``: ``cmd/<n>`` (``("run", task)`` or ``("exit", None)``), ``call/<n>/outcome/<rank>``
  (the rank's report), ``call/<n>/abort`` (why rank 0 gave up on it, or ``interrupted``), and
  the call's process-group rendezvous under ``call/<n>/pg/``.

Every wait on the store is bounded (:func:`wait`, on the load clock of SPEC 4.2.10).
"""

from __future__ import annotations

import datetime
import os
import pickle
import time

from gefen_conformance.harness.deadlines import Deadline
from gefen_conformance.harness.rank_side import flush_streams

__all__ = ["Job", "command_key", "dumps", "leave", "startup_timeout_s", "wait"]

_PREFIX = "gefen-conformance/"


def startup_timeout_s() -> float:
    """The bound on connecting, saying hello, checking the run directory and preparing, in quiet
    seconds (``GEFEN_TORCHRUN_STARTUP_TIMEOUT``, default 300)."""
    return float(os.environ.get("GEFEN_TORCHRUN_STARTUP_TIMEOUT", "300"))


class Job:
    """This rank's view of the torchrun job, from the environment torchrun sets."""

    def __init__(self, environ=os.environ) -> None:
        missing = [
            n for n in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") if n not in environ
        ]
        if missing:
            raise RuntimeError(
                f"gefen_conformance.harness.torchrun must be started by torchrun: {', '.join(missing)} "
                "not set"
            )
        self.rank = int(environ["RANK"])
        self.world_size = int(environ["WORLD_SIZE"])
        self.local_rank = int(environ["LOCAL_RANK"])
        self.local_world_size = int(environ.get("LOCAL_WORLD_SIZE", self.world_size))
        self.node_rank = int(environ.get("GROUP_RANK", "0"))
        self.master_addr = environ["MASTER_ADDR"]
        self.master_port = int(environ["MASTER_PORT"])
        # torchrun's agent hosts the store; anything else that sets MASTER_* leaves it to rank 0
        self.agent_store = environ.get("TORCHELASTIC_USE_AGENT_STORE", "").lower() == "true"

    def store_client(self, timeout: float, *, may_host: bool = False):
        """A client of the job's store; with ``may_host`` (rank 0's first client only), the store
        itself when torchrun's agent does not host it."""
        import torch.distributed as dist

        host_it = may_host and self.rank == 0 and not self.agent_store
        store = dist.TCPStore(
            self.master_addr,
            self.master_port,
            self.world_size,
            host_it,
            timeout=datetime.timedelta(seconds=timeout),
            wait_for_workers=False,
        )
        return dist.PrefixStore(_PREFIX, store)


def command_key(call_id: int) -> str:
    return f"cmd/{call_id}"


def dumps(value) -> bytes:
    return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)


def wait(store, keys: list[str], seconds: float, poll: float = 0.1) -> bool:
    """Wait until every key exists or ``seconds`` quiet seconds pass (a load-clock
    :class:`~gefen_conformance.harness.deadlines.Deadline`, SPEC 4.2.10); True if they all exist.

    Polls with ``check`` rather than blocking in ``store.wait``: a Python signal handler (Ctrl-C,
    SIGTERM) runs within ``poll`` seconds, and an expired wait does not log a C++ warning."""
    deadline = Deadline(seconds)
    while not store.check(keys):
        if deadline.expired():
            return False
        time.sleep(poll)
    return True


def leave(code: int) -> None:
    """End this rank process now (a thread stuck in a call cannot hold it)."""
    flush_streams()
    os._exit(code)
