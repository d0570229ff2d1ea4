"""What every config value may be: each numeric key's range and the rules that tie keys together.

:func:`check_ranges` is called by :func:`~torchrl_muzero.trainers.config.load_config`.
It needs nothing but the config (no file, no device, no torch), so a user's
script gets the same errors as the hydra scripts. What depends on this
machine and its disk is checked later, by
:func:`~torchrl_muzero.trainers.config_checks.check_run_targets`.

Every error is a :class:`~torchrl_muzero.errors.ConfigError` whose message
names the key, the value and what is allowed; the hydra scripts print it as
one ``error: ...`` line and exit with status 2.
"""
from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass
from typing import Optional

from torchrl_muzero.envs.env_ids import effective_pool
from torchrl_muzero.errors import ConfigError

__all__ = ["Range", "RANGES", "check_ranges"]


@dataclass(frozen=True)
class Range:
    """The allowed values of one numeric key: ``lo <= x <= hi`` (or ``<`` where open).

    ``off`` names a value outside the range that is allowed too and what it means
    (``Range(1, off=(0, "off"))``: 0 or at least 1).

    Examples:
        >>> from torchrl_muzero.trainers.config_ranges import Range
        >>> Range(0.0, 1.0).allows(0.5), Range(0.0, 1.0).allows(1.5)
        (True, False)
        >>> Range(1, off=(0, "off")).describe()
        '>= 1 (or 0: off)'
    """

    lo: Optional[float] = None
    hi: Optional[float] = None
    lo_open: bool = False
    hi_open: bool = False
    off: Optional[tuple] = None  # (value, meaning)

    def allows(self, x: float) -> bool:
        if self.off is not None and x == self.off[0]:
            return True
        if isinstance(x, float) and not math.isfinite(x):
            return False
        if self.lo is not None and (x <= self.lo if self.lo_open else x < self.lo):
            return False
        if self.hi is not None and (x >= self.hi if self.hi_open else x > self.hi):
            return False
        return True

    def describe(self) -> str:
        lo = None if self.lo is None else f"{'>' if self.lo_open else '>='} {self.lo:g}"
        hi = None if self.hi is None else f"{'<' if self.hi_open else '<='} {self.hi:g}"
        if lo and hi:
            text = f"in {'(' if self.lo_open else '['}{self.lo:g}, {self.hi:g}{')' if self.hi_open else ']'}"
        else:
            text = lo or hi or "a finite number"
        if self.off is not None:
            text += f" (or {self.off[0]:g}: {self.off[1]})"
        return text


COUNT = Range(1)  # how many of something
NON_NEG = Range(0)
POSITIVE = Range(0, lo_open=True)
PROBABILITY = Range(0.0, 1.0)
INTERVAL = Range(1)  # learner steps between two things
INTERVAL_OR_OFF = Range(1, off=(0, "off"))

