"""The training configuration: one typed schema, checked before anything starts.

Hydra composes the YAML files of ``sota-implementations/muzero/config``; the
result (or a plain dict from a user's script) goes through
:func:`load_config`, which rejects unknown keys, wrong types and values out
of range (:mod:`~torchrl_muzero.trainers.config_ranges`) with a message that
names the dotted key, so a typo fails at start instead of silently using a
default.
"""
from __future__ import annotations

import dataclasses
import difflib
import typing
from dataclasses import dataclass, field
from typing import Any, Optional

from torchrl_muzero.errors import ConfigError  # re-exported: users import it from here

__all__ = ["ConfigError", "TrainConfig", "load_config", "check_key", "config_to_dict"]


@dataclass
class EnvConfig:
    """Which environment, and how it is batched and preprocessed."""

    name: str = "CartPole"
    kind: str = "gym"  # "gym" (vector observations), "atari", "board" (two-player: id TicTacToe), "game" (2048, memory_len, gamble)
    # or "dmc" (DeepMind Control from state, id '<domain>-<task>', e.g. cartpole-swingup; the [dmc] extra)
    id: str = "CartPole-v1"
    num_envs: int = 8  # envs stepped together by one collector (B roots per search)
    # Atari: how one collector's games are batched: serial (in-process SerialEnv), parallel (ParallelEnv, one
    # process per game) or async (torchrl's AsyncEnvPool, guarded: one process per game, shared-memory exchange)
    pool: str = "serial"  # serial | parallel | async (Atari; async: ReadyStepCollector steps the ready games)
    parallel: bool = False  # older spelling of pool=parallel (kept for existing configs and checkpoints)
    max_episode_steps: int = 0  # 0: the env's own limit
    # atari preprocessing (kind == "atari")
    frame_skip: int = 4
    frame_stack: int = 4
    screen_size: int = 96
    grayscale: bool = True
    noop_max: int = 30
    sticky_action_prob: float = 0.25
    terminal_on_life_loss: bool = True  # for training only; evaluation plays whole games
    # board games (kind == "board"): self-play games start after 0..k uniformly random moves
    random_opening_moves: int = 0
    # env.id == "memory_len" (kind == "game"): steps between the cue and the query
    memory_length: int = 10
    # env.id == "gamble" (kind == "game"): what passing earns, and the bet's chance of a won coin
    safe_reward: float = 0.2
    win_probability: float = 0.5
    # DeepMind Control (kind == "dmc"): physics control steps per agent step, rewards summed
    action_repeat: int = 2


