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
