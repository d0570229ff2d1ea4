"""Per-env acting memory (torchrl primers) and ``algo=muzero_context``'s rolled-forward root latent."""
import pytest
import torch
from tensordict import TensorDict
from torchrl.collectors import Collector

from torchrl_muzero.envs import make_env
from torchrl_muzero.mcts import MCTSConfig, MCTSPolicy
from torchrl_muzero.mcts.acting_memory import ContextLatentMemory, with_acting_memory
from torchrl_muzero.modules import MuZeroMLPModel
from torchrl_muzero.trainers import ConfigError, load_config
from torchrl_muzero.trainers.config import EnvConfig

CONFIG = MCTSConfig(num_simulations=5)


def _model():
    torch.manual_seed(0)
    return MuZeroMLPModel((4,), 2, latent_dim=8, hidden_dim=16, zero_init_heads=False).eval()


def _rollout(policy, frames=96, num_envs=2, seed=0):
    """A collector batch ``[num_envs, T]`` from CartPole copies (episodes of a near-random policy end at
    different steps in different copies: partial resets)."""
    env = with_acting_memory(make_env(EnvConfig(), num_envs=num_envs, seed=seed), policy)
    collector = Collector(env, policy, frames_per_batch=frames, total_frames=frames,
                          auto_register_policy_transforms=False)
    try:
        return next(iter(collector))
    finally:
        collector.shutdown()


def test_context_length_one_is_muzero_exactly():
    model = _model()
    muzero = MCTSPolicy(model, CONFIG, generator=torch.Generator().manual_seed(3))
    context = MCTSPolicy(model, CONFIG, generator=torch.Generator().manual_seed(3), memory=ContextLatentMemory(1))
    a, b = _rollout(muzero), _rollout(context)
    assert torch.equal(a["action"], b["action"])
    assert torch.equal(a["search_policy"], b["search_policy"])
    assert torch.equal(a["root_value"], b["root_value"])
    assert (b["context_step"] == 0).all()


def test_root_is_the_observation_rolled_forward_and_regrounded_every_L_steps():
    """Replays the rollout by hand: root_t = h(o_t) when t % L == 0 (t counted from the episode start),
    else the model's step from root_{t-1} along a_{t-1}; resets of one copy do not touch the other."""
    L = 3
    model = _model()
    batch = _rollout(MCTSPolicy(model, CONFIG, generator=torch.Generator().manual_seed(0),
                                memory=ContextLatentMemory(L)), frames=120)
    done = batch["next", "done"].squeeze(-1)
    assert done.any(), "no episode ended: the reset path was not exercised"
    checked_rolled = 0
    with torch.no_grad():
        for env in range(batch.shape[0]):
            t, expected = 0, None
            for i in range(batch.shape[1]):
                row = batch[env, i]
                assert int(row["context_step"]) == t % L
                if t % L == 0:
                    expected = model.search_root(row["observation"][None])
                else:  # the memory holds the root this step searched from
                    assert torch.allclose(row["context_latent"], expected.state[0], atol=1e-6)
                    assert torch.allclose(row["context_logits"], expected.policy_logits[0], atol=1e-5)
                    checked_rolled += 1
                action = row["action"].reshape(1).long()  # make_env's CartPole takes action indices
                expected = model.search_step(expected.state, action)
                t = 0 if bool(done[env, i]) else t + 1
    assert checked_rolled > 20


def test_the_rolled_root_changes_the_search_and_the_search_leaves_the_memory_alone():
    model = _model()
    policy = MCTSPolicy(model, CONFIG, generator=torch.Generator().manual_seed(0), memory=ContextLatentMemory(4))
    B = 3
    memory = TensorDict({"context_latent": torch.rand(B, 8), "context_logits": torch.randn(B, 2),
                         "context_value": torch.randn(B), "context_step": torch.tensor([0, 1, 2])}, [B])
    td = TensorDict({"observation": torch.randn(B, 4)}, [B]).update(memory.clone())
    out = policy(td)
    assert (out.select(*memory.keys()) == memory).all()  # the input memory is not written
    assert out["next", "context_step"].tolist() == [1, 2, 3]
    # the next latent is the model's step along the action taken, from the root each row searched
    with torch.no_grad():
        root0 = model.search_root(td["observation"][:1]).state
        step = model.search_step(torch.cat([root0, memory["context_latent"][1:]]), out["action"])
    assert torch.allclose(out["next", "context_latent"], step.state, atol=1e-6)


def test_missing_primer_and_two_player_inputs_fail_with_one_clear_line():
    policy = MCTSPolicy(_model(), CONFIG, memory=ContextLatentMemory(2))
    with pytest.raises(KeyError, match="with_acting_memory"):
        policy(TensorDict({"observation": torch.randn(2, 4)}, [2]))
    with pytest.raises(ValueError, match="context_length_init must be an integer >= 1"):
        ContextLatentMemory(0)
    with pytest.raises(ConfigError, match="acts from per-env history"):
        load_config({"algo": {"name": "muzero_context"}, "env": {"kind": "board", "id": "tictactoe"}})


def test_torchrl_collector_finds_the_primer_itself():
    """``auto_register_policy_transforms=True``: torchrl asks the policy's submodules for primers."""
    policy = MCTSPolicy(_model(), CONFIG, memory=ContextLatentMemory(2))
    collector = Collector(make_env(EnvConfig(), num_envs=2), policy, frames_per_batch=8, total_frames=8,
                          auto_register_policy_transforms=True)
    try:
        batch = next(iter(collector))
    finally:
        collector.shutdown()
    assert batch["context_step"][:, 0].tolist() == [0, 0] and batch["context_step"][:, 1].tolist() == [1, 1]


def test_wrapping_is_idempotent_and_leaves_the_env_alone():
    policy = MCTSPolicy(_model(), CONFIG, memory=ContextLatentMemory(2))
    env = make_env(EnvConfig(), num_envs=2)
    wrapped = with_acting_memory(env, policy)
    assert wrapped is not env and "context_latent" not in env.reset().keys()
    assert with_acting_memory(wrapped, policy) is wrapped
    assert with_acting_memory(env, MCTSPolicy(_model(), CONFIG)) is env
    assert wrapped.reset()["context_latent"].shape == (2, 8)
