"""StochasticMuZeroResNetModel: shapes of the five functions, the search, the loss, a tiny Pong run."""
from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from pipeline_utils import live_descendants, tiny_pong_overrides
from torchrl_muzero.algorithms.stochastic_muzero import _model
from torchrl_muzero.mcts import MCTSConfig
from torchrl_muzero.mcts.stochastic import stochastic_search
from torchrl_muzero.modules import StochasticMuZeroResNetModel
from torchrl_muzero.objectives import StochasticMuZeroLoss
from torchrl_muzero.trainers.hydra_entry import compose_config

CONFIG_DIR = str(Path(__file__).resolve().parents[1] / "sota-implementations" / "muzero" / "config")
A, C, CH = 6, 4, 8
OBS = (12, 32, 32)  # 4 stacked RGB frames, small: 32 -> 2x2 latent
ATARI = (4, 96, 96)  # the real Pong observation: 96 -> 6x6 latent


def make_model(obs_shape=OBS, **kwargs) -> StochasticMuZeroResNetModel:
    torch.manual_seed(0)
    kwargs = dict(dict(channels=CH, value_support_size=5, reward_support_size=5), **kwargs)
    return StochasticMuZeroResNetModel(obs_shape, A, C, **kwargs)


def frames(B: int, obs_shape=OBS, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (B, *obs_shape), dtype=torch.uint8, generator=g)


@pytest.mark.parametrize("obs_shape, hw", [(OBS, 2), (ATARI, 6)])
def test_shapes_of_every_function(obs_shape, hw):
    model, B = make_model(obs_shape), 3
    latent_shape = (CH, hw, hw)
    assert model.latent_shape == latent_shape
    obs = frames(B, obs_shape).float()
    latent = model.represent(obs)
    assert latent.shape == (B, *latent_shape)
    assert torch.allclose(latent.flatten(1).amin(1), torch.zeros(B)) and torch.allclose(latent.flatten(1).amax(1), torch.ones(B))
    policy_logits, value_logits = model.predict(latent)
    assert policy_logits.shape == (B, A) and value_logits.shape == (B, 11)
    afterstate = model.afterstate_dynamics(latent, torch.tensor([0, 2, 5]))
    assert afterstate.shape == latent.shape
    chance_logits, q_logits = model.afterstate_prediction(afterstate)
    assert chance_logits.shape == (B, C) and q_logits.shape == (B, 11)
    code = torch.nn.functional.one_hot(torch.tensor([0, 1, 3]), C).float()
    next_latent, reward_logits = model.chance_dynamics(afterstate, code)
    assert next_latent.shape == latent.shape and reward_logits.shape == (B, 11)
    assert model.chance_encoder_logits(obs, frames(B, obs_shape, 1).float()).shape == (B, C)
    # the training API, uint8 observations included
    latent, policy_logits, value_logits = model.initial_inference(frames(B, obs_shape))
    afterstate, chance_logits, q_logits = model.afterstate_inference(latent, torch.tensor([1, 1, 4]))
    code, probs = model.encode_chance(frames(B, obs_shape), frames(B, obs_shape, 1))
    assert code.shape == probs.shape == (B, C) and torch.equal(code.detach().sum(-1), torch.ones(B))
    out = model.chance_inference(afterstate, code)
    assert [tuple(t.shape) for t in out] == [(B, *latent_shape), (B, 11), (B, A), (B, 11)]
    # MuZero's interface: phi then g with argmax sigma
    next_latent, reward_logits, _, _ = model.recurrent_inference(latent, torch.tensor([0, 1, 2]))
    assert next_latent.shape == latent.shape


def test_action_and_code_change_the_transitions():
    model = make_model().eval()
    latent = model.represent(frames(1).float()).expand(A, -1, -1, -1)
    afterstates = model.afterstate_dynamics(latent, torch.arange(A))
    assert not torch.allclose(afterstates[0], afterstates[-1])
    codes = torch.eye(C)
    next_latent, _ = model.chance_dynamics(afterstates[:1].expand(C, -1, -1, -1), codes)
    assert not torch.allclose(next_latent[0], next_latent[1])


def test_zero_init_heads_and_chance_heads_not_zeroed():
    model = make_model()
    for head in (model.reward_head, model.value_head, model.policy_head, model.afterstate_value_head):
        assert head[-1].weight.abs().sum() == 0
    assert model.chance_head[-1].weight.abs().sum() > 0
    assert model.chance_encoder[-1][-1].weight.abs().sum() > 0


