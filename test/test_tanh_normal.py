"""TanhNormalPolicy (the sampled family's continuous policy) and the candidate losses cross_entropy_at / kl_at."""
from __future__ import annotations

import math

import pytest
import torch
from torch.distributions import AffineTransform, Independent, Normal, TanhTransform, TransformedDistribution

from torchrl_muzero.modules import CategoricalPolicy, PolicyDistribution, TanhNormalPolicy
from torchrl_muzero.modules.tanh_normal import PRE_TANH_BOUND, SQUASHED_BOUND


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _reference(loc, scale, low, high):
    """torch.distributions' squashed Gaussian, built independently of the module under test."""
    low, high = torch.as_tensor(low, dtype=loc.dtype), torch.as_tensor(high, dtype=loc.dtype)
    base = Normal(loc, scale)
    squashed = TransformedDistribution(base, [TanhTransform(), AffineTransform((low + high) / 2, (high - low) / 2)])
    return Independent(squashed, 1)


def _random_policy(batch, dim, seed=0, dtype=torch.float64):
    g = _gen(seed)
    loc = torch.randn(batch, dim, generator=g, dtype=dtype)
    scale = torch.rand(batch, dim, generator=g, dtype=dtype) + 0.2
    low = -1.0 - torch.arange(dim, dtype=dtype)  # a different box per dimension
    high = 2.0 + 0.5 * torch.arange(dim, dtype=dtype)
    return loc, scale, low, high


@pytest.mark.parametrize("dim", [1, 6])
def test_log_prob_matches_torch_reference(dim):
    loc, scale, low, high = _random_policy(5, dim)
    dist = TanhNormalPolicy(loc, scale, low, high)
    ref = _reference(loc, scale, low, high)
    # in-range actions away from the clamp: y uniform in [-0.95, 0.95]
    y = torch.rand(5, 7, dim, generator=_gen(1), dtype=loc.dtype) * 1.9 - 0.95
    actions = low + (y + 1) / 2 * (high - low)
    want = ref.log_prob(actions.transpose(0, 1)).transpose(0, 1)  # [k, B] in the reference's broadcasting
    assert torch.allclose(dist.log_prob(actions), want, atol=1e-9)
    # one action per batch entry: [B, D] -> [B]
    assert torch.allclose(dist.log_prob(actions[:, 0]), ref.log_prob(actions[:, 0]), atol=1e-9)
    # float32 agrees too
    dist32 = TanhNormalPolicy(loc.float(), scale.float(), low.float(), high.float())
    assert torch.allclose(dist32.log_prob(actions.float()).double(), want, atol=1e-3)


def test_lightzero_log_of_sum_differs_for_many_dims():
    for dim, should_differ in [(1, False), (6, True)]:
        loc, scale, _, _ = _random_policy(4, dim, seed=3)
        dist = TanhNormalPolicy(loc, scale, -1.0, 1.0)
        actions = dist.sample(5, generator=_gen(4))
        ours = dist.log_prob(actions)
        y = actions
        u = torch.atanh(y)
        normal = Normal(loc.unsqueeze(-2), scale.unsqueeze(-2)).log_prob(u).sum(-1)
        lightzero = normal - torch.log((1 - y.pow(2)).sum(-1))  # the log of a sum over the D dims
        reference = _reference(loc, scale, -1.0, 1.0).log_prob(actions.transpose(0, 1)).transpose(0, 1)
        assert torch.allclose(ours, reference, atol=1e-8)
        if should_differ:
            assert (ours - lightzero).abs().min() > 1.0
        else:
            assert torch.allclose(ours, lightzero, atol=1e-8)


