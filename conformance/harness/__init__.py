"""The multi-rank harness: where scenarios run (SPEC 4.2, 4.6, 4.7).

A scenario's rank body is written once against ``world`` (its rank, group, device and mesh) and
``sharding``; ``launch`` runs it as a ``call`` (the arguments and bounds, checked once) on the
active launcher, and every launcher reports ``outcomes`` the same way. The two launchers stand
side by side over one rank side, ``rank_side`` (what a rank does with a call): the warm pool of
local processes (``pool``, with ``pool_processes``, ``pool_supervision``, ``pool_worker`` on the
rank side and ``pool_preload`` warming the fork server) and a torchrun job (``torchrun``, the
entry point of every rank, with ``torchrun_job``, ``torchrun_launcher`` in rank 0,
``torchrun_serve`` and ``torchrun_rank`` on the serving ranks). ``deadlines`` bounds every wait on
a clock the machine's load slows; ``devices`` picks each rank's device; ``exception_text`` carries
tracebacks across processes.
"""
