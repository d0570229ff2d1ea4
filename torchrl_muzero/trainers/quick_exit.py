"""Make a process that imported torch, tensordict and torchrl end several times sooner.

Why it exists: after a run's last line, the interpreter's finalization still runs
the cyclic garbage collector over every object alive, and a process with torch,
tensordict and torchrl imported holds millions of them (``torch._dynamo`` and
sympy come in with tensordict). On the 2-core development machine that pass was
most of a process's exit after the ``atexit`` handlers had run; freezing the heap
first (:func:`gc.freeze`: what is alive now moves to a generation the collector
never scans) cut it several-fold (docs/performance_pipeline.md, "Process exit" and
"Design figures quoted from the code"). An async run ends its collector workers
and evaluators one after the other, and its script ends too, so the shutdown
after Ctrl-C or at the end of a run waited that long once per process on work
that frees memory the OS takes back anyway.

What freezing leaves out: the collector's last passes over objects that were
alive when the process began to exit. The rest of a normal exit still happens:
``atexit`` handlers run (multiprocessing joins its children and queue feeder
threads, weakref finalizers such as temporary folders run), standard streams are
flushed, and objects created by later exit handlers are collected as usual. What
is lost is freeing whatever sits in a reference cycle, and a module's globals do
(a module's functions refer back to its dict): an object kept in a module global
whose ``__del__`` or deallocation would flush a file is never finalized, and the
data it buffered never lands (test/test_quick_exit.py shows both cases). So only
processes that write no file that way call :func:`freeze_heap_at_exit`: the
collector workers (their policy factory) and the evaluator processes, which hand
everything to the driver through queues and shared memory. The driver and the
scripts do not (a user's logger backend may buffer its file until it is freed),
nor does a user's own process unless it calls it.

Example:
    >>> from torchrl_muzero.trainers.quick_exit import freeze_heap_at_exit
    >>> freeze_heap_at_exit()  # once per process; later calls do nothing
    True
    >>> freeze_heap_at_exit()
    False
"""
from __future__ import annotations

import atexit
import gc

__all__ = ["freeze_heap_at_exit"]

_registered = False


def freeze_heap_at_exit() -> bool:
    """Register :func:`gc.freeze` to run at this process's exit; ``True`` the first time in a process.

    Registered once: ``atexit`` runs the latest handler first, so the heap is frozen
    before the exit handlers registered earlier (torch's, multiprocessing's), and what
    those create is still collected.
    """
    global _registered
    if _registered:
        return False
    atexit.register(gc.freeze)
    _registered = True
    return True
