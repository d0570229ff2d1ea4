"""Ctrl-C and SIGTERM stop a run at a safe point, never half-way through a change of the driver's state.

Why it exists: Python runs a signal handler between any two bytecodes of the
main thread, so a ``KeyboardInterrupt`` raised from it can land anywhere: half
way through an optimizer step (some parameters and moments updated, others
not), between a replay buffer's storage write and its sampler's priorities,
inside ``multiprocessing.Queue.put`` while it holds the queue's lock (then the
shutdown's own ``put`` / ``close`` on that queue waits for the lock forever:
the driver hangs with its final checkpoint unwritten). The final checkpoint
would save the torn state, or never be written.

:class:`StopSignals` replaces the handlers of SIGINT and SIGTERM while a run
runs. A signal is *recorded*, and the run raises it (``KeyboardInterrupt`` or
:class:`Terminated`) at its next safe point (:meth:`StopSignals.check`, which
the trainers call between updates and between batches), or at once when the
driver is only waiting (inside :meth:`StopSignals.interruptible`: for a
collected batch, for the workers' acknowledgment of a weight publish, for an
in-process evaluation): those waits hold no half-changed state, so a stop
never waits for a slow batch. A second signal stops at once wherever the
driver is (the user insisted).
"""
from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import Iterator

__all__ = ["StopSignals", "Terminated", "children_deaf_to_ctrl_c"]


class Terminated(BaseException):
    """SIGTERM (a scheduler, ``kill``, ``timeout``) arrived: stop like Ctrl-C does."""


_NAMES = {signal.SIGINT: "Ctrl-C", signal.SIGTERM: "SIGTERM"}


class StopSignals:
    """Record SIGINT / SIGTERM and raise them only where the run may stop (module docstring).

    Outside :meth:`installed` (or off the main thread, where Python cannot set
    handlers) it does nothing: :meth:`check` and :meth:`interruptible` are
    no-ops and the signals keep their usual behaviour.

    Example:
        >>> import os, signal
        >>> from torchrl_muzero.trainers.stop_signals import StopSignals, Terminated
        >>> signals = StopSignals()
        >>> with signals.installed():
        ...     os.kill(os.getpid(), signal.SIGTERM)  # as `kill` sends it: recorded, this block goes on
        ...     recorded = signals.received
        ...     try:
        ...         signals.check()  # a safe point: the stop is raised here
        ...     except Terminated:
        ...         stopped_at_check = True
        >>> recorded == signal.SIGTERM and stopped_at_check
        True
    """

    def __init__(self) -> None:
        #: the first stop signal received (``signal.SIGINT`` / ``signal.SIGTERM``), else ``None``
        self.received: int | None = None
        self._waiting = 0  # depth of interruptible() blocks the main thread is in
        self._previous: dict[int, object] = {}

    @contextlib.contextmanager
    def installed(self) -> Iterator["StopSignals"]:
        """Handle SIGINT and SIGTERM inside the block (main thread only), then restore the previous handlers.

        A signal the process ignores (``SIG_IGN``) is left ignored.
        """
        if threading.current_thread() is not threading.main_thread():
            yield self
            return
        for signum in _NAMES:
            # an ignored signal stays ignored (a shell starts background jobs with SIGINT ignored)
            if signal.getsignal(signum) is not signal.SIG_IGN:
                self._previous[signum] = signal.signal(signum, self._handle)
        try:
            yield self
        finally:
            for signum, previous in self._previous.items():
                signal.signal(signum, previous)
            self._previous.clear()

    def _handle(self, signum: int, frame) -> None:
        again = self.received is not None
        if not again:
            self.received = signum
        if again or self._waiting:
            raise self._stop(signum)
        # print, not a logger: a logging handler's lock may be held by the very frame interrupted; and
        # nothing may raise from here (a closed stderr): that would be the stop at a random point again
        try:
            print(f"\ntorchrl_muzero: {_NAMES[signum]} received, stopping after the current step "
                  f"({_NAMES[signum]} again stops at once) ...", file=sys.stderr, flush=True)
        except Exception:
            pass

    @staticmethod
    def _stop(signum: int) -> BaseException:
        return KeyboardInterrupt() if signum == signal.SIGINT else Terminated()

    def check(self) -> None:
        """A safe point: raise the recorded stop (``KeyboardInterrupt`` / :class:`Terminated`), if any."""
        if self.received is not None:
            raise self._stop(self.received)

    @contextlib.contextmanager
    def interruptible(self) -> Iterator[None]:
        """A wait that holds no half-changed state: a stop signal (recorded or new) is raised inside it."""
        self.check()
        self._waiting += 1
        try:
            yield
        finally:
            self._waiting -= 1


@contextlib.contextmanager
def children_deaf_to_ctrl_c() -> Iterator[None]:
    """Start worker processes inside this block: they begin with SIGINT blocked, the driver does not lose it.

    A spawned worker spends its first seconds importing torch; a terminal's
    Ctrl-C then would print a ``KeyboardInterrupt`` traceback from deep inside
    torch's import, and a worker that died of it later would turn the
    driver's orderly stop into "worker died" faults. A child inherits its
    parent thread's signal mask (through ``fork`` and ``exec``), so SIGINT is
    blocked in the driver's main thread while it starts them: the children are
    born deaf to it, and so are the processes they start (an env pool's). The
    driver shuts them down; one whose driver is gone notices by itself (a
    closed pipe, a changed parent). It is a mask and not ``SIG_IGN`` set in
    the worker's entry point because those entry functions can run in the
    driver's own process too (torchrl builds a fallback policy from
    ``policy_factory`` in some configurations; a Ray actor's class can be built
    in-process), where an ignore would swallow the user's Ctrl-C: a first
    version did that, and the test suite's own process went deaf to SIGINT.
    In the driver nothing is lost: a SIGINT that arrives meanwhile goes to
    another of its threads, or waits until the block ends, and is then
    handled as usual. No-op off the main thread or
    where ``pthread_sigmask`` does not exist.

    Example:
        >>> import signal
        >>> from torchrl_muzero.trainers.stop_signals import children_deaf_to_ctrl_c
        >>> with children_deaf_to_ctrl_c():
        ...     blocked = signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])
        >>> blocked, signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, [])
        (True, False)
    """
    if not hasattr(signal, "pthread_sigmask") or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
