"""``algo=unizero``: UniZero (arXiv 2406.10667), a transformer world model over ``[z_0, a_0, z_1, ...]``.

* Model: :class:`~torchrl_muzero.modules.unizero.UniZeroModel` from ``algo.*``
  (LightZero's CartPole defaults: embed 64, 2 layers, 2 heads, context 4,
  RoPE, SimNorm), with an MLP encoder (``model.hidden_dim``) for vectors or a
  ResNet encoder (``model.channels / num_blocks / downsample``) for frames.
  Frames: LightZero's Pong segment config encodes one 3x64x64 RGB frame per
  token; ours encodes the env's observation as it is, so with ``env=Pong``
  one token is the 4 stacked 96x96 grayscale frames (the ResNet's input
  channels), and the history window adds ``algo.context_length`` such stacks.
* Loss: :class:`~torchrl_muzero.objectives.unizero.UniZeroLoss` with the
  ``algo.*`` weights (LightZero's 10 / 1 / 1 / 0.5), the EMA target encoder
  (``algo.target_update_theta``, stepped by the learner after every update)
  and label smoothing by ``train_iter``. The ``loss.*`` weights are MuZero's:
  changing one with ``algo=unizero`` is an error, not silently ignored.
* Acting: the root sees the env's last ``algo.context_length`` raw
  observations and actions (:class:`~torchrl_muzero.mcts.history_memory.HistoryWindowMemory`),
  encoded with the current weights every step.
* Search: MuZero's pUCT search over the model's exact per-node KV cache;
  with the C++ kernel on CPU every simulation runs in one call, the
  transformer step included (``csrc/unizero_net.h``, taken by
  ``run_rules`` for a model ``fused_unizero_weights`` accepts; others keep
  the torch step).
* Replay: MuZero's targets, with the future observations (the latent term).
  The target model's bootstrap values and the reanalyze searches start from
  the root acting builds at that position: the buffer rebuilds the same
  history window from its stored episode (``GameBuffer(root_memory=...)``).
"""
from __future__ import annotations

from torchrl_muzero.algorithms.muzero import muzero_search_config, muzero_search_fn
from torchrl_muzero.algorithms.registry import Algorithm, register

__all__ = ["UNIZERO", "UNIZERO_KEYS", "check_unizero", "unizero_loss_kwargs", "unizero_memory",
           "unizero_model_kwargs"]

UNIZERO_KEYS = ("embed_dim", "num_layers", "num_heads", "context_length", "max_blocks", "position", "latent_norm",
         "zero_init_heads", "policy_entropy_weight", "target_update_theta", "latent_loss_weight", "latent_loss",
         "reward_loss_weight", "policy_loss_weight", "value_loss_weight", "policy_ls_eps_start",
         "policy_ls_eps_end", "policy_ls_eps_decay_steps")


def check_unizero(cfg) -> None:
    """Refuse ``algo.*`` settings a UniZero model cannot hold (its context, heads and latent loss)."""
    from torchrl_muzero.errors import ConfigError

    a, K = cfg.algo, cfg.buffer.num_unroll_steps
    if a.max_blocks < K + 1:  # the training forward holds the K + 1 positions of a sample
        raise ConfigError(f"config key 'algo.max_blocks' ({a.max_blocks}) must be >= buffer.num_unroll_steps + 1 "
                          f"= {K + 1}.")
    if a.max_blocks < a.context_length + 2:  # a root window plus one search step
        raise ConfigError(f"config key 'algo.max_blocks' ({a.max_blocks}) must be >= algo.context_length + 2 "
                          f"= {a.context_length + 2}.")
    if a.latent_loss == "group_kl" and a.latent_norm != "simnorm":
        raise ConfigError(f"config key 'algo.latent_loss' is 'group_kl', a KL over SimNorm's groups, but "
                          f"algo.latent_norm is {a.latent_norm!r}; use latent_norm=simnorm or latent_loss=mse.")
    if a.embed_dim % a.num_heads:
        raise ConfigError(f"config key 'algo.embed_dim' ({a.embed_dim}) must be a multiple of algo.num_heads "
                          f"({a.num_heads}).")
    for key, options in (("position", ("rope", "absolute")), ("latent_norm", ("simnorm", "layernorm"))):
        if getattr(a, key) not in options:
            raise ConfigError(f"config key 'algo.{key}' must be one of {options}, got {getattr(a, key)!r}.")