@dataclass
class AlgoConfig:
    """Which member of the MuZero family (``algo=<name>``, LightZero's names) and its own settings.

    Each key below belongs to the algorithms its comment names (torchrl_muzero/algorithms/, ``config_keys``);
    setting a key that the chosen algorithm does not read is an error.
    """

    name: str = "muzero"  # muzero | efficientzero | gumbel_muzero | stochastic_muzero | muzero_context
    # | muzero_rnn_full_obs | unizero | sampled_muzero | sampled_efficientzero | sampled_unizero
    # efficientzero: value-prefix LSTM, reset every lstm_horizon_len steps (training and search)
    lstm_horizon_len: int = 5
    lstm_hidden_size: int = 64
    # the paper's off-policy correction: older data bootstraps sooner, from the stored root value
    off_policy_correction: bool = False
    correction_age_scale: float = 100.0  # learner updates of age per step of horizon lost
    # gumbel_muzero (mctx's defaults)
    max_num_considered_actions: int = 16
    gumbel_scale: float = 1.0
    value_scale: float = 0.1
    maxvisit_init: float = 50.0
    policy_loss: str = "cross_entropy"  # cross_entropy | kl (LightZero's Gumbel uses kl: same gradient)
    # stochastic_muzero
    chance_space_size: int = 4
    afterstate_value_loss_weight: float = 0.25
    chance_loss_weight: float = 1.0
    # 0 by default: on from the first update it collapsed the chance codes to one (docs/variants.md)
    commitment_loss_weight: float = 0.0
    # muzero_context: acting re-grounds the root from the observation every context_length_init steps
    # and rolls it forward with the dynamics in between (LightZero's Pong config: 4; 1 is MuZero).
    # muzero_rnn_full_obs: acting zeroes each env's GRU state every context_length_init steps
    # (LightZero's H_infer; its Pong config's context_length=4 never reaches the model, which uses 5)
    context_length_init: int = 4
    # muzero_rnn_full_obs: GRU units of the dynamics and prediction (LightZero's Pong config: 4096)
    rnn_hidden_size: int = 64
    # unizero, sampled_unizero (LightZero's CartPole defaults): the transformer world model
    embed_dim: int = 64
    num_layers: int = 2
    num_heads: int = 2
    context_length: int = 4  # history steps [z, a] the root sees (0: the current observation alone)
    max_blocks: int = 10  # latents one sequence holds: >= buffer.num_unroll_steps + 1 and >= context_length + 2
    position: str = "rope"  # rope | absolute
    latent_norm: str = "simnorm"  # simnorm | layernorm
    # true: the value, reward and policy heads' last layer starts at zero (learned CartPole 2-4x slower;
    # false: GPT-initialised, docs/variants.md)
    zero_init_heads: bool = False
    policy_entropy_weight: float = 5e-3
    target_update_theta: float = 0.05  # EMA rate of the target encoder, per update
    # UniZero's loss weights (LightZero hard-codes 10 / 1 / 1 / 0.5; here they are used); the loss.* weights
    # are MuZero's and an error with algo=unizero
    latent_loss_weight: float = 10.0
    # the next-latent term: mse (the paper's), cos_sim, or group_kl (per SimNorm group KL(target || prediction),
    # LightZero's choice with SimNorm latents; needs latent_norm=simnorm)
    latent_loss: str = "mse"
    reward_loss_weight: float = 1.0
    policy_loss_weight: float = 1.0
    value_loss_weight: float = 0.5
    policy_ls_eps_start: float = 0.0  # policy label smoothing, linear start -> end over the steps (0: off)
    policy_ls_eps_end: float = 0.01
    policy_ls_eps_decay_steps: int = 50_000
    # sampled_muzero / sampled_efficientzero / sampled_unizero (Hubert et al. 2021): K actions drawn at each node,
    # searched as slots
    num_samples: int = 20  # K (LightZero's Pendulum configs: 20)
    sampled_prior: str = "paper"  # paper: (beta_hat / beta) * pi over the slots | uniform: 1 / K (LightZero's)
    proposal_temperature: float = 1.0  # beta = pi at this temperature (1: the policy itself)
    sample_with_replacement: bool = False  # discrete actions: i.i.d. draws instead of K distinct legal actions
    # EfficientZero V2's proposal: this share of the K draws from pi with its scale times widen_factor
    widened_fraction: float = 0.0
    widen_factor: float = 3.0
    fixed_sigma: float = 0.0  # the tanh-normal's scale: 0 learned, > 0 fixed (LightZero's fixed_sigma_value: 0.3)
    # puct: MuZero's search over the K slots; gumbel: EfficientZero V2's (Gumbel noise, Sequential Halving over
    # the sampled root candidates, the improved policy as target; the gumbel_muzero keys above apply)
    sampled_search: str = "puct"
    # reanalyze: resample (draw new root candidates, store them with the new target) | keep (search the stored
    # candidates again, store the new visits over them)
    reanalyze_candidates: str = "resample"


@dataclass
class ModelConfig:
    kind: str = "mlp"  # "mlp" or "resnet"
    latent_dim: int = 64
    hidden_dim: int = 64
    num_layers: int = 1
    value_support_size: int = 10
    reward_support_size: int = 10
    channels: int = 64
    num_blocks: int = 1
    downsample: bool = True


@dataclass
class MCTSSection:
    num_simulations: int = 25
    discount: float = 0.997
    pb_c_base: float = 19652.0
    pb_c_init: float = 1.25
    dirichlet_alpha: float = 0.25
    dirichlet_fraction: float = 0.25
    temperature: float = 1.0
    backend: str = "auto"
    # fused C++ search's network arithmetic: exact (bit-identical on every CPU) | fma (AVX2 + FMA,
    # ~1.1-1.3x faster network, a few ulps off; no FMA on the CPU: the exact path, with a warning)
    kernel_precision: str = "exact"


