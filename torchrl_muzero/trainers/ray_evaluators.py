"""The Ray backend's evaluators: :class:`RayEvaluatorPool`, the evaluator pool's interface over Ray actors.

Its own module because it is its own concept (the collectors' rounds and the
weights live in :mod:`~torchrl_muzero.trainers.ray_backend`): the pool hands
snapshots to :class:`~torchrl_muzero.trainers.ray_actors.EvaluatorActor`
actors, returns their results, and on a dead actor either stops the run
naming it or, with ``async_pipeline.restart_dead_actors=true``, replaces it.
"""
from __future__ import annotations

from typing import Callable

from torchrl_muzero.trainers.evaluator import EvalResult, WorkerDied
from torchrl_muzero.trainers.ray_actors import EvaluatorActor

__all__ = ["RayEvaluatorPool", "actor_died", "first_line"]


def actor_died(ray, err: BaseException) -> bool:
    """Whether ``err`` (from ``ray.get``) says the actor's process is gone, not that its method raised."""
    return isinstance(err, (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError))


def first_line(err: BaseException) -> str:
    """The first line of an error's text: Ray's messages run over many lines, fault reasons are one."""
    text = str(err).strip()
    return text.splitlines()[0] if text else ""


class RayEvaluatorPool:
    """The :class:`~torchrl_muzero.trainers.evaluator.EvaluatorPool` interface over evaluator actors.

    ``restart_dead=True``: an evaluator actor that died is replaced by a new
    one on the same index (same seed: evaluations stay comparable across the
    restart); the evaluation it was running is lost, and ``on_lost(version)``
    tells the driver so that it drops the weights it kept for that score (and
    counts the restart).
    The replacement's start-up (its env and model) is waited for, bounded by
    ``start_timeout_s``, so its pid is known before it is handed work.

    Examples:
        >>> pool = RayEvaluatorPool(ray, cfg_dict, (4,), 2, num_evaluators=1, max_inflight=1,  # doctest: +SKIP
        ...                         num_cpus=1, num_gpus=0, restart_dead=True, on_lost=print)
        >>> pool.started(); pool.submit(0, model.state_dict())  # doctest: +SKIP
        >>> [result.version for result in pool.poll()]  # once it finished  # doctest: +SKIP
        [0]
    """

    def __init__(self, ray, cfg_dict: dict, observation_shape, action_space, num_evaluators: int,
                 max_inflight: int, num_cpus: float, num_gpus: float, restart_dead: bool = False,
                 start_timeout_s: float = 120.0, on_lost: Callable[[int], None] | None = None) -> None:
        self.ray = ray
        self._remote = ray.remote(num_cpus=num_cpus, num_gpus=num_gpus, max_restarts=0)(EvaluatorActor)
        self._args = (cfg_dict, observation_shape, action_space)
        self.actors = [self._spawn(i) for i in range(num_evaluators)]
        self.running: dict = {}  # ObjectRef -> (evaluator index, version)
        self.max_inflight = max(1, max_inflight)
        self.where: list[dict] = [{} for _ in self.actors]
        self.restart_dead, self.start_timeout_s, self.on_lost = restart_dead, start_timeout_s, on_lost

    def _spawn(self, i: int):
        """A new evaluator actor for index ``i`` (its seed follows the index)."""
        cfg_dict, observation_shape, action_space = self._args
        return self._remote.remote(cfg_dict, i, observation_shape, action_space)

    def started(self, timeout_s: float | None = None) -> None:
        """Wait for the evaluators to exist: their pids (fault messages), and start-up errors naming them."""
        for i in range(len(self.actors)):
            self._wait_started(i, self.start_timeout_s if timeout_s is None else timeout_s)

    def _wait_started(self, i: int, timeout_s: float) -> None:
        try:
            self.where[i] = self.ray.get(self.actors[i].where.remote(), timeout=timeout_s)
        except Exception as err:
            raise WorkerDied(f"evaluator actor {i} failed to start: {type(err).__name__}: {first_line(err)}") from err

    @property
    def inflight(self) -> int:
        return len(self.running)

    def can_submit(self) -> bool:
        return self.inflight < min(self.max_inflight, len(self.actors))

    def submit(self, version: int, weights: dict) -> None:
        busy = {i for i, _ in self.running.values()}
        idx = next(i for i in range(len(self.actors)) if i not in busy)
        self.running[self.actors[idx].evaluate.remote(weights)] = (idx, version)

    def poll(self) -> list[EvalResult]:
        """The evaluations finished since the last poll (never blocks); a dead actor stops or is replaced."""
        if not self.running:
            return []
        ready, _ = self.ray.wait(list(self.running), num_returns=len(self.running), timeout=0)
        out = []
        for ref in ready:
            idx, version = self.running.pop(ref)
            try:
                returns, stats = self.ray.get(ref)
            except Exception as err:
                self._fault(idx, version, err)
                continue
            out.append(EvalResult(version, returns, stats))
        return out

    def _fault(self, idx: int, version: int, err: BaseException) -> None:
        died = actor_died(self.ray, err)
        name = f"evaluator actor {idx} (pid {self.where[idx].get('pid', '?')})"
        if not (died and self.restart_dead):  # an error raised by evaluate() is a bug: never papered over
            raise WorkerDied(f"{name} {'died' if died else 'failed'}: {type(err).__name__}: "
                             f"{first_line(err)}") from err
        print(f"torchrl_muzero: {name} died ({type(err).__name__}); restarting it")
        self.actors[idx] = self._spawn(idx)
        self.where[idx] = {}
        if self.on_lost is not None:
            self.on_lost(version)
        self._wait_started(idx, self.start_timeout_s)

    def shutdown(self, timeout_s: float = 10.0) -> None:
        for actor in self.actors:
            self.ray.kill(actor)
        self.actors, self.running = [], {}