#: The range of every numeric key (a test checks that no numeric key is missing).
RANGES: dict[str, Range] = {
    # env
    "env.num_envs": COUNT,
    "env.max_episode_steps": Range(1, off=(0, "the env's own limit")),
    "env.frame_skip": COUNT,
    "env.frame_stack": COUNT,
    "env.screen_size": Range(8),
    "env.noop_max": NON_NEG,
    "env.sticky_action_prob": PROBABILITY,
    "env.memory_length": COUNT,
    "env.safe_reward": Range(-1.0, 1.0, lo_open=True, hi_open=True),
    "env.win_probability": Range(0.0, 1.0, lo_open=True, hi_open=True),
    "env.random_opening_moves": Range(0, 4),  # 5 plies can end a tic-tac-toe game
    "env.action_repeat": COUNT,
    # algo
    "algo.lstm_horizon_len": COUNT,
    "algo.lstm_hidden_size": COUNT,
    "algo.correction_age_scale": POSITIVE,
    "algo.max_num_considered_actions": Range(2),
    "algo.gumbel_scale": NON_NEG,
    "algo.value_scale": POSITIVE,
    "algo.maxvisit_init": NON_NEG,
    "algo.chance_space_size": COUNT,
    "algo.context_length_init": COUNT,
    "algo.rnn_hidden_size": COUNT,
    "algo.afterstate_value_loss_weight": NON_NEG,
    "algo.chance_loss_weight": NON_NEG,
    "algo.commitment_loss_weight": NON_NEG,
    # model
    "model.latent_dim": COUNT,
    "model.hidden_dim": COUNT,
    "model.num_layers": COUNT,
    "model.value_support_size": COUNT,
    "model.reward_support_size": COUNT,
    "model.channels": COUNT,
    "model.num_blocks": NON_NEG,
    # mcts
    "mcts.num_simulations": COUNT,
    "mcts.discount": Range(0.0, 1.0, lo_open=True),
    "mcts.pb_c_base": POSITIVE,
    "mcts.pb_c_init": NON_NEG,
    "mcts.dirichlet_alpha": POSITIVE,
    "mcts.dirichlet_fraction": PROBABILITY,
    "mcts.temperature": NON_NEG,
    # loss
    "loss.value_loss_weight": NON_NEG,
    "loss.reward_loss_weight": NON_NEG,
    "loss.policy_loss_weight": NON_NEG,
    "loss.consistency_loss_weight": NON_NEG,
    "loss.projection_dim": COUNT,
    "loss.projection_hidden_dim": COUNT,
    "loss.prediction_hidden_dim": COUNT,
    # optim
    "optim.lr": POSITIVE,
    "optim.weight_decay": NON_NEG,
    "optim.max_grad_norm": Range(0, lo_open=True, off=(0, "no clipping")),
    "optim.batch_size": COUNT,
    # buffer
    "buffer.capacity": COUNT,
    "buffer.num_unroll_steps": COUNT,
    "buffer.td_steps": COUNT,
    "buffer.reanalyze_ratio": PROBABILITY,
    "buffer.alpha": NON_NEG,
    "buffer.beta": PROBABILITY,
    "buffer.beta_anneal_steps": NON_NEG,
    # train
    "train.total_env_steps": COUNT,
    "train.max_wall_time_s": Range(0, lo_open=True, off=(0, "no limit")),
    "train.replay_ratio": NON_NEG,
    "train.train_start_after_envsteps": NON_NEG,
    "train.frames_per_batch": COUNT,
    "train.target_update_interval": INTERVAL,
    "train.stop_return": Range(),
    "train.checkpoint_interval": INTERVAL_OR_OFF,
    "train.keep_eval_checkpoints": Range(1, off=(0, "keep only the best version's")),
    # eval
    "eval.num_episodes": COUNT,
    "eval.interval": INTERVAL,
    "eval.num_simulations": Range(1, off=(0, "mcts.num_simulations")),
    # async pipeline
    "async_pipeline.num_collector_actors": COUNT,
    "async_pipeline.num_evaluator_actors": Range(1, off=(0, "no evaluation")),
    "async_pipeline.max_collect_inflight": Range(1, off=(0, "num_collector_actors")),
    "async_pipeline.max_eval_inflight": COUNT,
    "async_pipeline.max_train_chunk_steps": COUNT,
    "async_pipeline.weight_sync_interval": INTERVAL,
    "async_pipeline.max_policy_lag": Range(0, off=(-1, "no bound")),
    "async_pipeline.max_train_budget_queue_size": Range(1, off=(0, "2 * num_collector_actors")),
    "async_pipeline.collect_ahead_frames": Range(0, off=(-1, "no bound")),
    "async_pipeline.collector_num_cpus": COUNT,
    "async_pipeline.evaluator_num_cpus": COUNT,
    "async_pipeline.learner_num_threads": Range(1, off=(0, "the cores the working actors leave free")),
    "async_pipeline.actor_niceness": Range(0, 19),
    "async_pipeline.collector_num_gpus": NON_NEG,
    "async_pipeline.evaluator_num_gpus": NON_NEG,
    "async_pipeline.buffer_stats_interval": INTERVAL,
    "async_pipeline.poll_interval_s": POSITIVE,
    "async_pipeline.shutdown_timeout_s": POSITIVE,
    # logger
    "logger.log_interval": INTERVAL,
    # run
    "seed": Range(0, 2**31 - 1),
}
RANGES.update({  # unizero
    "algo.embed_dim": COUNT,
    "algo.num_layers": COUNT,
    "algo.num_heads": COUNT,
    "algo.context_length": NON_NEG,
    "algo.max_blocks": Range(2),
    "algo.policy_entropy_weight": NON_NEG,
    "algo.target_update_theta": Range(0.0, 1.0, lo_open=True),
    "algo.latent_loss_weight": NON_NEG,
    "algo.reward_loss_weight": NON_NEG,
    "algo.policy_loss_weight": NON_NEG,
    "algo.value_loss_weight": NON_NEG,
    "algo.policy_ls_eps_start": Range(0.0, 1.0, hi_open=True),
    "algo.policy_ls_eps_end": Range(0.0, 1.0, hi_open=True),
    "algo.policy_ls_eps_decay_steps": COUNT,
})
RANGES.update({  # sampled_muzero / sampled_efficientzero
    "algo.num_samples": COUNT,
    "algo.proposal_temperature": POSITIVE,
    "algo.widened_fraction": PROBABILITY,
    "algo.widen_factor": Range(1.0),
    "algo.fixed_sigma": Range(0, lo_open=True, off=(0, "learned")),
})