def test_bad_inputs_raise():
    model = make_model()
    with pytest.raises(ValueError, match="observation_shape"):
        StochasticMuZeroResNetModel((32, 32), A, C)
    with pytest.raises(ValueError, match="chance_space_size"):
        StochasticMuZeroResNetModel(OBS, A, 0)
    with pytest.raises(ValueError, match="latents of shape"):
        model.afterstate_inference(torch.zeros(2, CH, 3, 3), torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="float codes"):
        model.chance_inference(torch.zeros(2, CH, 2, 2), torch.zeros(2, C + 1))
    with pytest.raises(ValueError, match="encode_chance"):
        model.encode_chance(frames(2), frames(3))


def test_search_runs_and_its_policy_covers_the_actions():
    model = make_model(ATARI).eval()
    out = stochastic_search(model, frames(2, ATARI), MCTSConfig(num_simulations=8, backend="torch"))
    assert out.visit_counts.shape == (2, A) and out.visit_counts.sum(-1).tolist() == [8, 8]
    assert out.search_policy.shape == (2, A)
    assert torch.allclose(out.search_policy.sum(-1), torch.ones(2))
    assert out.tree.num_actions == A + C
    assert bool(out.tree.embeddings["is_chance"][:, 1:].any())  # chance nodes were expanded
    assert out.tree.embeddings["latent"].shape[2:] == model.latent_shape


def test_search_with_the_default_backend():
    model = make_model().eval()
    out = stochastic_search(model, frames(3), MCTSConfig(num_simulations=6))
    assert out.search_policy.shape == (3, A) and out.visit_counts.sum(-1).tolist() == [6, 6, 6]


def _batch(B: int, K: int, obs_shape=OBS) -> TensorDict:
    g = torch.Generator().manual_seed(1)
    return TensorDict(
        {
            "observation": torch.randint(0, 256, (B, K + 1, *obs_shape), dtype=torch.uint8, generator=g),
            "observation_mask": torch.ones(B, K + 1, dtype=torch.bool),
            "action": torch.randint(A, (B, K + 1), generator=g),
            "target_reward": torch.randn(B, K + 1, generator=g),
            "target_value": 3 * torch.randn(B, K + 1, generator=g),
            "target_policy": torch.softmax(torch.randn(B, K + 1, A, generator=g), -1),
            "mask": torch.ones(B, K + 1, dtype=torch.bool),
            "policy_mask": torch.ones(B, K + 1, dtype=torch.bool),
        },
        batch_size=[B, K + 1],
    )


@pytest.mark.parametrize("consistency", [0.0, 2.0])
def test_loss_backpropagates_into_the_chance_encoder(consistency):
    model = make_model()
    loss = StochasticMuZeroLoss(model, consistency_loss_weight=consistency, projection_dim=16,
                                projection_hidden_dim=16, prediction_hidden_dim=8)
    out = loss(_batch(4, 3))
    names = {k for k in out.keys() if k.startswith("loss_")}
    assert {"loss_value", "loss_reward", "loss_policy", "loss_afterstate_value", "loss_chance",
            "loss_commitment"} <= names
    assert ("loss_consistency" in names) == (consistency > 0)
    total = sum(out[k] for k in names)
    assert torch.isfinite(total)
    total.backward()
    for name, net in (("chance encoder", model.chance_encoder), ("afterstate", model.afterstate_net),
                      ("dynamics", model.dynamics_net), ("representation", model.representation_net)):
        grads = [p.grad for p in net.parameters() if p.grad is not None]
        assert grads and sum(float(g.abs().sum()) for g in grads) > 0, name
    # the encoder's first convolution: the world-model terms reach it through the straight-through code
    assert model.chance_encoder[0][0][0].weight.grad.abs().sum() > 0


def test_world_model_terms_alone_reach_the_encoder():
    # zero-initialized heads pass no gradient back at step 0 (their weights are zero): use random heads
    model = make_model(zero_init_heads=False)
    loss = StochasticMuZeroLoss(model, commitment_loss_weight=0.0, chance_loss_weight=0.0)
    out = loss(_batch(3, 2))
    (out["loss_reward"] + out["loss_value"] + out["loss_policy"]).backward()
    assert model.chance_encoder[0][0][0].weight.grad.abs().sum() > 0


