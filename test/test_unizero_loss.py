"""UniZeroLoss: gradients, weights, masks, the EMA target encoder and the train_iter schedules."""
from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict

from torchrl_muzero.modules.unizero import UniZeroModel
from torchrl_muzero.objectives.unizero import UniZeroLoss

B, K1, A = 6, 4, 3
WEIGHTS = ("latent", "reward", "policy", "value")


def _model(seed: int = 0) -> UniZeroModel:
    torch.manual_seed(seed)
    # random heads: a zero policy head predicts uniform, and a cross-entropy against uniform cannot tell
    # one target distribution (e.g. a label-smoothed one) from another
    return UniZeroModel((5,), A, embed_dim=16, num_heads=2, context_length=2, max_blocks=6,
                        value_support_size=5, reward_support_size=5, encoder_hidden_dim=16, zero_init_heads=False)


def _batch(seed: int = 1) -> TensorDict:
    g = torch.Generator().manual_seed(seed)
    return TensorDict({
        "observation": torch.randn(B, K1, 5, generator=g),
        "observation_mask": torch.ones(B, K1, dtype=torch.bool),
        "action": torch.randint(A, (B, K1), generator=g),
        "target_reward": torch.randn(B, K1, generator=g),
        "target_value": torch.randn(B, K1, generator=g) * 2,
        "target_policy": torch.softmax(torch.randn(B, K1, A, generator=g), -1),
        "mask": torch.ones(B, K1, dtype=torch.bool),
        "policy_mask": torch.ones(B, K1, dtype=torch.bool),
        "weight": torch.rand(B, K1, generator=g) + 0.5,
    }, [B, K1])


def _total(out) -> torch.Tensor:
    return sum(v for k, v in out.items() if k.startswith("loss_"))


def test_target_encoder_gets_no_gradient():
    loss = UniZeroLoss(_model())
    _total(loss(_batch())).backward()
    assert all(p.grad is None for p in loss.target_encoder.parameters())
    assert all(not p.requires_grad for p in loss.target_encoder.parameters())
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in loss.model.encoder.parameters())


@pytest.mark.parametrize("name", WEIGHTS + ("entropy",))
def test_each_weight_is_used(name):
    model = _model()
    key = "policy_entropy_weight" if name == "entropy" else f"{name}_loss_weight"
    base = UniZeroLoss(copy.deepcopy(model))
    scaled = UniZeroLoss(copy.deepcopy(model), **{key: 3 * getattr(base, key)})
    a, b = base(_batch()), scaled(_batch())
    term = f"loss_{name}"
    assert float(a[term].detach().abs()) > 1e-6
    # the entropy bonus rides on the policy term (LightZero): policy_loss_weight scales both
    scaled_terms = {term, "loss_entropy"} if name == "policy" else {term}
    for t in scaled_terms:
        torch.testing.assert_close(b[t], 3 * a[t])
    torch.testing.assert_close(_total(b) - _total(a), 2 * sum(a[t] for t in scaled_terms))
    for other in a.keys():
        if other.startswith("loss_") and other not in scaled_terms:
            torch.testing.assert_close(a[other], b[other])


def test_lightzero_weights_are_the_defaults():
    loss = UniZeroLoss(_model())
    assert (loss.latent_loss_weight, loss.reward_loss_weight, loss.policy_loss_weight, loss.value_loss_weight) == (
        10.0, 1.0, 1.0, 0.5)
    assert loss.policy_entropy_weight == 5e-3 and loss.target_update_theta == 0.05


def test_loss_decreases_on_a_fixed_batch():
    loss = UniZeroLoss(_model())
    opt = torch.optim.Adam(loss.model.parameters(), lr=3e-3)
    batch = _batch()
    first = None
    for i in range(40):
        total = _total(loss(batch.clone()))
        first = float(total.detach()) if first is None else first
        opt.zero_grad()
        total.backward()
        opt.step()
        loss.after_update(i + 1)
    assert float(total.detach()) < 0.6 * first


class _Oracle(UniZeroModel):
    """Predicts exactly the targets built by ``_oracle_batch`` (near-delta logits, next latent = next encoding)."""

    def forward(self, latents, actions):
        Bn, T = actions.shape
        hot = lambda i, n: torch.nn.functional.one_hot(torch.full((Bn, T), i), n).float() * 40.0  # noqa: E731
        nxt = torch.cat([latents[:, 1:], latents[:, -1:]], 1)
        return TensorDict({"policy_logits": hot(1, A) + 0 * latents.sum(-1, keepdim=True),
                           "value_logits": hot(7, self.value_support.num_bins),
                           "reward_logits": hot(3, self.reward_support.num_bins), "next_latent": nxt}, [Bn, T])


