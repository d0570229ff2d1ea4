import doctest

import pytest
import torch
from tensordict import TensorDict

from torchrl_muzero.modules import MuZeroResNetModel
from torchrl_muzero.modules import resnet as resnet_module

SMALL = dict(
    channels=8,
    reduced_channels_reward=4,
    reduced_channels_value=4,
    reduced_channels_policy=4,
    fc_reward_layers=(8,),
    fc_value_layers=(8,),
    fc_policy_layers=(8,),
    value_support_size=5,
    reward_support_size=4,
)


def _model(obs_shape=(4, 96, 96), num_actions=6, **kwargs):
    torch.manual_seed(0)
    return MuZeroResNetModel(obs_shape, num_actions, **{**SMALL, **kwargs})


@pytest.mark.parametrize(
    "obs_shape, latent_hw",
    [((4, 96, 96), (6, 6)), ((3, 84, 84), (6, 6)), ((12, 64, 48), (4, 3))],
)
def test_shapes_initial_and_recurrent(obs_shape, latent_hw):
    model = _model(obs_shape, num_actions=5)
    assert model.latent_shape == torch.Size((8, *latent_hw))
    obs = torch.rand(3, *obs_shape) * 255
    latent, policy, value = model.initial_inference(obs)
    assert latent.shape == (3, 8, *latent_hw)
    assert policy.shape == (3, 5)
    assert value.shape == (3, 11)
    next_latent, reward, policy, value = model.recurrent_inference(latent, torch.tensor([0, 2, 4]))
    assert next_latent.shape == latent.shape
    assert reward.shape == (3, 9)
    assert policy.shape == (3, 5)
    assert value.shape == (3, 11)


def test_extra_batch_dims_are_kept():
    model = _model((3, 84, 84))
    latent, policy, value = model.initial_inference(torch.rand(2, 3, 3, 84, 84))
    assert latent.shape == (2, 3, *model.latent_shape)
    assert policy.shape == (2, 3, 6)
    assert value.shape == (2, 3, 11)


def test_no_downsample_keeps_board_size():
    model = _model((2, 7, 5), num_actions=4, downsample=False, observation_scale=1.0)
    assert model.latent_shape == torch.Size((8, 7, 5))
    latent, policy, _ = model.initial_inference(torch.rand(3, 2, 7, 5))
    assert latent.shape == (3, 8, 7, 5)
    next_latent, *_ = model.recurrent_inference(latent, torch.tensor([0, 1, 3]))
    assert next_latent.shape == (3, 8, 7, 5)


def test_uint8_equals_float_divided_by_255():
    # without batch norm the convolutions have biases, so the network is not
    # scale invariant (with fresh BN statistics + min-max latent scaling it is)
    model = _model(batch_norm=False)
    unscaled = _model(observation_scale=1.0, batch_norm=False)
    unscaled.load_state_dict(model.state_dict())
    frames = torch.randint(0, 256, (2, 4, 96, 96), dtype=torch.uint8)
    with torch.no_grad():
        out_uint8 = model.initial_inference(frames)
        out_float = unscaled.initial_inference(frames.float() / 255)
        out_raw_float = model.initial_inference(frames.float())
    for a, b, c in zip(out_uint8, out_float, out_raw_float):
        torch.testing.assert_close(a, b)
        torch.testing.assert_close(a, c)
    # the scale matters: the same float frames unscaled give a different latent
    with torch.no_grad():
        other = unscaled.initial_inference(frames.float())[0]
    assert not torch.allclose(other, out_uint8[0])


def test_wrong_observation_shape_raises():
    model = _model()
    with pytest.raises(ValueError, match=r"4, 96, 96.*\(2, 3, 96, 96\)"):
        model.initial_inference(torch.rand(2, 3, 96, 96))
    with pytest.raises(ValueError, match=r"\(96, 96\)"):
        model.initial_inference(torch.rand(96, 96))


def test_bad_config_raises():
    with pytest.raises(ValueError, match=r"\(C, H, W\).*\(96, 96\)"):
        MuZeroResNetModel((96, 96), 6)
    with pytest.raises(ValueError, match="downsample_blocks"):
        MuZeroResNetModel((4, 96, 96), 6, downsample_blocks=(1, 1))
    with pytest.raises(ValueError, match="channels"):
        MuZeroResNetModel((4, 96, 96), 6, channels=1)


def test_bad_action_or_latent_raises():
    model = _model()
    latent, _, _ = model.initial_inference(torch.rand(2, 4, 96, 96))
    with pytest.raises(ValueError, match=r"\[0, 6\)"):
        model.recurrent_inference(latent, torch.tensor([0, 6]))
    with pytest.raises(ValueError, match=r"\[0, 6\)"):
        model.recurrent_inference(latent, torch.tensor([-1, 0]))
    with pytest.raises(ValueError, match=r"shape \[2\].*\(3,\)"):
        model.recurrent_inference(latent, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match=r"\[batch, 8, 6, 6\].*\(2, 8, 5, 5\)"):
        model.recurrent_inference(torch.rand(2, 8, 5, 5), torch.tensor([0, 1]))