def test_world_model_terms_teach_the_encoder_a_hidden_coin_on_frames():
    """o_t+1 shows a bright square top-left (coin, p = 0.3) or bottom-right, and the reward is the coin's sign:
    trained with commitment 0, the encoder's codes agree with the coin and sigma learns 0.3 / 0.7
    (the image version of test_stochastic_muzero's hidden-coin test; ~50 steps suffice, 150 are run)."""
    N, obs_shape = 64, (2, 32, 32)
    gen = torch.Generator().manual_seed(100)

    def coin_batch():
        coin = torch.rand(N, generator=gen) < 0.3
        o0, o1 = (100 * torch.rand(N, *obs_shape, generator=gen) for _ in range(2))
        o1[coin, :, :8, :8] = 255.0
        o1[~coin, :, -8:, -8:] = 255.0
        signed = 2 * coin.float() - 1
        return TensorDict({
            "observation": torch.stack([o0, o1], 1),
            "observation_mask": torch.ones(N, 2, dtype=torch.bool),
            "action": torch.randint(2, (N, 2), generator=gen),
            "target_reward": torch.stack([torch.zeros(N), signed], 1),
            "target_value": torch.stack([torch.full((N,), -0.4), signed], 1),
            "target_policy": torch.full((N, 2, 2), 0.5),
            "mask": torch.ones(N, 2, dtype=torch.bool), "policy_mask": torch.ones(N, 2, dtype=torch.bool),
        }, [N, 2]), coin

    torch.manual_seed(0)
    model = StochasticMuZeroResNetModel(obs_shape, 2, 2, channels=8, value_support_size=3, reward_support_size=3)
    loss = StochasticMuZeroLoss(model, commitment_loss_weight=0.0)
    opt = torch.optim.Adam(loss.parameters(), lr=3e-3)
    for _ in range(150):
        batch, _ = coin_batch()
        total = sum(v for k, v in loss(batch).items() if k.startswith("loss_"))
        opt.zero_grad()
        total.backward()
        opt.step()
    model.eval()
    batch, coin = coin_batch()
    with torch.no_grad():
        code, _ = model.encode_chance(batch["observation"][:, 0], batch["observation"][:, 1])
        picked = code.argmax(-1).bool()
        agreement = max(float((picked == coin).float().mean()), float((picked != coin).float().mean()))
        latent, _, _ = model.initial_inference(batch["observation"][:, 0])
        _, sigma, _ = model.afterstate_inference(latent, batch["action"][:, 0])
    assert agreement > 0.95
    sigma = torch.softmax(sigma, -1).mean(0).sort().values
    torch.testing.assert_close(sigma, torch.tensor([0.3, 0.7]), atol=0.1, rtol=0)


def _cfg(overrides):
    return compose_config(CONFIG_DIR, overrides)


def test_algorithm_builds_the_resnet_for_pong():
    cfg = _cfg(["env=Pong", "algo=stochastic_muzero", "model.channels=8"])
    model = _model(cfg, (4, 96, 96), 6)
    assert isinstance(model, StochasticMuZeroResNetModel)
    assert model.chance_space_size == cfg.algo.chance_space_size
    assert model.latent_shape == (8, 6, 6) and model.value_support.num_bins == 601


@pytest.mark.timeout(300)
def test_tiny_pong_async_end_to_end(tmp_path):
    from torchrl_muzero.trainers import AsyncTrainer
    from torchrl_muzero.trainers.checkpoint import load_checkpoint

    cfg = _cfg([*tiny_pong_overrides(tmp_path), "algo=stochastic_muzero", "logger.log_interval=4"])
    assert cfg.algo.name == "stochastic_muzero" and cfg.model.kind == "resnet"
    t0 = time.monotonic()
    summary = AsyncTrainer(cfg).run()
    assert summary["status"] == "ok", summary
    assert summary["env_steps"] >= 192 and summary["train_iter"] > 0
    rows = (tmp_path / "eval.csv").read_text().strip().splitlines()[1:]
    assert rows, "no evaluation came back"
    state = load_checkpoint(tmp_path / "ckpt" / "last.pt")
    assert state["counters"]["train_iter"] == summary["train_iter"]
    assert any("chance_encoder" in k for k in state["model"]), list(state)[:10]
    assert time.monotonic() - t0 < 240
    assert not live_descendants()
