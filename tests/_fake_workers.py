"""Stand-ins for ``gefen_conformance.harness.pool.worker.worker_main`` that fail during start-up.

A module of its own, importing nothing heavy, so that a forked worker reaches its failure within
milliseconds (tests/test_launch.py installs them as the pool's worker entry point).
"""

from __future__ import annotations

import faulthandler
import os
import signal
import time


def dies_before_ready(conn, client_pid, dump_path, output_path, preload=()):
    os._exit(5)


def never_ready(conn, client_pid, dump_path, output_path, preload=()):
    dump = open(dump_path, "a", buffering=1)
    faulthandler.register(signal.SIGUSR1, file=dump, all_threads=True, chain=False)
    time.sleep(600)
