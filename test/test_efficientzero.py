"""Tests of the EfficientZero model (value-prefix LSTM, search steps) and EfficientZeroLoss."""
from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from torchrl_muzero.modules import MuZeroMLPModel
from torchrl_muzero.modules.efficientzero import EfficientZeroMLPModel, EfficientZeroResNetModel
from torchrl_muzero.objectives import EfficientZeroLoss, MuZeroLoss

OBS, A, H = (4,), 3, 3


def make_model(seed: int = 0, horizon: int = H, zero_init_heads: bool = False, **kwargs) -> EfficientZeroMLPModel:
    torch.manual_seed(seed)
    kwargs = {"latent_dim": 16, "hidden_dim": 32, "lstm_hidden_size": 8, "value_support_size": 5,
              "reward_support_size": 5, **kwargs}
    return EfficientZeroMLPModel(OBS, A, zero_init_heads=zero_init_heads, lstm_horizon_len=horizon, **kwargs)


def make_loss(model, **kwargs) -> EfficientZeroLoss:
    kwargs.setdefault("projection_dim", 16)
    kwargs.setdefault("projection_hidden_dim", 16)
    kwargs.setdefault("prediction_hidden_dim", 8)
    return EfficientZeroLoss(model, **kwargs)


def value_prefix_targets(reward: torch.Tensor, horizon: int) -> torch.Tensor:
    """``[B, K+1]`` rewards into each position (index 0 unused) -> prefixes reset every H."""
    prefix = torch.zeros_like(reward)
    running = torch.zeros_like(reward[:, 0])
    for k in range(1, reward.shape[1]):
        running = running + reward[:, k]
        prefix[:, k] = running
        if k % horizon == 0:
            running = torch.zeros_like(running)
    return prefix


def make_batch(B: int = 4, K: int = 5, seed: int = 0, horizon: int = H) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    reward = torch.randn(B, K + 1, generator=g)
    return TensorDict(
        {
            "observation": torch.randn(B, K + 1, *OBS, generator=g),
            "action": torch.randint(A, (B, K + 1), generator=g),
            "target_value_prefix": value_prefix_targets(reward, horizon),
            "target_value": 3 * torch.randn(B, K + 1, generator=g),
            "target_policy": torch.softmax(2 * torch.randn(B, K + 1, A, generator=g), -1),
            "mask": torch.ones(B, K + 1, dtype=torch.bool),
            "policy_mask": torch.ones(B, K + 1, dtype=torch.bool),
        },
        batch_size=[B, K + 1],
    )


def total(out: TensorDict) -> torch.Tensor:
    return sum(v for k, v in out.items() if k.startswith("loss_"))


def test_value_prefix_target_helper_matches_the_documented_layout():
    prefix = value_prefix_targets(torch.ones(1, 8), 3)
    assert prefix[0, 1:].tolist() == [1, 2, 3, 1, 2, 3, 1]


# -- search steps ------------------------------------------------------------------------
def walk(model, observation, actions):
    """Search steps along ``actions [B, D]`` from the root; returns the ModelSteps."""
    steps = [model.search_root(observation)]
    for d in range(actions.shape[1]):
        steps.append(model.search_step(steps[-1].state, actions[:, d]))
    return steps


def raw_prefixes(model, observation, actions):
    """Decoded value prefixes of the training API along a path (LSTM reset every H)."""
    with torch.no_grad():
        latent = model.initial_inference(observation)[0]
        lstm = model.initial_lstm_state(observation.shape[0])
        out = []
        for d in range(actions.shape[1]):
            latent, lstm, logits, _, value_logits = model.recurrent_inference_prefix(latent, lstm, actions[:, d])
            out.append(model.decode_reward_and_value(logits, value_logits)[0])  # the search's decoding
            if (d + 1) % model.lstm_horizon_len == 0:
                lstm = model.reset_lstm_state(lstm)
    return torch.stack(out, 1)


def test_search_root_state():
    model = make_model()
    root = model.search_root(torch.randn(2, *OBS))
    state = root.state
    assert state.batch_size == torch.Size([2])
    assert set(state.keys()) == {"latent", "lstm_h", "lstm_c", "value_prefix", "steps"}
    assert torch.equal(state["value_prefix"], torch.zeros(2)) and torch.equal(state["steps"], torch.zeros(2, dtype=torch.long))
    assert state["lstm_h"].abs().sum() == 0 and state["lstm_c"].abs().sum() == 0
    assert torch.equal(root.reward, torch.zeros(2)) and root.discount is None