@dataclass
class LossConfig:
    value_loss_weight: float = 0.25
    reward_loss_weight: float = 1.0
    policy_loss_weight: float = 1.0
    consistency_loss_weight: float = 2.0
    projection_dim: int = 256  # EfficientZero's SimSiam heads (only with the consistency loss)
    projection_hidden_dim: int = 256
    prediction_hidden_dim: int = 64


@dataclass
class OptimConfig:
    lr: float = 3e-3
    weight_decay: float = 1e-4
    max_grad_norm: float = 10.0  # 0: no clipping
    batch_size: int = 256


@dataclass
class BufferConfig:
    capacity: int = 100_000
    num_unroll_steps: int = 5
    td_steps: int = 10
    reanalyze_ratio: float = 0.0
    alpha: float = 0.6
    beta: float = 0.4
    beta_anneal_steps: int = 10_000
    save_with_checkpoint: bool = True


@dataclass
class TrainSection:
    total_env_steps: int = 100_000
    max_wall_time_s: float = 0.0  # 0: no limit
    replay_ratio: float = 0.25  # learner updates per collected env step
    train_start_after_envsteps: int = 1_000
    frames_per_batch: int = 256  # env steps per collect (all envs of one collector)
    target_update_interval: int = 100  # learner steps between target-model refreshes
    stop_return: float = 0.0  # stop once an evaluation reaches it (0: never)
    checkpoint_interval: int = 1000  # learner steps between periodic checkpoints (0: off)
    # evaluated versions whose ckpt/model_v{version}.pt is kept: the last N evaluated, plus the best one
    keep_eval_checkpoints: int = 5
    temperature_schedule: list = field(default_factory=lambda: [[0.5, 1.0], [0.75, 0.5], [1.0, 0.25]])


@dataclass
class EvalConfig:
    num_episodes: int = 5
    interval: int = 500  # learner steps between evaluations (sync); async: as soon as the evaluator is free
    num_simulations: int = 0  # 0: same as mcts.num_simulations


@dataclass
class AsyncPipelineConfig:
    """The knobs of LightZero's async segment pipeline (seed, section 4.2).

    The seed's names, defaults and meanings; ``sota-implementations/muzero/config/config.yaml``
    says for each knob where ours extends the seed's.
    """

    enabled: bool = True
    # where collectors / evaluators run: "local" processes (torchrl's multi-process collectors) or
    # "ray" actors (trainers/ray_backend.py; pip install torchrl_muzero[ray]), on one machine or a cluster
    backend: str = "local"
    # "multi_async" hands the driver one worker's batch at a time, "multi_sync" one batch of all workers
    # at once (local: torchrl MultiAsyncCollector / MultiSyncCollector; ray: rounds of one collect per actor)
    collector: str = "multi_async"
    num_collector_actors: int = 1
    num_evaluator_actors: int = 1
    max_collect_inflight: int = 0  # 0: num_collector_actors
    max_eval_inflight: int = 1
    max_train_chunk_steps: int = 4
    weight_sync_interval: int = 1
    # the most updates collectors may lag behind the learner; reaching it forces a publish
    # (0: publish whenever the learner moved, -1: no bound beyond weight_sync_interval)
    max_policy_lag: int = 0
    max_train_budget_queue_size: int = 0  # 0: 2 * num_collector_actors
    # just-in-time collection (trainers/collect_pacing.py): the collectors run at most this many env
    # steps ahead of the data the learner has trained on (-1: no bound, collect as fast as they can;
    # otherwise at least num_collector_actors * train.frames_per_batch)
    collect_ahead_frames: int = -1
    eval_at_start: bool = False
    collector_num_cpus: int = 1
    evaluator_num_cpus: int = 1
    # torch threads of the driver's learner; 0: the cores the working collectors / evaluators
    # leave free, re-decided before every update (see trainers/cpu_budget.py)
    learner_num_threads: int = 0
    # collector / evaluator processes run this much nicer than the driver, so that on a machine
    # with fewer cores than busy threads the learner keeps its cores (0: same priority)
    actor_niceness: int = 19
    collector_num_gpus: float = 0.0
    evaluator_num_gpus: float = 0.0
    buffer_stats_interval: int = 100
    poll_interval_s: float = 0.1
    shutdown_timeout_s: float = 30.0
    # Ray backend only
    address: str = ""  # "": start a Ray instance for this run; "HOST:PORT" / "auto": join a running cluster
    ray_local_mode: bool = False  # the seed's debugging mode; Ray >= 2.10 has removed it (rejected at start)
    restart_dead_actors: bool = False  # a collector or evaluator actor that died is replaced; the run goes on


