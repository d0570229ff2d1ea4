"""The policy as a distribution (issue 38): the categorical policy gives the old expressions bit for bit."""
from __future__ import annotations

import pytest
import torch
from torch.distributions import Categorical

from torchrl_muzero.modules import CategoricalPolicy, PolicyDistribution, policy_distribution
from torchrl_muzero.objectives.unrolled import UnrolledModelLoss


def _logits(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=g) * 3.0


def _target(*shape, seed=1):
    g = torch.Generator().manual_seed(seed)
    target = torch.softmax(torch.randn(*shape, generator=g) * 2.0, -1)
    target[..., 0] = 0.0  # exact zeros: xlogy's 0 log 0 = 0 path
    return target / target.sum(-1, keepdim=True)


def test_prior_is_softmax_bit_for_bit():
    for shape in [(7, 5), (4, 3, 6), (1, 1)]:
        logits = _logits(*shape)
        assert torch.equal(CategoricalPolicy.from_logits(logits).prior(), torch.softmax(logits, -1))
    # the search's root: float logits masked to -inf, then the softmax
    logits, legal = _logits(6, 5), _logits(6, 5, seed=3) > -0.5
    legal[:, 0] = True
    want = torch.softmax(logits.float().masked_fill(~legal, float("-inf")), -1)
    got = CategoricalPolicy.from_logits(logits.float(), legal).prior()
    assert torch.equal(got, want)
    assert torch.equal(got == 0, ~legal)


def test_prior_over_slots_renormalises_the_slots():
    logits = _logits(3, 6)
    slots = torch.tensor([[0, 2], [5, 1], [3, 4]])
    got = CategoricalPolicy.from_logits(logits).prior(slots)
    probs = torch.softmax(logits, -1).gather(-1, slots)
    torch.testing.assert_close(got, probs / probs.sum(-1, keepdim=True))


def test_log_prob_and_entropy_match_torch_distributions():
    logits = _logits(4, 3, 7)
    dist, ref = CategoricalPolicy.from_logits(logits), Categorical(logits=logits)
    actions = torch.randint(7, (4, 3), generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(dist.log_prob(actions), ref.log_prob(actions))
    torch.testing.assert_close(dist.entropy(), ref.entropy())
    several = torch.randint(7, (4, 3, 5), generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(dist.log_prob(several), ref.log_prob(several.movedim(-1, 0)).movedim(0, -1))
    # masked: illegal actions have probability 0 and the entropy stays finite (0 log 0 = 0)
    legal = torch.ones(4, 3, 7, dtype=torch.bool)
    legal[..., 1::2] = False
    masked = CategoricalPolicy.from_logits(logits, legal)
    ref = Categorical(logits=logits.masked_fill(~legal, float("-inf")))
    torch.testing.assert_close(masked.entropy(), ref.entropy())
    assert torch.isfinite(masked.cross_entropy(torch.softmax(logits.masked_fill(~legal, -1e9), -1))).all()


def test_entropy_and_cross_entropy_are_the_old_expressions_bit_for_bit():
    logits, target = _logits(8, 4, 9), _target(8, 4, 9)
    dist = CategoricalPolicy.from_logits(logits)
    log_policy = torch.log_softmax(logits, -1)
    assert torch.equal(dist.entropy(), -(log_policy.exp() * log_policy).sum(-1))
    assert torch.equal(dist.cross_entropy(target), -(target * log_policy).sum(-1))
    # the priorities' root entropy: log-softmax of the whole tensor, then the roots' slice
    root = torch.log_softmax(logits, -1)[:, 0]
    assert torch.equal(dist[:, 0].entropy(), -(root.exp() * root).sum(-1))
    assert dist[:, 0].batch_shape == torch.Size([8])
    # UniZero's label smoothing
    eps = 0.01
    assert torch.equal(dist.smooth_target(target, eps), (1.0 - eps) * target + eps / target.shape[-1])


@pytest.mark.parametrize("kind", ["cross_entropy", "kl"])
def test_the_loss_policy_term_is_the_previous_expression_bit_for_bit(kind):
    class _Loss:  # the base's _policy_loss needs only the model and the policy_loss setting
        model, policy_loss = object(), kind

    for seed in range(5):
        logits = _logits(6, 4, 5, seed=seed).requires_grad_(True)
        target = _target(6, 4, 5, seed=seed + 10)
        got = UnrolledModelLoss._policy_loss(_Loss(), logits, target)
        (grad_got,) = torch.autograd.grad(got.sum(), logits)
        log_policy = torch.log_softmax(logits, -1)
        want = -(target * log_policy).sum(-1)
        if kind == "kl":
            want = want + torch.xlogy(target, target).sum(-1)
        (grad_want,) = torch.autograd.grad(want.sum(), logits)
        assert torch.equal(got, want)
        assert torch.equal(grad_got, grad_want)


@pytest.mark.parametrize("replacement", [True, False])
def test_sample_respects_the_mask_and_is_reproducible(replacement):
    logits = _logits(5, 2, 8)
    legal = _logits(5, 2, 8, seed=7) > 0.0
    legal[..., :3] = True  # at least 3 legal actions per row
    dist = CategoricalPolicy.from_logits(logits, legal)
    k = 3

    def draw(seed):
        return dist.sample(k, generator=torch.Generator().manual_seed(seed), replacement=replacement)

    actions = draw(0)
    assert actions.shape == (5, 2, k) and actions.dtype == torch.long
    assert legal.gather(-1, actions).all()
    assert torch.equal(actions, draw(0))
    if not replacement:
        assert (actions.sort(-1).values.diff(dim=-1) > 0).all()  # distinct within a row
        with pytest.raises(ValueError, match="without replacement"):
            dist.sample(9, replacement=False)
    else:  # the same draws as torch.multinomial on the softmax
        want = torch.multinomial(dist.prior().reshape(-1, 8), k, True, generator=torch.Generator().manual_seed(0))
        assert torch.equal(actions, want.view(5, 2, k))


def test_sample_frequencies_follow_the_policy():
    logits = torch.tensor([[0.0, 1.0, 2.0, -1.0]])
    actions = CategoricalPolicy.from_logits(logits).sample(20_000, generator=torch.Generator().manual_seed(0))
    freq = torch.bincount(actions.flatten(), minlength=4).float() / actions.numel()
    torch.testing.assert_close(freq, torch.softmax(logits, -1)[0], atol=0.02, rtol=0.0)


def test_models_declare_the_categorical_factory():
    from torchrl_muzero.modules import MuZeroMLPModel

    model = MuZeroMLPModel((4,), 3, value_support_size=5, reward_support_size=5)
    dist = policy_distribution(model, _logits(2, 3))
    assert isinstance(dist, CategoricalPolicy) and isinstance(dist, PolicyDistribution)

    class Custom:  # a model may declare its own distribution
        def policy_distribution(self, policy_logits, mask=None):
            return CategoricalPolicy.from_logits(policy_logits * 0.0, mask)

    assert torch.equal(policy_distribution(Custom(), _logits(2, 3)).prior(), torch.full((2, 3), 1 / 3))