@pytest.mark.parametrize("depth", [1, H - 1, H, 2 * H + 1])
def test_edge_rewards_telescope_to_the_leaf_prefix_within_a_horizon(depth):
    model = make_model(seed=1)
    B = 5
    g = torch.Generator().manual_seed(depth)
    obs = torch.randn(B, *OBS, generator=g)
    actions = torch.randint(A, (B, depth), generator=g)
    steps = walk(model, obs, actions)
    prefixes = raw_prefixes(model, obs, actions)
    rewards = torch.stack([s.reward for s in steps[1:]], 1)  # [B, depth]
    for d in range(1, depth + 1):
        start = ((d - 1) // H) * H  # depth of the last reset node above depth d
        # the edge rewards since the reset sum to the node's prefix
        torch.testing.assert_close(rewards[:, start:d].sum(1), prefixes[:, d - 1], rtol=0, atol=1e-5)
        if d - 1 == start:  # the parent is a reset node (or the root): reward = the child's prefix
            torch.testing.assert_close(rewards[:, d - 1], prefixes[:, d - 1], rtol=0, atol=0)


def test_lstm_state_is_zero_after_every_horizon_in_search():
    model = make_model(seed=2)
    steps = walk(model, torch.randn(3, *OBS), torch.randint(A, (3, 2 * H + 1)))
    for depth, step in enumerate(steps):
        state = step.state
        reset = depth % H == 0
        assert int(state["steps"][0]) == depth % H
        assert bool((state["lstm_h"].abs().sum(-1) == 0).all()) == reset, depth
        assert bool((state["lstm_c"].abs().sum(-1) == 0).all()) == reset, depth
        if reset:
            assert torch.equal(state["value_prefix"], torch.zeros(3))


class CountingModel(EfficientZeroMLPModel):
    """A fake whose LSTM counts steps and whose value prefix is the count: depth since reset."""

    def dynamics_prefix(self, latent, lstm_state, action):
        h, c = lstm_state
        h = h + 1.0
        return latent, (h, c + 1.0), h[:, :1].expand(-1, self.reward_support.num_bins)

    def decode_reward_and_value(self, reward_logits, value_logits):
        return reward_logits[..., 0], torch.zeros(value_logits.shape[:-1])


def test_fake_model_with_prefix_equal_to_depth_gives_unit_edge_rewards():
    torch.manual_seed(0)
    model = CountingModel(OBS, A, latent_dim=8, hidden_dim=8, lstm_hidden_size=4, lstm_horizon_len=H)
    steps = walk(model, torch.randn(2, *OBS), torch.zeros(2, 3 * H + 2, dtype=torch.long))
    for depth, step in enumerate(steps[1:], start=1):
        assert torch.equal(step.reward, torch.ones(2)), (depth, step.reward)
        expected_prefix = 0.0 if depth % H == 0 else float(depth % H)
        assert torch.equal(step.state["value_prefix"], torch.full((2,), expected_prefix))


def test_states_store_in_a_preallocated_tensordict_tree():
    """The search keeps ``embeddings [B, N]`` built from the root state and indexes it per row."""
    model = make_model()
    B, N = 3, 6
    root = model.search_root(torch.randn(B, *OBS))
    embeddings = root.state.unsqueeze(1).expand(B, N).clone()
    rows = torch.arange(B)
    for n in range(1, N):
        parent = torch.randint(n, (B,))
        step = model.search_step(embeddings[rows, parent], torch.randint(A, (B,)))
        embeddings[:, n] = step.state
        assert torch.equal(embeddings[:, n]["steps"], step.state["steps"])
    assert embeddings.batch_size == torch.Size([B, N])


def test_muzero_paths_refuse_the_value_prefix_model():
    model = make_model()
    latent = model.initial_inference(torch.randn(2, *OBS))[0]
    for call in (model.recurrent_inference, model.recurrent_inference_scalar, model.dynamics):
        with pytest.raises(NotImplementedError, match="value prefixes"):
            call(latent, torch.zeros(2, dtype=torch.long))
    with pytest.raises(NotImplementedError, match="value prefixes"):
        model.recurrent(TensorDict({"latent": latent, "action": torch.zeros(2, dtype=torch.long)}, [2]))
    assert model.fused_search_weights() is None
    assert not hasattr(model, "reward_head")
    with pytest.raises(ValueError, match="EfficientZeroLoss"):
        MuZeroLoss(model)
    with pytest.raises(ValueError, match="EfficientZero model"):
        EfficientZeroLoss(MuZeroMLPModel(OBS, A, latent_dim=8, hidden_dim=8))


def test_bad_lstm_inputs_raise_clear_errors():
    model = make_model()
    latent = model.initial_inference(torch.randn(2, *OBS))[0]
    with pytest.raises(ValueError, match="LSTM state"):
        model.recurrent_inference_prefix(latent, model.initial_lstm_state(3), torch.zeros(2, dtype=torch.long))
    with pytest.raises(TypeError, match="TensorDict"):
        model.search_step(latent, torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="lstm_horizon_len"):
        make_model(horizon=0)


def test_resnet_model_search_and_training_api():
    torch.manual_seed(0)
    model = EfficientZeroResNetModel((3, 8, 8), A, channels=8, downsample=False, value_support_size=5,
                                     reward_support_size=5, lstm_hidden_size=16, lstm_horizon_len=2,
                                     zero_init_heads=False)
    obs = torch.rand(2, 3, 8, 8)
    actions = torch.randint(A, (2, 3))
    steps = walk(model.eval(), obs, actions)
    prefixes = raw_prefixes(model, obs, actions)
    torch.testing.assert_close(steps[1].reward + steps[2].reward, prefixes[:, 1], rtol=0, atol=1e-5)
    torch.testing.assert_close(steps[3].reward, prefixes[:, 2], rtol=0, atol=0)
    assert steps[2].state["lstm_h"].abs().sum() == 0
    with pytest.raises(ValueError, match="latents of shape"):
        model.recurrent_inference_prefix(torch.zeros(2, 8), model.initial_lstm_state(2),
                                         torch.zeros(2, dtype=torch.long))
    loss = make_loss(model)
    batch = TensorDict({
        "observation": torch.rand(2, 4, 3, 8, 8),
        "action": torch.randint(A, (2, 4)),
        "target_value_prefix": value_prefix_targets(torch.ones(2, 4), 2),
        "target_value": torch.randn(2, 4),
        "target_policy": torch.full((2, 4, A), 1.0 / A),
        "mask": torch.ones(2, 4, dtype=torch.bool),
        "policy_mask": torch.ones(2, 4, dtype=torch.bool),
    }, [2, 4])
    total(loss(batch)).backward()
    assert model.value_prefix_lstm.weight_ih.grad.abs().sum() > 0
    assert model.value_prefix_conv[0].weight.grad.abs().sum() > 0


# -- the loss ------------------------------------------------------------------------------
def test_loss_defaults_and_output_keys():
    model = make_model()
    loss = make_loss(model)
    assert (loss.value_loss_weight, loss.policy_loss_weight, loss.value_prefix_loss_weight,
            loss.consistency_loss_weight) == (0.25, 1.0, 1.0, 2.0)
    out = loss(make_batch())
    assert set(out.keys()) == set(loss.out_keys)
    assert loss.out_keys[:4] == ["loss_value", "loss_value_prefix", "loss_policy", "loss_consistency"]
    assert "target_value_prefix" in loss.in_keys and "target_reward" not in loss.in_keys
    assert set(EfficientZeroLoss._AcceptedKeys.__dataclass_fields__) - set(
        MuZeroLoss._AcceptedKeys.__dataclass_fields__) == {"target_value_prefix"}
    # the registry passes MuZero's loss.* keys: reward_loss_weight names the prefix term
    assert make_loss(model, reward_loss_weight=0.5).value_prefix_loss_weight == 0.5
    with pytest.raises(ValueError, match="not both"):
        make_loss(model, reward_loss_weight=0.5, value_prefix_loss_weight=1.0)


def test_loss_matches_a_reference_loop():
    model = make_model(seed=3)
    loss = make_loss(model, consistency_loss_weight=0.0, value_prefix_loss_weight=0.7)
    K, B = 7, 3
    batch = make_batch(B=B, K=K, seed=5)
    batch["mask"][1, 5:] = False
    out = loss(batch.clone())
    per_sample = []
    for b in range(B):
        latent = model.initial_inference(batch["observation"][b, :1])[0]
        lstm = model.initial_lstm_state(1)
        acc = torch.zeros(())
        for k in range(1, K + 1):
            latent, lstm, logits, _, _ = model.recurrent_inference_prefix(latent, lstm, batch["action"][b, k - 1 : k])
            if batch["mask"][b, k]:
                acc = acc + model.reward_support.cross_entropy(logits, batch["target_value_prefix"][b, k : k + 1])[0] / K
            if k % H == 0:
                lstm = model.reset_lstm_state(lstm)
        per_sample.append(acc)
    torch.testing.assert_close(out["loss_value_prefix"], 0.7 * torch.stack(per_sample).mean())


def test_lstm_state_is_zero_after_every_horizon_in_the_unroll():
    model = make_model()
    seen = []
    real = model.recurrent_inference_prefix

    def spy(latent, lstm_state, action):
        seen.append(lstm_state)
        return real(latent, lstm_state, action)

    model.recurrent_inference_prefix = spy
    K = 2 * H + 1
    make_loss(model)(make_batch(K=K))
    assert len(seen) == K
    for k, (h, c) in enumerate(seen, start=1):  # the state entering step k
        zero = bool(h.abs().sum() == 0) and bool(c.abs().sum() == 0)
        assert zero == ((k - 1) % H == 0), k


def test_consistency_target_branch_gets_no_gradient():
    model = make_model()
    loss = make_loss(model, latent_grad_scale=1.0)
    projected = []
    loss.projector.register_forward_hook(lambda m, args, output: projected.append(output))
    represented = []
    model.representation_net.register_forward_hook(lambda m, args, output: represented.append(output))
    out = loss(make_batch(K=4))
    out["loss_consistency"].backward()
    # the projector ran twice: the online branch (with grad) and the target branch (without)
    assert [p.requires_grad for p in projected] == [True, False]
    # the representation ran for the root (with grad) and for the targets (without)
    assert [r.requires_grad for r in represented] == [True, False]
    assert loss.predictor[0].weight.grad.abs().sum() > 0
    # with the latent gradient cut, the consistency loss could only reach the
    # representation through the target branch: it must not
    cut = make_loss(model, latent_grad_scale=0.0)
    cut.load_state_dict(loss.state_dict())
    cut.zero_grad(set_to_none=True)
    cut(make_batch(K=4))["loss_consistency"].backward()
    assert all(p.grad is None or p.grad.abs().sum() == 0 for p in model.representation_net.parameters())
    assert model.dynamics_net[0].weight.grad.abs().sum() > 0


def test_loss_trains_on_a_fixed_batch():
    model = make_model(zero_init_heads=True)
    loss = make_loss(model)
    batch = make_batch(B=8, K=5, seed=1)
    optim = torch.optim.Adam(loss.parameters(), lr=3e-3)
    first = None
    for _ in range(30):
        optim.zero_grad()
        out = loss(batch.clone())
        value = total(out)
        value.backward()
        optim.step()
        first = out.detach() if first is None else first
    last = loss(batch.clone())
    assert total(last).item() < total(first).item() - 0.5
    assert last["loss_value_prefix"].item() < first["loss_value_prefix"].item()
    assert model.value_prefix_lstm.weight_ih.grad.abs().sum() > 0


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda b: b.del_("target_value_prefix"), "target_value_prefix"),
        (lambda b: TensorDict({**b.to_dict(), "target_value_prefix": torch.zeros(4, 3)}, [4]),
         r"'target_value_prefix' must have shape \[B, K\+1\]"),
        (lambda b: b["target_value_prefix"].__setitem__((1, 2), float("nan")), "target_value_prefix"),
        (lambda b: b.del_("target_policy"), "target_policy"),
    ],
)
def test_bad_inputs_name_the_key(mutate, match):
    batch = make_batch(K=5)
    result = mutate(batch)
    batch = result if isinstance(result, TensorDict) and result is not batch else batch
    with pytest.raises(ValueError, match=match):
        make_loss(make_model())(batch)


def test_set_keys_renames_the_value_prefix():
    loss = make_loss(make_model())
    batch = make_batch()
    reference = loss(batch.clone())
    loss.set_keys(target_value_prefix="vp")
    renamed = batch.clone()
    renamed["vp"] = renamed.pop("target_value_prefix")
    out = loss(renamed)
    torch.testing.assert_close(out["loss_value_prefix"], reference["loss_value_prefix"])
    with pytest.raises(ValueError, match="'vp'"):
        loss(batch.clone())
