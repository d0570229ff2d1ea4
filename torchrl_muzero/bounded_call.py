"""Shut a component down within a time bound, so a stuck shutdown cannot cost the run its final checkpoint.

Why it exists: the driver shuts its collector, evaluators and weight-sync
scheme down *before* it writes the final checkpoint (the workers must stop
reading the weights first). Those shutdowns are torchrl's and
``multiprocessing``'s code: joining a queue's feeder thread, a process, a
pipe. Should one of them block (a lock a killed worker held, a pipe nobody
reads), the run would hang with its checkpoint unwritten. :func:`call_within`
runs the shutdown in a helper thread and gives up waiting after ``timeout_s``:
the run goes on to its checkpoint and summary, reports what was stuck, with
the stuck thread's stack, and the exit watchdog (``exit_watchdog.py``) ends
the process and its leftover children.

Example:
    >>> import time
    >>> from torchrl_muzero.bounded_call import call_within
    >>> call_within(lambda: None, timeout_s=1.0, what="a quick shutdown") is None
    True
    >>> print(call_within(lambda: time.sleep(5), timeout_s=0.1, what="a slow shutdown").splitlines()[0])
    a slow shutdown did not return within 0.1 s (left running in a daemon thread); it was at:
"""
from __future__ import annotations

import sys
import threading
import traceback
from typing import Callable

__all__ = ["call_within"]


def call_within(fn: Callable[[], object], timeout_s: float, what: str) -> str | None:
    """Call ``fn()`` in a daemon thread and wait at most ``timeout_s`` seconds.

    Returns ``None`` when it returned in time, else one message naming
    ``what`` and the stack where it is stuck (then the thread is left
    running: it dies with the process). An exception ``fn`` raises is
    re-raised here.
    """
    error: list[BaseException] = []

    def target() -> None:
        try:
            fn()
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
            error.append(err)

    thread = threading.Thread(target=target, name=f"torchrl_muzero: {what}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        frame = sys._current_frames().get(thread.ident)
        where = "".join(traceback.format_stack(frame)) if frame is not None else "  (no stack)\n"
        return (f"{what} did not return within {timeout_s:g} s (left running in a daemon thread); "
                f"it was at:\n{where.rstrip()}")
    if error:
        raise error[0]
    return None