def test_samples_inside_bounds_shaped_and_reproducible():
    loc = torch.tensor([[0.0, 50.0, -50.0], [1.0, -2.0, 30.0]])
    low, high = torch.tensor([-2.0, 0.0, -1.0]), torch.tensor([2.0, 1.0, 3.0])
    dist = TanhNormalPolicy(loc, torch.full_like(loc, 0.5), low, high)
    actions = dist.sample(7, generator=_gen(0))
    assert actions.shape == (2, 7, 3)
    assert bool((actions > dist.low).all()) and bool((actions < dist.high).all())
    assert torch.equal(actions, dist.sample(7, generator=_gen(0)))
    assert not torch.equal(actions, dist.sample(7, generator=_gen(1)))
    log_prob = dist.log_prob(actions)
    assert log_prob.shape == (2, 7) and bool(log_prob.isfinite().all())
    # a stored sample's log-prob equals the density of its (clamped) pre-tanh draw
    u = (loc.unsqueeze(-2) + 0.5 * torch.randn(2, 7, 3, generator=_gen(0))).clamp(-PRE_TANH_BOUND, PRE_TANH_BOUND)
    assert torch.allclose(actions, dist.low + (torch.tanh(u) + 1) / 2 * (dist.high - dist.low))
    direct = dist._log_prob_pre_tanh(u, loc.unsqueeze(-2), torch.full((2, 1, 3), 0.5))
    assert torch.allclose(log_prob, direct, rtol=1e-4, atol=1e-2)
    # the clamp bound is the documented constant
    assert PRE_TANH_BOUND == pytest.approx(math.atanh(SQUASHED_BOUND))
    assert bool((actions[0, :, 1] == actions[0, 0, 1]).all())  # loc 50: every draw on the clamp
    # the bounds themselves (the clamp's edge) still give a finite density
    assert bool(dist.log_prob(torch.stack([dist.low, dist.high]).unsqueeze(0).expand(2, 2, 3)).isfinite().all())


def test_rsample_is_differentiable_and_sample_is_not():
    loc = torch.zeros(3, 2, requires_grad=True)
    scale = torch.ones(3, 2, requires_grad=True)
    dist = TanhNormalPolicy(loc, scale, -1.0, 1.0)
    assert not dist.sample(4, generator=_gen(0)).requires_grad
    drawn = dist.rsample(4, generator=_gen(0))
    assert torch.equal(drawn.detach(), dist.sample(4, generator=_gen(0)))
    drawn.pow(2).sum().backward()
    assert loc.grad.abs().sum() > 0 and scale.grad.abs().sum() > 0


def test_density_integrates_to_one():
    loc = torch.tensor([[0.3], [-1.0]], dtype=torch.float64)
    dist = TanhNormalPolicy(loc, torch.tensor([[0.7], [0.4]], dtype=torch.float64), -2.0, 2.0)
    grid = torch.linspace(-2.0, 2.0, 400_001, dtype=torch.float64)
    density = dist.log_prob(grid.view(1, -1, 1).expand(2, -1, 1)).exp()  # [2, N]
    mass = torch.trapezoid(density, grid, dim=-1)
    assert torch.allclose(mass, torch.ones(2, dtype=torch.float64), atol=2e-3)


def test_entropy_close_to_reference_and_differentiable():
    loc = torch.tensor([[0.4], [-1.5]], dtype=torch.float64, requires_grad=True)
    raw_scale = torch.tensor([[0.0], [-1.0]], dtype=torch.float64, requires_grad=True)
    dist = TanhNormalPolicy(loc, torch.nn.functional.softplus(raw_scale), -2.0, 2.0)
    # reference: -integral p log p on a fine grid (D = 1)
    grid = torch.linspace(-2.0, 2.0, 400_001, dtype=torch.float64)
    with torch.no_grad():
        log_p = dist.log_prob(grid.view(1, -1, 1).expand(2, -1, 1))
        reference = -torch.trapezoid(log_p.exp() * log_p, grid, dim=-1)
    estimate = dist.entropy(20_000, generator=_gen(0))
    assert estimate.shape == (2,)
    assert torch.allclose(estimate.detach(), reference, atol=0.03)
    # the default 64 samples: noisy but in the neighbourhood
    assert torch.allclose(dist.entropy(generator=_gen(1)).detach(), reference, atol=0.5)
    estimate.sum().backward()
    assert bool(loc.grad.isfinite().all()) and bool(raw_scale.grad.isfinite().all())
    assert bool((raw_scale.grad > 0).all())  # a wider Gaussian has more entropy here
    # D dims: the entropy of independent dims adds up (same draws per dim would be needed for
    # equality; compare within MC tolerance)
    two = TanhNormalPolicy(torch.tensor([[0.4, -1.5]]), torch.tensor([[0.7, 0.3]]), -2.0, 2.0)
    one_a = TanhNormalPolicy(torch.tensor([[0.4]]), torch.tensor([[0.7]]), -2.0, 2.0)
    one_b = TanhNormalPolicy(torch.tensor([[-1.5]]), torch.tensor([[0.3]]), -2.0, 2.0)
    total = one_a.entropy(20_000, _gen(2)) + one_b.entropy(20_000, _gen(3))
    assert torch.allclose(two.entropy(20_000, _gen(4)), total, atol=0.05)


