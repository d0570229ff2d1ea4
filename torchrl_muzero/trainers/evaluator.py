"""Evaluator processes: greedy episodes on immutable weight snapshots.

Each result carries the policy version it evaluated, so the driver can save
the checkpoint of exactly the weights that scored it.
"""
from __future__ import annotations

import os
import queue
import time
import traceback
from dataclasses import dataclass, field

import torch
import torch.multiprocessing as mp

from torchrl_muzero.trainers.base import TrainingStopped
from torchrl_muzero.trainers.cpu_budget import yield_to_learner
from torchrl_muzero.trainers.quick_exit import freeze_heap_at_exit

__all__ = ["EvalResult", "EvaluatorPool", "WorkerDied"]


class WorkerDied(TrainingStopped):
    """A worker process of the pipeline died or reported an error."""


@dataclass
class EvalResult:
    """Returns of one evaluation of the weights published as ``version``.

    Examples:
        >>> from torchrl_muzero.trainers.evaluator import EvalResult
        >>> EvalResult(version=12, returns=[100.0, 200.0]).mean_return
        150.0
    """

    version: int
    returns: list
    stats: dict = field(default_factory=dict)  # extra metrics (board games: W/D/L per opponent)

    @property
    def mean_return(self) -> float:
        return sum(self.returns) / max(len(self.returns), 1)


def _evaluator_main(cfg_dict, observation_shape, action_space, requests, results, parent_pid, index, stop):
    yield_to_learner(int(cfg_dict["async_pipeline"]["actor_niceness"]))
    freeze_heap_at_exit()  # the evaluator ends several times sooner at the shutdown (quick_exit.py)
    num_threads = max(1, int(cfg_dict["async_pipeline"]["evaluator_num_cpus"]))
    torch.set_num_threads(num_threads)
    device = "cuda" if cfg_dict["async_pipeline"]["evaluator_num_gpus"] > 0 else "cpu"
    try:
        from torchrl_muzero.envs import make_env
        from torchrl_muzero.trainers.builders import algorithm, build_model, mcts_config
        from torchrl_muzero.trainers.config import load_config
        from torchrl_muzero.trainers.evaluation import EvaluationCancelled, evaluate_with_stats

        cfg = load_config(cfg_dict)
        model = build_model(cfg, observation_shape, action_space).to(device).eval()
        env = make_env(cfg.env, num_envs=cfg.eval.num_episodes, seed=cfg.seed + 10_000 + index, training=False)
        sims = cfg.eval.num_simulations or cfg.mcts.num_simulations
        mcts = mcts_config(cfg, temperature=0.0, num_simulations=sims)
        while not stop.is_set():
            try:
                request = requests.get(timeout=1.0)
            except queue.Empty:
                if os.getppid() != parent_pid:  # the driver is gone: do not linger
                    return
                continue
            if request is None:
                break
            version, weights = request
            model.load_state_dict(weights)
            algo = algorithm(cfg)
            try:
                scored = evaluate_with_stats(model, env, mcts, cfg.env, search_fn=algo.search_fn,
                                             memory=algo.acting_memory(cfg), should_stop=stop.is_set)
            except EvaluationCancelled:  # the driver is shutting down: nobody waits for this score
                break
            results.put(("ok", index, version, scored))
        env.close()
    except BaseException:  # report, then exit non-zero: the driver names us in its error
        results.put(("error", index, -1, traceback.format_exc()))
        raise


class EvaluatorPool:
    """``num_evaluators`` evaluator processes fed with ``(version, weights)`` snapshots.

    :meth:`submit` hands a snapshot to an idle evaluator (at most
    ``max_inflight`` at once); :meth:`poll` returns finished results and
    raises :class:`WorkerDied` naming the evaluator if one died or failed.

    Examples:
        >>> from torchrl_muzero.trainers.config import TrainConfig, config_to_dict
        >>> pool = EvaluatorPool(config_to_dict(TrainConfig()), (4,), 2)  # doctest: +SKIP
        >>> pool.submit(version=0, weights=model.state_dict())  # doctest: +SKIP
        >>> pool.poll()  # later: [EvalResult(version=0, returns=[...])]  # doctest: +SKIP
        >>> pool.shutdown()  # doctest: +SKIP
    """

    def __init__(self, cfg_dict: dict, observation_shape, action_space, num_evaluators: int = 1,
                 max_inflight: int = 1) -> None:
        ctx = mp.get_context("spawn")
        self.results = ctx.Queue()
        # set by shutdown(): an evaluator mid-episode abandons it at its next env step instead of
        # playing on (hundreds of searches under load) while the driver waits to join it
        self.stop = ctx.Event()
        self.requests = []
        self.procs = []
        self.busy = []
        self.max_inflight = max(1, max_inflight)
        for i in range(num_evaluators):
            q = ctx.Queue()
            p = ctx.Process(target=_evaluator_main, name=f"muzero-evaluator-{i}",
                            args=(cfg_dict, observation_shape, action_space, q, self.results, os.getpid(), i, self.stop),
                            daemon=True)
            p.start()
            self.requests.append(q)
            self.procs.append(p)
            self.busy.append(False)

    @property
    def inflight(self) -> int:
        return sum(self.busy)

    def can_submit(self) -> bool:
        return self.inflight < self.max_inflight and not all(self.busy)

    def submit(self, version: int, weights: dict) -> None:
        idx = self.busy.index(False)
        self.busy[idx] = True
        self.requests[idx].put((version, weights))

    def poll(self) -> list[EvalResult]:
        self.check_alive()
        out = []
        while True:
            try:
                status, idx, version, payload = self.results.get_nowait()
            except queue.Empty:
                return out
            if status == "error":
                raise WorkerDied(f"evaluator process {idx} failed:\n{payload}")
            self.busy[idx] = False
            out.append(EvalResult(version, *payload))

    def check_alive(self) -> None:
        for i, p in enumerate(self.procs):
            if not p.is_alive():
                raise WorkerDied(f"evaluator process {i} (pid {p.pid}) died with exit code {p.exitcode}.")

    def shutdown(self, timeout_s: float = 10.0, grace_s: float = 2.0) -> None:
        """Stop every evaluator: call after the last :meth:`poll` (a score still in flight is dropped).

        Evaluators are told to stop (between two env steps) and to exit; one that
        has not exited within ``min(timeout_s, grace_s)`` is killed. Killing loses
        nothing: an evaluator is daemonic (it steps its games in-process, no
        children), writes no file, and the driver no longer reads its queue. The
        short grace matters because evaluators run at ``actor_niceness``: on a
        loaded machine a starved one can take tens of seconds just to exit, and a
        fault stop must not wait for it.
        """
        self.stop.set()
        for q, p in zip(self.requests, self.procs):
            if p.is_alive():
                try:
                    q.put(None)
                except Exception:
                    pass
        deadline = time.monotonic() + min(timeout_s, grace_s)
        for p in self.procs:
            p.join(timeout=max(0.0, deadline - time.monotonic()))
        late = [p for p in self.procs if p.is_alive()]
        for p in late:
            p.kill()
        for p in late:
            p.join(timeout=5)
        for q in [*self.requests, self.results]:
            q.cancel_join_thread()
            q.close()