def test_targets_equal_to_predictions_give_zero_terms():
    torch.manual_seed(0)
    model = _Oracle((5,), A, embed_dim=16, num_heads=2, context_length=2, max_blocks=6,
                    value_support_size=5, reward_support_size=5, encoder_hidden_dim=16)
    loss = UniZeroLoss(model)  # the target encoder starts equal to the online one
    batch = _batch()
    out_logits = model(torch.zeros(B, K1, 16), torch.zeros(B, K1, dtype=torch.long))
    batch["target_policy"] = torch.nn.functional.one_hot(torch.ones(B, K1, dtype=torch.long), A).float()
    batch["target_value"] = model.value_support.decode(out_logits["value_logits"])
    batch["target_reward"] = model.reward_support.decode(out_logits["reward_logits"])
    out = loss(batch)
    for name in WEIGHTS:
        assert float(out[f"loss_{name}"]) < 1e-4, (name, float(out[f"loss_{name}"]))
    assert float(out["priority"].max()) < 1e-3


def test_masks_make_missing_data_irrelevant():
    loss = UniZeroLoss(_model())
    batch = _batch()
    for key in ("mask", "policy_mask", "observation_mask"):
        batch[key][:, 2:] = False
    other = batch.clone()
    g = torch.Generator().manual_seed(5)
    other["observation"][:, 2:] = torch.randn(B, K1 - 2, 5, generator=g)
    other["action"][:, 1:] = torch.randint(A, (B, K1 - 1), generator=g)  # a_1 only feeds the masked step 1 -> 2
    for key in ("target_reward", "target_value", "target_policy"):
        other[key][:, 2:] = float("nan")
    a, b = loss(batch), loss(other)
    for key in a.keys():
        torch.testing.assert_close(a[key], b[key])


def test_ema_moves_the_target_by_theta():
    loss = UniZeroLoss(_model(), target_update_theta=0.25)
    with torch.no_grad():
        for p in loss.model.encoder.parameters():
            p.add_(torch.randn_like(p))
    before = [p.clone() for p in loss.target_encoder.parameters()]
    loss.after_update(1)
    for old, new, online in zip(before, loss.target_encoder.parameters(), loss.model.encoder.parameters()):
        torch.testing.assert_close(new, old + 0.25 * (online - old))


def test_label_smoothing_follows_train_iter():
    loss = UniZeroLoss(_model(), policy_ls_eps_start=0.1, policy_ls_eps_end=0.02, policy_ls_eps_decay_steps=100)
    loss.set_train_iter(0)
    assert loss.policy_ls_eps == pytest.approx(0.1)
    loss.set_train_iter(50)
    assert loss.policy_ls_eps == pytest.approx(0.06)
    loss.set_train_iter(10_000)
    assert loss.policy_ls_eps == pytest.approx(0.02)
    smoothed = float(loss(_batch())["loss_policy"])
    assert smoothed != pytest.approx(float(UniZeroLoss(copy.deepcopy(loss.model))(_batch())["loss_policy"]))
    assert UniZeroLoss(_model()).policy_ls_eps == 0.0  # start 0: off


def test_group_kl_is_the_kl_of_each_simnorm_group():
    """latent_loss='group_kl': KL(target || prediction) per SimNorm group, averaged over the groups."""
    model = _model()
    loss = UniZeroLoss(model, latent_loss="group_kl")
    inputs = loss._read_inputs(_batch())
    unrolled = loss._unroll(inputs)
    term = loss._step_terms(inputs, unrolled)["latent"]
    g = model.latent_norm.simnorm_dim
    p = unrolled["next_latent"].reshape(B, K1 - 1, -1, g)
    t = unrolled["target_latent"].reshape(B, K1 - 1, -1, g)
    expected = torch.distributions.kl_divergence(torch.distributions.Categorical(probs=t),
                                                 torch.distributions.Categorical(probs=p)).mean(-1)
    torch.testing.assert_close(term.values, expected)
    assert float(expected.min()) > 0
    # the same prediction as its target gives 0
    unrolled["next_latent"] = unrolled["target_latent"].clone()
    assert float(loss._step_terms(inputs, unrolled)["latent"].values.abs().max()) < 1e-6
    with pytest.raises(ValueError, match="group_kl' needs a model with SimNorm latents"):
        UniZeroLoss(UniZeroModel((5,), A, embed_dim=16, num_heads=2, context_length=2, max_blocks=6,
                                 value_support_size=5, reward_support_size=5, latent_norm="layernorm"),
                    latent_loss="group_kl")