def _numeric_leaves(cfg, prefix: str = ""):
    """``(dotted key, value)`` of every int / float field of a config dataclass."""
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        key = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(value):
            yield from _numeric_leaves(value, f"{key}.")
        elif hints[f.name] in (int, float):
            yield key, value


def check_ranges(cfg) -> None:
    """Raise a ``ConfigError`` for the first value outside its range or rule.

    Examples:
        >>> from torchrl_muzero.trainers.config import load_config
        >>> load_config({"train": {"replay_ratio": -1}})
        Traceback (most recent call last):
        ...
        torchrl_muzero.errors.ConfigError: config key 'train.replay_ratio' must be >= 0, got -1.0.
    """
    for key, value in _numeric_leaves(cfg):
        rule = RANGES.get(key)
        if rule is None:
            raise ConfigError(f"config key '{key}' has no range in config_ranges.RANGES (a bug: add one).")
        if not rule.allows(value):
            raise ConfigError(f"config key '{key}' must be {rule.describe()}, got {value!r}.")
    _check_rules(cfg)


def _check_algo(cfg) -> None:
    """``algo.name`` is registered, and no ``algo.*`` key of another algorithm was changed."""
    import dataclasses

    from torchrl_muzero.algorithms import get_algorithm
    from torchrl_muzero.algorithms.registry import Algorithm

    _NO_MEMORY = Algorithm.__dataclass_fields__["acting_memory"].default
    algo = get_algorithm(cfg.algo.name)  # an unknown name lists the known ones
    defaults = type(cfg.algo)()
    for f in dataclasses.fields(cfg.algo):
        if f.name == "name" or f.name in algo.config_keys:
            continue
        value = getattr(cfg.algo, f.name)
        if value != getattr(defaults, f.name):
            from torchrl_muzero.algorithms import algorithm_names, get_algorithm as lookup

            owners = [n for n in algorithm_names() if f.name in lookup(n).config_keys]
            raise ConfigError(
                f"config key 'algo.{f.name}' ({value!r}) is a setting of {' / '.join(owners) or 'no algorithm'}, "
                f"not of algo={algo.name}, which would ignore it; drop it or choose algo={owners[0] if owners else '...'}."
            )
    if cfg.env.kind == "board" and algo.acting_memory is not _NO_MEMORY:
        raise ConfigError(
            f"config key 'algo.name' is {algo.name!r}, which acts from per-env history, and env.kind is 'board': "
            "acting from history is for one-player envs; choose algo=muzero (or another algorithm) for board games."
        )