def test_from_params_learned_and_fixed_sigma():
    params = torch.tensor([[0.5, -0.5, 0.0, -3.0]], requires_grad=True)
    learned = TanhNormalPolicy.from_params(params, -1.0, 1.0)
    assert torch.equal(learned.loc, params[:, :2])
    assert torch.allclose(learned.scale, torch.nn.functional.softplus(params[:, 2:]) + 1e-3)
    learned.entropy(16, _gen(0)).sum().backward()
    assert params.grad[:, 2:].abs().sum() > 0  # the learned scale gets a gradient
    params.grad = None
    fixed = TanhNormalPolicy.from_params(params, -1.0, 1.0, sigma=0.3)
    assert torch.equal(fixed.scale, torch.full((1, 2), 0.3))
    fixed.entropy(16, _gen(0)).sum().backward()
    assert torch.equal(params.grad[:, 2:], torch.zeros(1, 2))  # the second half is ignored
    tiny = TanhNormalPolicy.from_params(torch.tensor([[0.0, -100.0]]), -1.0, 1.0, min_scale=1e-2)
    assert torch.allclose(tiny.scale, torch.tensor([[1e-2]]))
    with pytest.raises(ValueError, match=r"\[\.\.\., 2D\]"):
        TanhNormalPolicy.from_params(torch.zeros(2, 3), -1.0, 1.0)


def test_indexing_shapes_mode_and_scale():
    loc, scale, low, high = _random_policy(4, 3, seed=5)
    loc, scale = loc.view(2, 2, 3), scale.view(2, 2, 3)
    dist = TanhNormalPolicy(loc, scale, low, high)
    assert isinstance(dist, PolicyDistribution)
    assert dist.batch_shape == (2, 2) and dist.event_shape == (3,)
    roots = dist[:, 0]
    assert roots.batch_shape == (2,) and torch.equal(roots.loc, loc[:, 0])
    actions = dist.sample(5, generator=_gen(0))
    assert torch.equal(roots.log_prob(actions[:, 0]), dist.log_prob(actions)[:, 0])
    assert dist[1].batch_shape == (2,)
    assert repr(roots) == f"TanhNormalPolicy(batch_shape=[2], D=3, low={low.tolist()}, high={high.tolist()})"
    assert torch.allclose(dist.mode(), low + (torch.tanh(loc) + 1) / 2 * (high - low))
    assert torch.equal(dist.with_scale(2.0).scale, scale * 2.0) and torch.equal(dist.with_scale(2.0).loc, loc)
    with pytest.raises(ValueError, match="high > low"):
        TanhNormalPolicy(torch.zeros(2), torch.ones(2), 1.0, torch.tensor([2.0, 0.5]))
    with pytest.raises(ValueError, match="broadcast"):
        TanhNormalPolicy(torch.zeros(2), torch.ones(2), torch.zeros(3), 1.0)
    with pytest.raises(ValueError, match="log_prob"):
        dist.log_prob(torch.zeros(3))


