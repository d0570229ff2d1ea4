"""The synchronous pipeline: collect -> train -> evaluate in turn, in one process."""
from __future__ import annotations

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torchrl.collectors import Collector

from torchrl_muzero.envs import make_env
from torchrl_muzero.mcts.acting_memory import with_acting_memory
from torchrl_muzero.trainers.base import TrainerBase
from torchrl_muzero.trainers.builders import algorithm, build_policy, mcts_config, temperature_at
from torchrl_muzero.trainers.evaluation import evaluate_with_stats
from torchrl_muzero.trainers.ready_collector import ReadyStepCollector, steps_ready_games
from torchrl_muzero.trainers.stop_signals import children_deaf_to_ctrl_c
from torchrl_muzero.torchrl_guards import reclaim_torch_threads

#: seconds the sync trainer waits for its collector's or eval env's close (a ParallelEnv joins its workers)
_SHUTDOWN_TIMEOUT_S = 30.0

__all__ = ["SyncTrainer", "episode_returns"]


def episode_returns(batch) -> list[float]:
    """Returns of the episodes that ended inside a collected batch (needs ``RewardSum``)."""
    if ("next", "episode_reward") not in batch.keys(True):
        return []
    done = batch["next", "done"].squeeze(-1)
    return batch["next", "episode_reward"].squeeze(-1)[done].tolist()


class _VersionAtAction(TensorDictModuleBase):
    """Writes the learner's ``train_iter`` as ``"policy_version"`` when the policy acts.

    With ``env.pool=async`` a game may still be stepping an action chosen in the previous collect
    when the learner moves on: its frame lands in the next batch, so the version is the one of
    the weights that chose the action, not of the collect that returned it.
    """

    def __init__(self, policy, version) -> None:
        super().__init__()
        self.policy, self.version = policy, version
        self.in_keys = list(policy.in_keys)
        self.out_keys = [*policy.out_keys, "policy_version"]

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        out = self.policy(tensordict)
        out.set("policy_version", torch.full(out.batch_size, self.version(), dtype=torch.long))
        return out


class SyncTrainer(TrainerBase):
    """MuZero training in one process: a torchrl ``Collector`` with ``MCTSPolicy``, then updates.

    The reference semantics for :class:`~torchrl_muzero.trainers.AsyncTrainer`:
    each collected batch of ``train.frames_per_batch`` env steps buys
    ``frames * train.replay_ratio`` learner updates once
    ``train.train_start_after_envsteps`` steps are in the buffer; an
    evaluation runs every ``eval.interval`` updates.

    Examples:
        >>> from torchrl_muzero.trainers import SyncTrainer
        >>> trainer = SyncTrainer({"train": {"total_env_steps": 512},
        ...                        "logger": {"progress_bar": False}})  # doctest: +SKIP
        >>> summary = trainer.run()  # doctest: +SKIP
    """

    def _loop(self) -> None:
        cfg = self.cfg
        # env.pool=parallel / async start their game processes here (a ParallelEnv's set_seed starts
        # its workers): they are born deaf to a terminal's Ctrl-C, as the async pipeline's workers are
        with children_deaf_to_ctrl_c():
            env = make_env(cfg.env, seed=cfg.seed)
            self.eval_env = make_env(cfg.env, num_envs=cfg.eval.num_episodes, seed=cfg.seed + 10_000,
                                     training=False)
        self.policy = build_policy(cfg, self.learner.model, env.action_spec,
                                   generator=torch.Generator(self.device).manual_seed(cfg.seed))
        # per-env acting state (muzero_context's latent, muzero_rnn_full_obs's GRU state): its primer
        env = with_acting_memory(env, self.policy)
        if steps_ready_games(cfg):  # env.pool=async: the games that are ready step, the others keep stepping
            self.collector = ReadyStepCollector(env, _VersionAtAction(self.policy, lambda: self.learner.train_iter),
                                                frames_per_batch=cfg.train.frames_per_batch, total_frames=-1)
        else:
            self.collector = Collector(env, self.policy, frames_per_batch=cfg.train.frames_per_batch,
                                       total_frames=-1, auto_register_policy_transforms=False)
        budget = 0.0
        next_eval = self.learner.train_iter + (0 if cfg.async_pipeline.eval_at_start else cfg.eval.interval)
        batches = iter(self.collector)
        while True:
            with self.stop_signals.interruptible():  # acting only: nothing of the run's state changes yet
                batch = next(batches, None)
            if batch is None:  # total_frames=-1: only a collector that ends on its own
                break
            # a ParallelEnv took threads from this process when it started its workers (lazily):
            # the search and the learner run here while the env workers wait, so take them back
            reclaim_torch_threads(self.torch_threads)
            if "policy_version" not in batch.keys():  # the whole batch acted with the current weights
                batch.set("policy_version", torch.full(batch.shape, self.learner.train_iter, dtype=torch.long))
            self.buffer.extend(batch)
            self.note_collected(batch["policy_version"])
            self.env_steps += batch.numel()
            returns = episode_returns(batch)
            self.episodes += len(returns)
            if returns:
                self.metrics.log(self.env_steps, {"collect/episode_return": sum(returns) / len(returns)})
            if self.train_budget_ready():
                budget += batch.numel() * cfg.train.replay_ratio
                while budget >= 1:
                    budget -= 1
                    self.after_train_step(self.learner.step())
                    self.stop_signals.check()  # a safe point: between two updates
                    if self.learner.train_iter >= next_eval:
                        self._evaluate()
                        next_eval = self.learner.train_iter + cfg.eval.interval
            self.policy.config.temperature = temperature_at(cfg, self.env_steps / max(cfg.train.total_env_steps, 1))
            self.metrics.progress(self.env_steps, self.learner.train_iter, lag=0.0)
            if self.should_stop():
                break
        last_evaluated = next_eval - cfg.eval.interval
        if (self.stop_reason and self.learner.train_iter and "stop_return" not in self.stop_reason
                and self.learner.train_iter != last_evaluated):  # each version is scored once
            self._evaluate()

    def _evaluate(self) -> float:
        cfg = self.cfg
        sims = cfg.eval.num_simulations or cfg.mcts.num_simulations
        with self.stop_signals.interruptible():  # playing only: nothing is written before the episodes end
            returns, stats = evaluate_with_stats(self.learner.model, self.eval_env,
                                                 mcts_config(cfg, temperature=0.0, num_simulations=sims), cfg.env,
                                                 search_fn=algorithm(cfg).search_fn,
                                                 memory=algorithm(cfg).acting_memory(cfg))
        mean = sum(returns) / len(returns)
        version = self.learner.train_iter
        self.metrics.log(self.env_steps, stats)  # board games: win / draw / loss rates per opponent
        self.metrics.log_eval(self.env_steps, version, version, mean)
        self.save_evaluated(version, self.model_snapshot(), mean)
        return mean

    def _shutdown(self) -> None:
        # each within a bound and whatever the others did (TrainerBase._close_each): the final
        # checkpoint is written after this
        collector, eval_env = getattr(self, "collector", None), getattr(self, "eval_env", None)
        self._close_each([("collector", collector.shutdown if collector is not None else None),
                          ("eval_env", eval_env.close if eval_env is not None and not eval_env.is_closed else None)],
                         _SHUTDOWN_TIMEOUT_S)
        self.collector = self.eval_env = None
