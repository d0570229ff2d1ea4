import pytest
import torch
from tensordict import TensorDict
from torchrl.modules.functional import signed_hyperbolic, signed_parabolic

from torchrl_muzero.modules import CategoricalSupport, MuZeroMLPModel, MuZeroModel, scale_latent
from torchrl_muzero.modules.support import inverse_signed_hyperbolic


@pytest.mark.parametrize("size", [10, 300])
def test_support_round_trip(size):
    support = CategoricalSupport(size)
    assert support.num_bins == 2 * size + 1
    limit = min(support.max_value, 1e4)
    x = torch.cat([torch.linspace(-limit, limit, 2001), torch.tensor([0.0, 1e-3, -0.5])])
    probs = support.encode(x)
    assert probs.shape == (x.numel(), support.num_bins)
    assert torch.allclose(probs.sum(-1), torch.ones(x.numel()))
    assert ((probs > 0).sum(-1) <= 2).all()  # two-hot
    logits = probs.clamp_min(1e-30).log()
    assert torch.allclose(support.decode(logits), x, rtol=1e-4, atol=1e-3)
    assert torch.allclose(support.decode_fast(logits), support.decode(logits), rtol=1e-4, atol=1e-3)


def test_support_saturates_and_checks_shape():
    support = CategoricalSupport(5)
    big = support.decode(support.encode(torch.tensor([1e6])).clamp_min(1e-30).log())
    assert torch.allclose(big, torch.tensor([support.max_value]), rtol=1e-3)
    with pytest.raises(ValueError, match="11 bins"):
        support.decode(torch.zeros(3, 7))
    with pytest.raises(ValueError, match="support_size"):
        CategoricalSupport(0)


def test_fast_inverse_matches_torchrl():
    y = torch.linspace(-300, 300, 10001, dtype=torch.float64)
    assert torch.allclose(inverse_signed_hyperbolic(y, 1e-3), signed_parabolic(y, 1e-3), rtol=1e-9, atol=1e-9)
    x = torch.linspace(-1000, 1000, 1001, dtype=torch.float64)
    assert torch.allclose(inverse_signed_hyperbolic(signed_hyperbolic(x), 1e-3), x, atol=1e-6)


def test_cross_entropy_is_minimal_at_target():
    support = CategoricalSupport(10)
    target = torch.tensor([2.5, -7.0])
    logits = torch.zeros(2, 21, requires_grad=True)
    opt = torch.optim.Adam([logits], lr=0.1)
    for _ in range(300):
        opt.zero_grad()
        support.cross_entropy(logits, target).sum().backward()
        opt.step()
    assert torch.allclose(support.decode(logits.detach()), target, atol=0.05)


def test_scale_latent_range():
    x = torch.randn(5, 3, 4, 4) * 10
    y = scale_latent(x)
    flat = y.flatten(1)
    assert torch.allclose(flat.min(-1).values, torch.zeros(5)) and torch.allclose(flat.max(-1).values, torch.ones(5))
    assert torch.isfinite(scale_latent(torch.ones(2, 8))).all()  # constant latents do not divide by zero


def _mlp(**kw):
    torch.manual_seed(0)
    return MuZeroMLPModel((4,), 3, latent_dim=16, hidden_dim=24, value_support_size=30, reward_support_size=20,
                          zero_init_heads=False, **kw)


def test_mlp_fast_step_equals_generic_step():
    model = _mlp()
    latent = scale_latent(torch.randn(7, 16))
    action = torch.randint(3, (7,))
    fast = model.recurrent_inference_scalar(latent, action)
    with torch.no_grad():
        nl, rl, pl, vl = model.recurrent_inference(latent, action)
    assert torch.allclose(fast[0], nl, atol=1e-6)
    assert torch.allclose(fast[1], model.reward_support.decode(rl), atol=1e-4)
    assert torch.allclose(fast[2], pl, atol=1e-6)
    assert torch.allclose(fast[3], model.value_support.decode(vl), atol=1e-4)
    generic = MuZeroModel.recurrent_inference_scalar(model, latent, action)
    for a, b in zip(fast, generic):
        assert torch.allclose(a, b, atol=1e-5)


def test_mlp_tensordict_views_and_errors():
    model = _mlp()
    td = TensorDict({"observation": torch.randn(2, 5, 4)}, [2, 5])
    model.initial(td)
    assert td["latent"].shape == (2, 5, 16) and td["state_value"].shape == (2, 5)
    td = TensorDict({"latent": td["latent"][0], "action": torch.nn.functional.one_hot(torch.arange(5) % 3, 3)}, [5])
    model.recurrent(td)
    assert td["reward"].shape == (5,) and td["next_latent"].shape == (5, 16)
    with pytest.raises(ValueError, match=r"shape \[\*batch, 4\], got \(5, 3\)"):
        model.initial_inference(torch.randn(5, 3))
    with pytest.raises(ValueError, match=r"actions must lie in \[0, 3\)"):
        model.recurrent_inference(torch.rand(2, 16), torch.tensor([0, 3]))
    with pytest.raises(ValueError, match="integer actions of shape \\[2\\]"):
        model.recurrent_inference(torch.rand(2, 16), torch.tensor([0.0, 1.0]))


def test_mlp_latent_is_scaled_and_heads_start_neutral():
    model = MuZeroMLPModel((4,), 3, latent_dim=16, hidden_dim=16)
    latent, policy_logits, value_logits = model.initial_inference(torch.randn(6, 4))
    assert latent.min() >= 0 and latent.max() <= 1
    assert torch.allclose(policy_logits, torch.zeros_like(policy_logits))
    assert torch.allclose(model.value_support.decode(value_logits), torch.zeros(6), atol=1e-5)
