"""The seam between the async driver and where its actors run: :class:`WorkerBackend`.

:class:`~torchrl_muzero.trainers.AsyncTrainer` (the driver) owns the buffer, the learner,
the publish decisions, the policy version map, the evaluation bookkeeping and the checkpoints.
A backend owns the collectors and evaluators: it builds them (:meth:`WorkerBackend.start`),
hands the driver their batches, publishes the weights the driver decided to publish, and stops
them (:meth:`WorkerBackend.shutdown`), as torchrl splits its collectors by role. Two backends,
chosen from ``async_pipeline.backend`` by :func:`~torchrl_muzero.trainers.backends.make_backend`:

* :class:`~torchrl_muzero.trainers.local_backend.LocalBackend` (``local``): torchrl's
  ``MultiAsyncCollector`` / ``MultiSyncCollector`` worker processes and the
  :class:`~torchrl_muzero.trainers.evaluator.EvaluatorPool` processes;
* :class:`~torchrl_muzero.trainers.ray_backend.RayBackend` (``ray``): collector and evaluator
  Ray actors (docs/multi-node.md).

The control values (:attr:`WorkerBackend.control`) are written by the driver at the indices
below and read by the workers (local: shared memory) or by the backend itself (Ray).
"""
from __future__ import annotations

from tensordict import TensorDictBase

__all__ = ["WorkerBackend", "LEARNER_ITER", "TEMPERATURE", "PACE_OFFSET", "PACE_RELEASE", "PACE_IDLE",
           "CONTROL_SIZE"]

# index of the driver-written values in the control values (local: the shared tensor the workers read)
LEARNER_ITER, TEMPERATURE = 0, 1
# just-in-time collection (collect_pacing.py): env steps at the actors' start, the flag that releases
# workers waiting at the gate when the run shuts down, and the driver's "waiting for a batch, nothing to train"
PACE_OFFSET, PACE_RELEASE, PACE_IDLE = 2, 3, 4
CONTROL_SIZE = 5


class WorkerBackend:
    """Where an async run's collectors and evaluators run: it builds, feeds and stops them.

    The driver calls, in this order: :meth:`start` once (with itself: the backend reads the
    run's config, learner, version map and counters from it), then in its event loop
    :meth:`batch_ready` / :meth:`next_batch`, :meth:`busy_actor_cpus` before each update,
    :meth:`await_publish` right before each optimizer step, :meth:`publish` when
    :func:`~torchrl_muzero.trainers.async_pipeline.publish_due` says so, and the
    ``evaluators`` pool (``None`` without evaluators); finally :meth:`shutdown`, whichever
    way the run ended (also when :meth:`start` failed half-way or never ran). A fault of a
    worker is raised as :class:`~torchrl_muzero.trainers.evaluator.WorkerDied` naming it.

    Examples:
        >>> from torchrl_muzero.trainers.backends import make_backend
        >>> from torchrl_muzero.trainers.config import load_config
        >>> type(make_backend(load_config({"async_pipeline": {"backend": "ray"}}))).__name__
        'RayBackend'
        >>> backend = make_backend(load_config())
        >>> backend.name, backend.evaluators is None
        ('local', True)
    """

    #: the ``async_pipeline.backend`` value it implements
    name = ""

    def __init__(self) -> None:
        self.driver = None  # the AsyncTrainer, from start()
        #: the evaluator pool (``poll``, ``submit``, ``can_submit``, ``inflight``), None without evaluators
        self.evaluators = None
        #: the driver-written values (indices above), from start()
        self.control = None

    @property
    def cfg(self):
        return self.driver.cfg

    def start(self, driver) -> None:
        """Build and start the collectors and evaluators of ``driver`` (an AsyncTrainer)."""
        raise NotImplementedError

    def batch_ready(self) -> bool:
        """Whether :meth:`next_batch` would return without waiting."""
        raise NotImplementedError

    def next_batch(self) -> TensorDictBase:
        """The next collected batch ([envs, T], frames tagged ``policy_version`` and ``learner_iter``)."""
        raise NotImplementedError

    def busy_actor_cpus(self) -> int:
        """Cores the actors use right now (collectors collecting, evaluators evaluating): cpu_budget.py."""
        raise NotImplementedError

    def publish(self) -> None:
        """Publish the learner's weights as the next version (the driver decided it is due)."""
        raise NotImplementedError

    def await_publish(self) -> None:
        """Before the weights change: every collector runs the last published weights (the lag bound)."""
        raise NotImplementedError

    def counters(self) -> dict:
        """The backend's entries of the run's summary and checkpoint counters."""
        return {}

    def shutdown(self) -> None:
        """Stop every worker, each within a bound; a stuck or failing one is reported, never raised."""
        raise NotImplementedError
