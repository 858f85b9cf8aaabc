"""The multi-rank harness: where scenarios run (SPEC 4.2, 4.7).

A scenario's rank body is written once against ``world`` (its rank, group, device and mesh) and
``sharding``; ``launch`` runs it under the active launcher: the warm pool of spawned gloo ranks
(``pool``, with ``pool_worker`` on the rank side and ``pool_preload`` warming the fork server) or a
``torchrun`` job (``torchrun``, with ``torchrun_rank`` on the rank side). ``deadlines`` bounds every
call on a clock the machine's load slows; ``devices`` picks each rank's device;
``exception_text`` carries rank tracebacks into reports.
"""