def test_no_prior_without_candidates():
    dist = TanhNormalPolicy(torch.zeros(2, 1), torch.ones(2, 1), -1.0, 1.0)
    with pytest.raises(NotImplementedError, match="SampledProposal"):
        dist.prior()
    with pytest.raises(NotImplementedError, match="cross_entropy_at"):
        dist.cross_entropy(torch.ones(2, 3) / 3)
    with pytest.raises(NotImplementedError, match="kl_at"):
        dist.kl_from(torch.ones(2, 3) / 3)
    target = torch.tensor([[1.0, 0.0, 0.0, 0.0]])
    assert torch.allclose(dist.smooth_target(target, 0.2), torch.tensor([[0.85, 0.05, 0.05, 0.05]]))


def test_cross_entropy_at_categorical_by_hand():
    leaf = torch.tensor([[math.log(0.5), math.log(0.25), math.log(0.25), 0.0]], requires_grad=True)
    mask = torch.tensor([[True, True, True, False]])
    dist = CategoricalPolicy.from_logits(leaf, mask)
    candidates = torch.tensor([[0, 3, 1]])  # slot 1: an illegal action, log pi = -inf, target 0
    target = torch.tensor([[0.6, 0.0, 0.4]])
    ce = dist.cross_entropy_at(candidates, target)
    assert torch.allclose(ce, torch.tensor([-(0.6 * math.log(0.5) + 0.4 * math.log(0.25))]))
    ce.sum().backward()
    assert bool(leaf.grad.isfinite().all())
    # kl_at: the cross-entropy minus the target's entropy (0 log 0 = 0)
    entropy = -(0.6 * math.log(0.6) + 0.4 * math.log(0.4))
    assert torch.allclose(dist.kl_at(candidates, target), ce.detach() - entropy)
    # the target equals pi renormalised over candidates that carry all of pi's mass: KL 0
    full = torch.tensor([[2, 0, 1]])
    assert dist.kl_at(full, torch.tensor([[0.25, 0.5, 0.25]])).abs().item() < 1e-6
    # candidates carrying 3/4 of pi's mass: KL = -log(3/4)
    part = torch.tensor([[0, 1]])
    assert dist.kl_at(part, torch.tensor([[2 / 3, 1 / 3]])).item() == pytest.approx(-math.log(0.75), abs=1e-6)
    # duplicate candidates (draws with replacement) count once per slot
    dup = dist.cross_entropy_at(torch.tensor([[0, 0]]), torch.tensor([[0.5, 0.5]]))
    assert dup.item() == pytest.approx(-math.log(0.5))


def test_cross_entropy_at_batches_like_a_loop():
    g = _gen(7)
    logits = torch.randn(2, 3, 5, generator=g)
    candidates = torch.randint(0, 5, (2, 3, 4), generator=g)
    target = torch.softmax(torch.randn(2, 3, 4, generator=g), -1)
    got = CategoricalPolicy.from_logits(logits).cross_entropy_at(candidates, target)
    assert got.shape == (2, 3)
    for i in range(2):
        for j in range(3):
            want = -(target[i, j] * torch.log_softmax(logits[i, j], -1)[candidates[i, j]]).sum()
            assert torch.allclose(got[i, j], want)
    with pytest.raises(ValueError, match="do not match target"):
        CategoricalPolicy.from_logits(logits).cross_entropy_at(candidates, target[..., :3])


def test_cross_entropy_at_tanh_normal():
    loc = torch.tensor([[0.2, -0.4], [1.0, 0.0]], requires_grad=True)
    dist = TanhNormalPolicy(loc, torch.full((2, 2), 0.5), -2.0, 2.0)
    candidates = dist.sample(4, generator=_gen(0))
    target = torch.tensor([[0.5, 0.5, 0.0, 0.0], [0.1, 0.2, 0.3, 0.4]])
    ce = dist.cross_entropy_at(candidates, target)
    want = -(target * dist.log_prob(candidates)).sum(-1)
    assert torch.allclose(ce, want)
    kl = dist.kl_at(candidates, target)
    assert torch.allclose(kl, want + torch.xlogy(target, target).sum(-1))
    ce.sum().backward()
    assert loc.grad.abs().sum() > 0
    # a zero-target slot holding a NaN candidate (an unfilled slot) contributes nothing
    holes = candidates.detach().clone()
    holes[0, 3] = float("nan")
    assert torch.allclose(dist.cross_entropy_at(holes, target), want.detach())