@dataclass
class LoggerConfig:
    backend: str = "csv"  # csv | tensorboard | wandb | none
    project: str = "torchrl_muzero"
    progress_bar: bool = True
    log_interval: int = 50  # learner steps between metric rows


@dataclass
class TrainConfig:
    """The whole configuration of a run (see the module docstring; build it with :func:`load_config`).

    Examples:
        >>> from torchrl_muzero.trainers import TrainConfig
        >>> cfg = TrainConfig()
        >>> cfg.env.id, cfg.async_pipeline.max_train_chunk_steps
        ('CartPole-v1', 4)
    """

    env: EnvConfig = field(default_factory=EnvConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    mcts: MCTSSection = field(default_factory=MCTSSection)
    loss: LossConfig = field(default_factory=LossConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    buffer: BufferConfig = field(default_factory=BufferConfig)
    train: TrainSection = field(default_factory=TrainSection)
    eval: EvalConfig = field(default_factory=EvalConfig)
    async_pipeline: AsyncPipelineConfig = field(default_factory=AsyncPipelineConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    seed: int = 0
    device: str = "auto"  # learner device: auto | cpu | cuda | cuda:N
    run_dir: Optional[str] = None
    resume: Optional[str] = None


_KNOWN_CHOICES = {
    "env.kind": ("gym", "atari", "board", "game", "dmc"),
    "env.pool": ("serial", "parallel", "async"),
    "model.kind": ("mlp", "resnet"),
    "algo.latent_loss": ("mse", "cos_sim", "group_kl"),
    "algo.policy_loss": ("cross_entropy", "kl"),
    "algo.sampled_prior": ("paper", "uniform"),
    "algo.sampled_search": ("puct", "gumbel"),
    "algo.reanalyze_candidates": ("resample", "keep"),
    "mcts.backend": ("auto", "torch", "cpp"),
    "mcts.kernel_precision": ("exact", "fma"),
    "logger.backend": ("csv", "tensorboard", "wandb", "none"),
    "async_pipeline.backend": ("local", "ray"),
    "async_pipeline.collector": ("multi_async", "multi_sync"),
}


def _check_type(path: str, value: Any, annotation: Any) -> Any:
    origin = typing.get_origin(annotation)
    if origin is typing.Union:  # Optional[X]
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        if value is None:
            return None
        return _check_type(path, value, args[0])
    if annotation is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if annotation in (int, float, str, bool):
        if isinstance(value, annotation) and not (annotation is int and isinstance(value, bool)):
            return value
        raise ConfigError(
            f"config key '{path}' must be of type {annotation.__name__}, got {value!r} ({type(value).__name__})."
        )
    if annotation in (list, "list") or origin is list:
        if isinstance(value, (list, tuple)):
            return list(value)
        raise ConfigError(f"config key '{path}' must be a list, got {value!r}.")
    return value


# LightZero keys a migrating user will pass that have no counterpart here on purpose: the error says
# why instead of only listing the valid keys (a key that silently did nothing would mislead).
_DELIBERATELY_ABSENT = {
    "algo.kv_cache_clear_interval": (
        "UniZero keeps no KV cache between searches here (each search builds its own from the raw "
        "history window with the current weights; docs/variants.md, 'Where the history lives'), "
        "so there is nothing to clear: remove the key."
    ),
}


def _unknown_key(names: list[str], key: str, prefix: str) -> ConfigError:
    why = _DELIBERATELY_ABSENT.get(f"{prefix}{key}")
    if why is not None:
        return ConfigError(f"config key '{prefix}{key}' is not used by torchrl_muzero: {why}")
    close = difflib.get_close_matches(str(key), names, n=1)
    hint = f" Did you mean '{prefix}{close[0]}'?" if close else ""
    return ConfigError(f"unknown config key '{prefix}{key}'.{hint} Valid keys here: {', '.join(names)}.")


def check_key(dotted: str) -> None:
    """Raise :class:`ConfigError` (with the closest valid key) if ``dotted`` names no config key.

    Examples:
        >>> from torchrl_muzero.trainers.config import check_key
        >>> check_key("mcts.num_simulations")
        >>> check_key("mcts.num_sims")
        Traceback (most recent call last):
        ...
        torchrl_muzero.errors.ConfigError: unknown config key 'mcts.num_sims'. Did you mean 'mcts.num_simulations'? Valid keys here: num_simulations, discount, pb_c_base, pb_c_init, dirichlet_alpha, dirichlet_fraction, temperature, backend, kernel_precision.
    """
    cls, prefix = TrainConfig, ""
    parts = dotted.split(".")
    for i, part in enumerate(parts):
        if cls is None:
            raise ConfigError(f"config key '{prefix[:-1]}' is a value, not a section: '{dotted}' does not exist.")
        names = [f.name for f in dataclasses.fields(cls)]
        if part not in names:
            raise _unknown_key(names, part, prefix)
        annotation = typing.get_type_hints(cls)[part]
        cls = annotation if dataclasses.is_dataclass(annotation) else None
        prefix += f"{part}."


def _build(cls, data: Any, prefix: str):
    if dataclasses.is_dataclass(data):
        data = config_to_dict(data)
    if not isinstance(data, dict):
        raise ConfigError(f"config section '{prefix or '<root>'}' must be a mapping, got {data!r}.")
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls)]
    kwargs = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if key not in names:
            raise _unknown_key(names, key, prefix)
        annotation = hints[key]
        if dataclasses.is_dataclass(annotation):
            kwargs[key] = _build(annotation, value, f"{path}.")
        else:
            value = _check_type(path, value, annotation)
            choices = _KNOWN_CHOICES.get(path)
            if choices is not None and value not in choices:
                close = difflib.get_close_matches(str(value), [str(c) for c in choices], n=1)
                hint = f" Did you mean {close[0]!r}?" if close else ""
                raise ConfigError(f"config key '{path}' must be one of {choices}, got {value!r}.{hint}")
            kwargs[key] = value
    return cls(**kwargs)


def plain_config(data: Any) -> Any:
    """A config as plain containers: ``None`` -> ``{}``, an omegaconf ``DictConfig`` resolved, a
    :class:`TrainConfig` (or any dataclass) as its dict; anything else as it is (``load_config`` checks it)."""
    if data is None:
        return {}
    if hasattr(data, "_content") or type(data).__name__ == "DictConfig":  # omegaconf
        from omegaconf import OmegaConf

        return OmegaConf.to_container(data, resolve=True)
    if dataclasses.is_dataclass(data):
        return config_to_dict(data)
    return data


def load_config(data: Any = None, **overrides: Any) -> TrainConfig:
    """Build a :class:`TrainConfig` from a (nested) mapping, a DictConfig or a dataclass.

    ``overrides`` take dotted keys, e.g. ``load_config(cfg, **{"train.replay_ratio": 0.5})``.

    Examples:
        >>> from torchrl_muzero.trainers.config import load_config
        >>> cfg = load_config({"mcts": {"num_simulations": 10}})
        >>> cfg.mcts.num_simulations, cfg.env.id
        (10, 'CartPole-v1')
        >>> load_config({"mcts": {"num_simulation": 10}})
        Traceback (most recent call last):
        ...
        torchrl_muzero.errors.ConfigError: unknown config key 'mcts.num_simulation'. Did you mean 'mcts.num_simulations'? Valid keys here: num_simulations, discount, pb_c_base, pb_c_init, dirichlet_alpha, dirichlet_fraction, temperature, backend, kernel_precision.
    """
    data = _deep_copy(plain_config(data))
    data.pop("hydra", None)
    for dotted, value in overrides.items():
        node = data
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    cfg = _build(TrainConfig, data, "")
    from torchrl_muzero.trainers.config_ranges import check_ranges  # it imports the algorithms: on first use

    check_ranges(cfg)
    return cfg


def _deep_copy(d):
    if isinstance(d, dict):
        return {k: _deep_copy(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_deep_copy(v) for v in d]
    return d


def config_to_dict(cfg) -> dict:
    """A plain nested dict of a config dataclass (for logs and checkpoints)."""
    return dataclasses.asdict(cfg)