def _check_rules(cfg) -> None:
    """The rules that tie keys together, or that a range cannot say."""
    _check_algo(cfg)
    ap, t = cfg.async_pipeline, cfg.train
    if t.frames_per_batch % cfg.env.num_envs:
        n = cfg.env.num_envs
        lower, upper = max(n, t.frames_per_batch // n * n), (t.frames_per_batch // n + 1) * n
        raise ConfigError(
            f"config key 'train.frames_per_batch' must be a multiple of env.num_envs={n} (a collect of the "
            f"serial and parallel pools steps all envs together; env.pool=async keeps the rule so that a pool "
            f"switch keeps the batch), got {t.frames_per_batch}: use {lower} or {upper}."
        )
    if ap.backend == "local" and ap.max_collect_inflight not in (0, ap.num_collector_actors):
        # torchrl's multi-process collectors keep exactly one collect in flight per worker
        raise ConfigError(
            f"config key 'async_pipeline.max_collect_inflight' must be 0 or num_collector_actors "
            f"({ap.num_collector_actors}) with backend=local, got {ap.max_collect_inflight}: each collector worker "
            "has exactly one collect in flight; use backend=ray (any value from 1 to num_collector_actors) or fewer "
            "collector actors."
        )
    if ap.backend == "ray" and ap.max_collect_inflight > ap.num_collector_actors:
        raise ConfigError(
            f"config key 'async_pipeline.max_collect_inflight' must be 0 (num_collector_actors) or in "
            f"[1, {ap.num_collector_actors}] (num_collector_actors), got {ap.max_collect_inflight}."
        )
    sync_round = ap.backend == "ray" and ap.collector == "multi_sync"
    if sync_round and ap.max_collect_inflight not in (0, ap.num_collector_actors):
        # a multi_sync round starts one collect on every actor at once, which a smaller bound would contradict
        raise ConfigError(
            f"config key 'async_pipeline.max_collect_inflight' must be 0 or num_collector_actors "
            f"({ap.num_collector_actors}) with collector=multi_sync, got {ap.max_collect_inflight}: each round "
            "starts one collect on every collector actor; use collector=multi_async to bound the collects in flight."
        )
    if ap.collect_ahead_frames >= 0:
        if ap.collector == "multi_sync":
            raise ConfigError(
                f"config key 'async_pipeline.collect_ahead_frames' is {ap.collect_ahead_frames}, which bounds "
                "collector=multi_async; multi_sync already collects each round when the driver asks for it "
                "(use -1, or collector=multi_async)."
            )
    if ap.ray_local_mode:
        raise ConfigError(
            "config key 'async_pipeline.ray_local_mode' is true, but Ray (2.60) no longer has a local mode "
            "(ray.init(local_mode=True) raises); debug with async_pipeline.backend=local, which runs the same "
            "collectors as local processes, or async_pipeline.enabled=false (one process)."
        )
    schedule = t.temperature_schedule
    if not schedule:
        raise ConfigError("config key 'train.temperature_schedule' must hold at least one [until_progress, multiplier] "
                     "pair, got [].")
    last = 0.0
    for i, pair in enumerate(schedule):
        ok = isinstance(pair, (list, tuple)) and len(pair) == 2 and all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in pair)
        if not ok or not (last < float(pair[0]) <= 1.0) or float(pair[1]) < 0:
            raise ConfigError(
                f"config key 'train.temperature_schedule' must be a list of [until_progress, multiplier] pairs with "
                f"until_progress increasing in (0, 1] and multiplier >= 0; entry {i} is {pair!r}."
            )
        last = float(pair[0])
    for key in ("env.name", "env.id"):
        section, leaf = key.split(".")
        value = getattr(getattr(cfg, section), leaf)
        if not value.strip() or (key == "env.name" and ("/" in value or value in (".", ".."))):
            raise ConfigError(f"config key '{key}' must be a non-empty name{' without /' if key == 'env.name' else ''}, "
                         f"got {value!r}.")
    _check_env_pool(cfg)


def _check_env_pool(cfg) -> None:
    """``env.pool`` (and its older spelling ``env.parallel``) batch Atari games only."""
    env = cfg.env
    if env.parallel and env.pool not in ("serial", "parallel"):
        raise ConfigError(
            f"config key 'env.parallel' is true (the older spelling of env.pool=parallel) but env.pool is "
            f"{env.pool!r}: drop env.parallel."
        )
    pool = effective_pool(env)
    if pool != "serial" and env.kind != "atari":
        raise ConfigError(
            f"config key 'env.pool' is {pool!r}, but only Atari envs (env.kind='atari') can be batched otherwise "
            f"than in-process; env.kind is {env.kind!r}: use env.pool=serial."
        )
    ap = cfg.async_pipeline
    if pool == "async" and ap.enabled and ap.backend == "ray":
        # the Ray collector actors step their env as one batch (trainers/ray_actors.py); the collector
        # that steps the ready games (ReadyStepCollector) runs in the sync trainer and the local workers
        raise ConfigError(
            "config key 'env.pool' is 'async' with async_pipeline.backend='ray', which steps every game of a "
            "batch together; allowed with backend=ray: env.pool=serial or parallel (or backend=local for async)."
        )
