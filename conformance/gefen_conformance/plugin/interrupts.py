"""Ctrl-C (SIGINT) and SIGTERM always end a suite run (SPEC 4.4.6).

Python turns SIGINT into ``KeyboardInterrupt`` wherever the main thread happens to be. Inside a
suite run two kinds of code would then swallow it:

* ``torch.distributed.checkpoint`` runs every step of a save or load under ``except
  BaseException`` and re-raises what it caught as a ``CheckpointException`` (an ordinary
  ``Exception``), so a test that saves in its own process fails instead of stopping, the run goes
  on, and a property test goes on to shrink that "failure";
* callbacks the interpreter runs on its own (garbage-collector callbacks such as the one
  hypothesis installs, ``__del__``) report an exception raised in them as "ignored" and carry on.

:class:`InterruptGuard` replaces the two handlers while the suite runs. A signal is remembered at
once and the ``KeyboardInterrupt`` raised only where nothing will swallow it: not while DCP is on
the stack (it is raised the moment the outermost DCP frame returns), not while a
``KeyboardInterrupt`` is already being handled, not inside ``__del__`` or a gc callback. In case
it is swallowed anyway, the signal is delivered again every :data:`RETRY_S` seconds until pytest
reports the interrupt. The run's verdict reads :attr:`InterruptGuard.signal_name`, so a run that
was interrupted is never certified as complete. A handler is only replaced where it is Python's
default: a run started with SIGINT ignored keeps it ignored.

:func:`leave_process` is how an interrupted run leaves once it has said why: at once, with
``os._exit``. It lives here, beside the guard, so that the way out imports nothing (an import on a
loaded machine takes seconds).
"""

import gc
import os
import signal
import sys
import threading

RETRY_S = 0.1
_DCP_DIR = os.sep + os.path.join("torch", "distributed", "checkpoint") + os.sep
_SWALLOWING_FUNCTIONS = {"__del__", "gc_callback"}


def _in_dcp(frame) -> bool:
    while frame is not None:
        if _DCP_DIR in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


def _swallowed_here(frame) -> bool:
    """True when an exception raised in ``frame`` would not reach pytest."""
    current = sys.exc_info()[1]
    if isinstance(current, KeyboardInterrupt):
        return True  # one is already on its way out; its cleanup must not be cut short
    while frame is not None:
        code = frame.f_code
        if _DCP_DIR in code.co_filename or code.co_name in _SWALLOWING_FUNCTIONS:
            return True
        frame = frame.f_back
    return False


class InterruptGuard:
    """Installs the handlers (main thread only); :meth:`acknowledge` once pytest saw the interrupt."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self.acknowledged = False
        self._previous: dict[int, object] = {}
        self._retrying: threading.Thread | None = None
        self._done = threading.Event()
        self._pulse = False  # the next delivery is our own re-delivery, not the user's

    @property
    def signal_name(self) -> str | None:
        return signal.Signals(self.signum).name if self.signum is not None else None

    def install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, default in (
            (signal.SIGINT, signal.default_int_handler),
            (signal.SIGTERM, signal.SIG_DFL),
        ):
            if signal.getsignal(signum) is default:
                self._previous[signum] = signal.signal(signum, self._on_signal)

    def uninstall(self) -> None:
        self._done.set()
        retrying = self._retrying
        if retrying is not None and retrying is not threading.current_thread():
            # a re-delivery the thread is about to send would otherwise meet the restored handler
            # (Python's default raises KeyboardInterrupt wherever the main thread then is)
            retrying.join(timeout=RETRY_S * 10)
        if threading.current_thread() is not threading.main_thread():
            return
        for signum, previous in self._previous.items():
            if signal.getsignal(signum) == self._on_signal:
                signal.signal(signum, previous)
        self._previous.clear()

    def acknowledge(self) -> None:
        """pytest has the ``KeyboardInterrupt``: stop re-delivering the signal."""
        self.acknowledged = True
        self._done.set()
        self._stop_watching()

    def _on_signal(self, signum, frame) -> None:
        pulse, self._pulse = self._pulse, False
        if self.signum is None:
            self.signum = signum
            # From now on the run only winds down: no full garbage collection of a heap that holds
            # torch (seconds of CPU, many more on a loaded machine) stands between it and its end.
            gc.freeze()
        if self.acknowledged:
            if pulse:
                return
            raise KeyboardInterrupt  # the user insists while pytest winds down: the default
        if self._retrying is None:
            self._retrying = threading.Thread(target=self._retry, name="gefen-interrupt-retry", daemon=True)
            self._retrying.start()
        if not _swallowed_here(frame):
            self._stop_watching()
            raise KeyboardInterrupt
        if _in_dcp(frame):
            self._watch_for_dcp_return()

    # Held back inside DCP, the interrupt is raised the moment the outermost DCP frame returns (a
    # profile function in the main thread, set only while an interrupt is pending): an exception
    # raised by a profile function on a "return" event leaves that frame with the exception instead
    # of its value, so it surfaces in the caller, past every DCP handler. Retries alone often land in
    # DCP again: most of a checkpoint test's time is spent there.

    def _watch_for_dcp_return(self) -> None:
        if threading.current_thread() is threading.main_thread() and sys.getprofile() is None:
            sys.setprofile(self._on_profile)

    def _stop_watching(self) -> None:
        if threading.current_thread() is threading.main_thread() and sys.getprofile() == self._on_profile:
            sys.setprofile(None)

    def _on_profile(self, frame, event, arg) -> None:
        if event == "return" and _DCP_DIR in frame.f_code.co_filename and not _in_dcp(frame.f_back):
            sys.setprofile(None)
            if not self.acknowledged and not isinstance(sys.exc_info()[1], KeyboardInterrupt):
                raise KeyboardInterrupt

    def _retry(self) -> None:
        main = threading.main_thread().ident
        while not self._done.wait(RETRY_S):
            try:
                self._pulse = True
                signal.pthread_kill(main, self.signum)
            except (OSError, ValueError):
                return


def _pytest_is_the_program() -> bool:
    """True when this process runs pytest and nothing else (``python -m pytest``, the ``pytest``
    script), so an interrupted run may leave with ``os._exit``; False for ``pytest.main()`` called
    by another program, which carries on after it."""
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if spec is not None and spec.name in ("pytest", "pytest.__main__"):
        return True
    program = os.path.basename(sys.argv[0]) if sys.argv else ""
    return program in ("pytest", "py.test") or program.startswith(("pytest-", "py.test-"))


def say_interrupted(when: str) -> None:
    """The one line of a run interrupted before its session started (SPEC 4.4.6)."""
    sys.stderr.write(f"interrupted {when}: no test ran, no certificate written\n")


def leave_process(status: int, *, is_worker: bool) -> None:
    """Leave at once with ``status`` where pytest is the program (or an xdist worker), skipping
    pytest's remaining clean-up and the interpreter's finalization (SPEC 4.4.6); return where
    ``pytest.main()`` was called by another program, which carries on and leaves itself."""
    if _pytest_is_the_program() or is_worker:
        for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(status)
