"""How many torch threads the async driver's learner may use, decided before every update.

The collector and evaluator processes each run on ``collector_num_cpus`` /
``evaluator_num_cpus`` threads. While they work, a learner that keeps every
core oversubscribes the machine: on the 2-core development machine a Pong
update (batch 8) was slower with 2 learner threads beside a busy collector
than with 1 (docs/performance_pipeline.md, "Pong: sync vs async"). While they
wait (back-pressure, no evaluation running) those cores are idle and the
learner should take them: 2 threads then made the same update faster than
either. Changing torch's intra-op thread count is cheap next to an update, so
the driver re-decides it before each update from what the actors are doing at
that moment (figures: docs/performance_pipeline.md, "Design figures quoted
from the code").
"""
from __future__ import annotations

import os

import torch

__all__ = ["LearnerThreads", "yield_to_learner"]


def yield_to_learner(niceness: int) -> int:
    """Lower this actor process's CPU priority by ``niceness``; return the new nice value.

    Called first thing in collector and evaluator processes: when the machine
    has fewer cores than busy threads, the kernel then gives the learner its
    cores and the actors the rest, instead of slowing the learner down by a
    third with two collectors on two cores (docs/performance_pipeline.md). On Linux a
    nice value is per thread and inherited by threads started afterwards, so
    this must run before the process starts its worker threads. ``0`` (or a
    platform without ``os.nice``) leaves the priority as it is.
    """
    if niceness < 0:
        raise ValueError(f"async_pipeline.actor_niceness must be >= 0, got {niceness}.")
    if niceness == 0 or not hasattr(os, "nice"):
        return os.nice(0) if hasattr(os, "nice") else 0
    try:
        return os.nice(niceness)
    except OSError:  # not permitted here: run at the same priority
        return os.nice(0)


class LearnerThreads:
    """The learner's share of the cores: those the working actors leave free.

    Args:
        cores: the cores the driver may use in all (default: torch's thread
            count when the budget is created, which follows ``OMP_NUM_THREADS``
            / ``torch.set_num_threads`` and otherwise the machine's cores).
        fixed: a fixed thread count instead (``0``: adapt).

    Examples:
        >>> import torch
        >>> threads = LearnerThreads(cores=2)
        >>> threads.update(busy_cpus=1)   # a collector is collecting: one core is taken
        1
        >>> torch.get_num_threads()
        1
        >>> threads.update(busy_cpus=0)   # every actor waits: the learner takes both cores
        2
        >>> threads.restore()
    """

    def __init__(self, cores: int | None = None, fixed: int = 0) -> None:
        self.initial = torch.get_num_threads()
        self.cores = int(cores) if cores else self.initial
        if self.cores < 1:
            raise ValueError(f"cores must be >= 1, got {self.cores}.")
        if fixed < 0:
            raise ValueError(f"async_pipeline.learner_num_threads must be >= 0 (0: adapt), got {fixed}.")
        self.fixed = int(fixed)
        self.current = self.initial

    def update(self, busy_cpus: float) -> int:
        """Set and return the learner's thread count for the next update."""
        wanted = self.fixed or max(1, self.cores - int(round(busy_cpus)))
        if wanted != self.current:
            torch.set_num_threads(wanted)
            self.current = wanted
        return wanted

    def restore(self) -> None:
        """Give the process back the thread count it had before (whoever changed it since)."""
        torch.set_num_threads(self.initial)
        self.current = self.initial
