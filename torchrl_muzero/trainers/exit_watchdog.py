"""The last guard of a run's exit: the process ends, with its exit status, even if the interpreter's exit blocks.

Why it exists: when a run has ended (final checkpoint written, workers shut
down, ``summary.json`` written and the closing line printed), the Python
interpreter still has to exit: it joins non-daemon threads, runs ``atexit``
handlers (``multiprocessing`` joins its children and the feeder threads of
every queue this process wrote to) and the finalizers of C++ extensions. Any of
those can block forever on a pipe or a child that a torchrl component left in
a bad state, and then a script that has already said "run stopped" never
returns: CI saw the async script hang there after Ctrl-C, rarely and on a
loaded machine. The run's results are safe at that point, so the honest thing
is to say what was blocked and end the process with the status the run earned.

:func:`arm_exit_watchdog` starts a daemon thread that does nothing if the
process exits in time. If it is still alive after ``timeout_s`` seconds, it
prints one line naming the problem, the stacks of every thread (so the next
person knows what blocked), writes the same into ``exit_watchdog.txt`` in the
run folder, kills this process's remaining ``multiprocessing`` children (no
orphans) and ends the process with ``os._exit(exit_code)``. A second, C-level
guard (:func:`faulthandler.dump_traceback_later`) ends the process a few
seconds later should the interpreter be stuck somewhere that holds the GIL.

Example:
    >>> from torchrl_muzero.trainers.exit_watchdog import arm_exit_watchdog, disarm_exit_watchdog
    >>> watchdog = arm_exit_watchdog(exit_code=0, timeout_s=60.0)
    >>> watchdog.daemon
    True
    >>> disarm_exit_watchdog(watchdog)
"""
from __future__ import annotations

import faulthandler
import multiprocessing
import os
import sys
import threading
from pathlib import Path

__all__ = ["arm_exit_watchdog", "disarm_exit_watchdog", "EXIT_WATCHDOG_S", "ENV_VAR", "REPORT_NAME"]

#: seconds a process may take to exit after its run ended (the run's own shutdown is done by then:
#: what is left is the interpreter's exit, normally well under a second)
EXIT_WATCHDOG_S = 20.0
#: environment variable that overrides :data:`EXIT_WATCHDOG_S` (seconds; e.g. a logger that
#: uploads at exit may need longer)
ENV_VAR = "TORCHRL_MUZERO_EXIT_WATCHDOG_S"
#: the file the watchdog writes into the run folder when it fires
REPORT_NAME = "exit_watchdog.txt"
#: extra seconds the C-level guard waits after the Python one
_C_LEVEL_GRACE_S = 10.0


class _Watchdog(threading.Thread):
    def __init__(self, exit_code: int, timeout_s: float, run_dir: Path | None):
        super().__init__(name="torchrl_muzero_exit_watchdog", daemon=True)
        self.exit_code = int(exit_code)
        self.timeout_s = float(timeout_s)
        self.run_dir = run_dir
        self.cancelled = threading.Event()

    def run(self) -> None:
        if self.cancelled.wait(self.timeout_s):
            return
        line = (f"torchrl_muzero: the process had not exited {self.timeout_s:.0f} s after the run ended "
                f"(a thread, an exit handler or a child process blocked the interpreter's exit); "
                f"forcing exit status {self.exit_code}. Thread stacks:")
        try:
            _report(line, self.run_dir)
            # no orphans: they would outlive us (the main thread may be iterating the same children
            # in multiprocessing's exit handler, so nothing here may stop us from reaching os._exit)
            for child in multiprocessing.active_children():
                try:
                    child.kill()
                except Exception:
                    pass
        except Exception:
            pass
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(self.exit_code)


def _report(line: str, run_dir: Path | None) -> None:
    try:
        print(line, file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
    except Exception:  # stderr itself may be what is broken
        pass
    if run_dir is not None:
        try:
            with open(Path(run_dir) / REPORT_NAME, "w") as f:
                f.write(line + "\n")
                f.flush()
                faulthandler.dump_traceback(file=f, all_threads=True)
        except Exception:
            pass


def arm_exit_watchdog(exit_code: int, timeout_s: float | None = None,
                      run_dir: str | Path | None = None) -> threading.Thread:
    """Guarantee that this process ends within ``timeout_s`` seconds with ``exit_code``.

    Call it once the run's own work is done (checkpoint and summary written),
    right before the script returns or calls ``sys.exit(exit_code)``. If the
    interpreter exits in time nothing happens; otherwise the thread stacks are
    printed (and written to ``run_dir/exit_watchdog.txt``), leftover
    ``multiprocessing`` children are killed and the process exits with
    ``exit_code``. Returns the watchdog thread (:func:`disarm_exit_watchdog`
    cancels it, for callers that go on running, e.g. tests). ``timeout_s``
    defaults to ``$TORCHRL_MUZERO_EXIT_WATCHDOG_S``, else :data:`EXIT_WATCHDOG_S`.
    """
    if timeout_s is None:
        raw = os.environ.get(ENV_VAR, "")
        try:
            timeout_s = float(raw) if raw else EXIT_WATCHDOG_S
        except ValueError:
            raise ValueError(f"{ENV_VAR}={raw!r}; allowed: a positive number of seconds") from None
    if timeout_s <= 0:
        raise ValueError(f"arm_exit_watchdog: timeout_s={timeout_s!r}; allowed: a positive number of seconds")
    watchdog = _Watchdog(exit_code, timeout_s, Path(run_dir) if run_dir is not None else None)
    watchdog.start()
    # should the interpreter be stuck where the Python thread cannot run (a C++ finalizer holding the
    # GIL), faulthandler's own C thread dumps the stacks and exits (status 1) a little later
    faulthandler.dump_traceback_later(timeout_s + _C_LEVEL_GRACE_S, exit=True)
    return watchdog


def disarm_exit_watchdog(watchdog: threading.Thread) -> None:
    """Cancel a watchdog from :func:`arm_exit_watchdog` (and the C-level guard)."""
    faulthandler.cancel_dump_traceback_later()
    if isinstance(watchdog, _Watchdog):
        watchdog.cancelled.set()