def unizero_model_kwargs(cfg, observation_shape) -> dict:
    """:class:`~torchrl_muzero.modules.unizero.UniZeroModel`'s keyword arguments from ``algo.*`` and
    ``model.*`` (after :func:`check_unizero`): the transformer, the supports and the encoder."""
    from torchrl_muzero.modules.unizero import ResNetEncoder

    a, m = cfg.algo, cfg.model
    encoder = None
    if m.kind == "resnet":  # frames: the env's observation (Pong: 4 stacked frames) is one token
        encoder = ResNetEncoder(observation_shape, a.embed_dim, channels=m.channels, num_blocks=m.num_blocks,
                                downsample=m.downsample, latent_norm=a.latent_norm)
    elif m.kind != "mlp":
        raise ValueError(f"model.kind must be 'mlp' or 'resnet', got {m.kind!r}.")
    return dict(embed_dim=a.embed_dim, num_layers=a.num_layers, num_heads=a.num_heads,
                context_length=a.context_length, max_blocks=a.max_blocks, position=a.position,
                latent_norm=a.latent_norm, value_support_size=m.value_support_size,
                reward_support_size=m.reward_support_size, encoder=encoder, encoder_hidden_dim=m.hidden_dim,
                zero_init_heads=a.zero_init_heads)


def _model(cfg, observation_shape, num_actions: int):
    from torchrl_muzero.modules.unizero import UniZeroModel

    check_unizero(cfg)
    return UniZeroModel(observation_shape, num_actions, **unizero_model_kwargs(cfg, observation_shape))


def unizero_loss_kwargs(cfg) -> dict:
    """:class:`~torchrl_muzero.objectives.unizero.UniZeroLoss`'s keyword arguments from ``algo.*``; a
    ``loss.*`` MuZero weight set to another value is an error (UniZero's weights are ``algo.*``)."""
    from torchrl_muzero.errors import ConfigError

    defaults = type(cfg.loss)()  # the schema's defaults (LossConfig)
    for key in ("value_loss_weight", "reward_loss_weight", "policy_loss_weight", "consistency_loss_weight"):
        value = getattr(cfg.loss, key)
        # env groups switch MuZero's SimSiam term off with 0 (MemoryLen, Game2048): that asks nothing of
        # UniZero, whose latent term has its own weight, so only another non-default value is an error
        if value != getattr(defaults, key) and not (key == "consistency_loss_weight" and value == 0.0):
            target = f"algo.{key}" if key != "consistency_loss_weight" else "algo.latent_loss_weight"
            raise ConfigError(f"config key 'loss.{key}' is a MuZero weight that algo={cfg.algo.name} does not "
                              f"read; set {target} instead.")
    a = cfg.algo
    return dict(
        latent_loss_weight=a.latent_loss_weight, reward_loss_weight=a.reward_loss_weight,
        policy_loss_weight=a.policy_loss_weight, value_loss_weight=a.value_loss_weight,
        policy_entropy_weight=a.policy_entropy_weight, target_update_theta=a.target_update_theta,
        latent_loss=a.latent_loss,
        policy_ls_eps_start=a.policy_ls_eps_start, policy_ls_eps_end=a.policy_ls_eps_end,
        policy_ls_eps_decay_steps=a.policy_ls_eps_decay_steps,
    )


def _loss(cfg, model):
    from torchrl_muzero.objectives.unizero import UniZeroLoss

    return UniZeroLoss(model, **unizero_loss_kwargs(cfg))


def unizero_memory(cfg):
    """The acting memory: the last ``algo.context_length`` raw steps (``None`` at 0: the observation alone)."""
    if cfg.algo.context_length == 0:  # no history: the search starts from the current observation alone
        return None
    import torch

    from torchrl_muzero.mcts.history_memory import HistoryWindowMemory

    dtype = torch.uint8 if cfg.env.kind == "atari" else torch.float32  # the envs' observation dtypes
    return HistoryWindowMemory(cfg.algo.context_length, observation_dtype=dtype)


UNIZERO = register(
    Algorithm(
        name="unizero",
        build_model=_model,
        search_fn=muzero_search_fn,  # the KV cache is inside the model's search state
        search_config=muzero_search_config,
        build_loss=_loss,
        needs_future_observations=lambda cfg: True,  # the latent term's targets
        acting_memory=unizero_memory,
        # bootstrap values and reanalyze roots see the history acting sees (None at context 0: no history)
        buffer_kwargs=lambda cfg: {"root_memory": unizero_memory(cfg)},
        config_keys=UNIZERO_KEYS,
        summary="UniZero: transformer world model over [z, a] tokens, exact per-node KV cache, "
                "acting from the last context_length raw steps",
    )
)