def test_latents_are_min_max_scaled():
    model = _model(observation_scale=1.0)
    obs = torch.randn(4, 4, 96, 96) * 10
    latent, _, _ = model.initial_inference(obs)
    for state in (latent, model.recurrent_inference(latent, torch.tensor([0, 1, 2, 5]))[0]):
        flat = state.flatten(1)
        assert flat.min() >= 0 and flat.max() <= 1
        torch.testing.assert_close(flat.min(1).values, torch.zeros(4))
        torch.testing.assert_close(flat.max(1).values, torch.ones(4))


def test_action_changes_dynamics():
    model = _model().eval()
    with torch.no_grad():
        latent, _, _ = model.initial_inference(torch.rand(1, 4, 96, 96) * 255)
        latent = latent.expand(2, *model.latent_shape)
        next_latent, *_ = model.recurrent_inference(latent, torch.tensor([0, 5]))
    assert not torch.allclose(next_latent[0], next_latent[1])


def test_gradients_reach_every_parameter_through_two_step_unroll():
    model = _model(zero_init_heads=False).train()
    obs = torch.rand(4, 4, 96, 96) * 255
    latent, policy, value = model.initial_inference(obs)
    loss = policy.pow(2).mean() + value.pow(2).mean()
    for action in (torch.tensor([0, 1, 2, 3]), torch.tensor([5, 4, 3, 2])):
        latent, reward, policy, value = model.recurrent_inference(latent, action)
        loss = loss + reward.pow(2).mean() + policy.pow(2).mean() + value.pow(2).mean()
    loss.backward()
    for name, param in model.named_parameters():
        assert param.grad is not None, name
        assert param.grad.abs().sum() > 0, name


def test_zero_init_heads():
    model = _model().eval()
    obs = torch.rand(2, 4, 96, 96) * 255
    latent, policy, value = model.initial_inference(obs)
    assert torch.all(policy == 0) and torch.all(value == 0)
    _, reward, _, _ = model.recurrent_inference(latent, torch.tensor([1, 2]))
    assert torch.all(reward == 0)
    # the zeroed layers still learn
    (reward.sum() + policy.sum() + value.sum()).backward()
    for head in (model.reward_head, model.value_head, model.policy_head):
        assert head[-1].weight.grad.abs().sum() > 0


def test_eval_mode_is_batch_independent_and_train_mode_takes_batch_of_one():
    model = _model().train()
    obs = torch.rand(5, 4, 96, 96) * 255
    # a few training-mode passes move the running statistics away from init
    with torch.no_grad():
        for _ in range(3):
            model.initial_inference(obs)
        train_latent = model.initial_inference(obs[:1])[0]  # batch of one in train mode
    assert train_latent.shape == (1, *model.latent_shape)
    model.eval()
    with torch.no_grad():
        batched = model.initial_inference(obs)
        actions = torch.tensor([0, 1, 2, 3, 4])
        batched_rec = model.recurrent_inference(batched[0], actions)
        for i in range(5):
            single = model.initial_inference(obs[i : i + 1])
            for a, b in zip(single, batched):
                torch.testing.assert_close(a[0], b[i], rtol=1e-4, atol=1e-5)
            single_rec = model.recurrent_inference(single[0], actions[i : i + 1])
            for a, b in zip(single_rec, batched_rec):
                torch.testing.assert_close(a[0], b[i], rtol=1e-4, atol=1e-5)


def test_scalar_step_matches_recurrent_inference():
    model = _model(zero_init_heads=False).eval()
    with torch.no_grad():
        latent, _, _ = model.initial_inference(torch.rand(3, 4, 96, 96) * 255)
        action = torch.tensor([0, 3, 5])
        next_latent, reward_logits, policy, value_logits = model.recurrent_inference(latent, action)
        fast = model.recurrent_inference_scalar(latent, action)
    torch.testing.assert_close(fast[0], next_latent)
    # the search decodes with a closed-form h^-1 (float32 rounding differs from torchrl's)
    torch.testing.assert_close(fast[1], model.reward_support.decode(reward_logits), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(fast[2], policy)
    torch.testing.assert_close(fast[3], model.value_support.decode(value_logits), atol=1e-4, rtol=1e-4)


def test_tensordict_views():
    model = _model((3, 84, 84), zero_init_heads=False).eval()
    td = TensorDict({"observation": torch.randint(0, 256, (2, 3, 84, 84), dtype=torch.uint8)}, [2])
    td = model.initial(td)
    assert td["latent"].shape == (2, *model.latent_shape)
    assert td["policy_logits"].shape == (2, 6)
    assert td["value_logits"].shape == (2, 11)
    torch.testing.assert_close(td["state_value"], model.value_support.decode(td["value_logits"]))
    td["action"] = torch.tensor([1, 4])
    td = model.recurrent(td)
    assert td["next_latent"].shape == (2, *model.latent_shape)
    assert td["reward"].shape == (2,)
    assert td["state_value"].shape == (2,)
    # one-hot actions give the same step as indices
    one_hot = TensorDict({"latent": td["latent"], "action": torch.eye(6)[[1, 4]]}, [2])
    one_hot = model.recurrent(one_hot)
    torch.testing.assert_close(one_hot["next_latent"], td["next_latent"])
    torch.testing.assert_close(one_hot["reward"], td["reward"])


def test_docstring_example_runs():
    result = doctest.testmod(resnet_module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0
