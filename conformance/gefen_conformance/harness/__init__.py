"""The multi-rank harness: where scenarios run (SPEC 4.2, 4.6, 4.7).

A scenario's rank body is written once against ``world`` (its rank, group, device and mesh) and
``sharding``; ``launch`` runs it as a ``call`` (the arguments and bounds, checked once) on the
active launcher, and every launcher reports ``outcomes`` the same way. The two launchers stand
side by side over one rank side, ``rank_side`` (what a rank does with a call): the warm pool of
local processes (the ``pool`` package: ``caller`` runs each call, ``processes`` starts and keeps
the workers, ``supervision`` waits for and reaps them, ``worker`` is the rank side) and a
torchrun job (the ``torchrun`` package: ``entry`` is every rank's entry point, ``job`` the job's
store, ``launcher`` rank 0's launcher, ``serve`` and ``rank`` the serving ranks). Beside them,
``threads`` runs a call's ranks as threads of one pool worker on torch's threaded process group,
for worlds of up to 256 ranks on one machine. ``deadlines``
bounds every wait on a clock the machine's load slows; ``devices`` picks each rank's device;
``exception_text`` carries tracebacks across processes.

The harness stands alone: it imports nothing of the plugin or the suite. What rank processes
import and prepare before their first call is passed in by whoever runs them (the pool's
``prepare_workers``, torchrun's ``--prepare``); it resolves implementations only through
``gefen_conformance.implementations``.
"""
