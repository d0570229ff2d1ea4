"""algo=unizero's builders: config checks, the loss weights from algo.*, acting without history at context 0."""
import pytest
import torch
from tensordict import TensorDict

from pipeline_utils import tiny_config
from torchrl_muzero.algorithms import get_algorithm
from torchrl_muzero.trainers import ConfigError, load_config
from torchrl_muzero.trainers.builders import build_loss, build_model, build_policy


def _cfg(tmp_path, **overrides):
    return load_config(tiny_config(tmp_path, **{"algo.name": "unizero", "algo.embed_dim": 16, **overrides}))


def test_loss_weights_come_from_algo_and_muzero_weights_are_refused(tmp_path):
    cfg = _cfg(tmp_path, **{"algo.value_loss_weight": 0.7, "algo.latent_loss_weight": 3.0})
    loss = build_loss(cfg, build_model(cfg, (4,), 2))
    assert (loss.value_loss_weight, loss.latent_loss_weight) == (0.7, 3.0)
    cfg = _cfg(tmp_path, **{"loss.value_loss_weight": 0.7})
    with pytest.raises(ConfigError, match="algo.value_loss_weight"):
        build_loss(cfg, build_model(cfg, (4,), 2))
    cfg = _cfg(tmp_path, **{"loss.consistency_loss_weight": 1.0})
    with pytest.raises(ConfigError, match="algo.latent_loss_weight"):
        build_loss(cfg, build_model(cfg, (4,), 2))
    cfg = _cfg(tmp_path, **{"loss.consistency_loss_weight": 0.0})  # an env group's "SimSiam off" (MemoryLen)
    assert build_loss(cfg, build_model(cfg, (4,), 2)).latent_loss_weight == 10.0


def test_max_blocks_must_hold_a_training_sample(tmp_path):
    with pytest.raises(ConfigError, match="algo.max_blocks"):
        build_model(_cfg(tmp_path, **{"algo.max_blocks": 3, "algo.context_length": 1}), (4,), 2)


def test_zero_init_heads_comes_from_algo(tmp_path):
    heads = lambda m: (m.value_head[-1].weight, m.reward_head[-1].weight, m.policy_head[-1].weight)  # noqa: E731
    assert all(torch.count_nonzero(w) > 0 for w in heads(build_model(_cfg(tmp_path), (4,), 2)))  # GPT init
    model = build_model(_cfg(tmp_path, **{"algo.zero_init_heads": True}), (4,), 2)
    assert all(torch.count_nonzero(w) == 0 for w in heads(model))
    with pytest.raises(ConfigError, match="algo.zero_init_heads"):
        _cfg(tmp_path, **{"algo.zero_init_heads": "often"})


def test_context_length_zero_acts_from_the_current_observation(tmp_path):
    cfg = _cfg(tmp_path, **{"algo.context_length": 0})
    assert get_algorithm("unizero").acting_memory(cfg) is None
    model = build_model(cfg, (4,), 2)
    policy = build_policy(cfg, model, None, generator=torch.Generator().manual_seed(0))
    assert policy.memory is None
    obs = torch.randn(3, 4)
    out = policy(TensorDict({"observation": obs}, [3]))
    again = build_policy(cfg, model, None, generator=torch.Generator().manual_seed(0))
    search = again.search_fn(model, obs, again.config, add_noise=True, generator=torch.Generator().manual_seed(0))
    assert torch.equal(out["search_policy"], search.search_policy)


def test_cartpole_unizero_takes_its_own_settings():
    """``env=CartPole algo=unizero`` composes env_algo/CartPole_unizero.yaml (lr 1e-3, group_kl latent loss,
    K = 9, visit temperature 1.0 for the first quarter: the settings every seed solved with, docs/variants.md);
    MuZero keeps CartPole's; any key still overrides."""
    from pathlib import Path

    from torchrl_muzero.trainers.hydra_entry import compose_config

    config_dir = str(Path(__file__).resolve().parents[1] / "sota-implementations" / "muzero" / "config")
    uni = load_config(compose_config(config_dir, ["algo=unizero"]))
    mu = load_config(compose_config(config_dir, ["algo=muzero"]))
    assert uni.optim.lr == pytest.approx(1e-3) and mu.optim.lr == pytest.approx(3e-3)
    assert uni.algo.latent_loss == "group_kl" and uni.algo.latent_norm == "simnorm"
    assert uni.buffer.num_unroll_steps == 9 and mu.buffer.num_unroll_steps == 5
    assert uni.train.temperature_schedule == [[0.25, 4.0], [1.0, 1.0]]
    assert mu.train.temperature_schedule == [[1.0, 1.0]]
    back = load_config(compose_config(config_dir, ["algo=unizero", "optim.lr=0.003", "algo.latent_loss=mse"]))
    assert back.optim.lr == pytest.approx(3e-3) and back.algo.latent_loss == "mse"
    algo = get_algorithm("unizero")  # the loss the registry builds reads the key
    assert algo.build_loss(uni, algo.build_model(uni, (4,), 2)).latent_loss == "group_kl"


def test_pong_takes_lightzeros_unizero_segment_settings_and_the_model_reads_one_rgb_frame():
    """``env=Pong algo=unizero`` composes env_algo/Pong_unizero.yaml (LightZero's atari_unizero_segment_config:
    one RGB 64x64 frame per token, embed 768, 8 heads, K = 10); other algorithms keep Pong's 4 stacked gray 96x96
    frames, and a command-line key still wins."""
    from pathlib import Path

    from torchrl_muzero.envs import make_env
    from torchrl_muzero.trainers.hydra_entry import compose_config

    config_dir = str(Path(__file__).resolve().parents[1] / "sota-implementations" / "muzero" / "config")
    cfg = load_config(compose_config(config_dir, ["env=Pong", "algo=unizero", "env.num_envs=1"]))
    assert (cfg.env.frame_stack, cfg.env.screen_size, cfg.env.grayscale) == (1, 64, False)
    assert (cfg.algo.embed_dim, cfg.algo.num_heads, cfg.buffer.num_unroll_steps) == (768, 8, 10)
    muzero = load_config(compose_config(config_dir, ["env=Pong", "algo=muzero"]))
    assert (muzero.env.frame_stack, muzero.env.screen_size, muzero.env.grayscale) == (4, 96, True)
    assert compose_config(config_dir, ["env=Pong", "algo=unizero", "env.screen_size=96"]).env.screen_size == 96

    env = make_env(cfg.env, num_envs=1, seed=0)
    try:
        obs = env.reset()["observation"]
    finally:
        env.close()
    assert obs.shape == (1, 3, 64, 64) and obs.dtype == torch.uint8
    cfg.algo.embed_dim, cfg.algo.num_heads, cfg.model.channels = 16, 2, 8  # the shape path, small
    model = build_model(cfg, tuple(obs.shape[1:]), 6)
    assert model.search_root(obs).value.shape == (1,)
