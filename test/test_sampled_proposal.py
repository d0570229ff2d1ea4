"""SampledProposal: the sampled family's candidates and the pUCT prior over them (Hubert et al. 2021)."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from torchrl_muzero.modules.sampled_proposal import SampledProposal
from torchrl_muzero.modules import CategoricalPolicy, TanhNormalPolicy


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _per_action(candidates: torch.Tensor, slot_logits: torch.Tensor, num_actions: int) -> torch.Tensor:
    """The normalised slot prior summed per action: the prior the search puts on each action."""
    prior = torch.softmax(slot_logits, -1)
    return torch.zeros(*candidates.shape[:-1], num_actions).scatter_add(-1, candidates, prior)


# -- discrete ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_enumerating_every_action_gives_pi(temperature):
    logits = torch.randn(5, 6, generator=_gen(0)) * 2
    pi = CategoricalPolicy.from_logits(logits)
    uniform_beta = CategoricalPolicy.from_logits(torch.zeros(5, 6))
    proposal = SampledProposal(num_samples=6, temperature=temperature)
    for beta in [uniform_beta, None]:  # K = A: the set is every action whatever beta is
        candidates, slot_logits = proposal.draw(pi, _gen(1), proposal_policy=beta)
        assert candidates.dtype == torch.long and candidates.shape == (5, 6)
        assert torch.equal(candidates.sort(-1).values, torch.arange(6).expand(5, 6))  # a permutation
        assert torch.allclose(_per_action(candidates, slot_logits, 6), torch.softmax(logits, -1), atol=1e-6)
    # LightZero's uniform prior does not reduce to pi here
    candidates, slot_logits = SampledProposal(num_samples=6, prior="uniform").draw(pi, _gen(1))
    assert torch.allclose(_per_action(candidates, slot_logits, 6), torch.full((5, 6), 1 / 6))


def test_with_replacement_the_paper_prior_tends_to_pi():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -2.0], [0.0, 0.5, 1.0, 1.5, 3.0]])
    pi = CategoricalPolicy.from_logits(logits)
    want = torch.softmax(logits, -1)
    beta_t2 = torch.softmax(logits / 2, -1)
    assert (beta_t2 - want).abs().max() > 0.2  # the temperature changes the proposal a lot
    k = 4000
    for prior in ["paper", "uniform"]:  # beta = pi: both are the empirical distribution, -> pi
        candidates, slot_logits = SampledProposal(k, prior=prior, replacement=True).draw(pi, _gen(0))
        assert candidates.shape == (2, k)
        assert (_per_action(candidates, slot_logits, 5) - want).abs().max() < 0.02
    paper = SampledProposal(k, prior="paper", temperature=2.0, replacement=True).draw(pi, _gen(1))
    uniform = SampledProposal(k, prior="uniform", temperature=2.0, replacement=True).draw(pi, _gen(1))
    assert torch.equal(paper[0], uniform[0])  # same draws: only the prior differs
    assert (_per_action(*paper, 5) - want).abs().max() < 0.02  # the importance ratio corrects the temperature
    assert (_per_action(*uniform, 5) - want).abs().max() > 0.15  # uniform gives beta, not pi
    assert (_per_action(*uniform, 5) - beta_t2).abs().max() < 0.02


def test_draws_follow_beta_at_the_temperature():
    # the first Gumbel-top-k slot is one draw from beta: its frequencies are beta's probabilities
    logits = torch.tensor([2.0, 0.0, -1.0, -3.0]).expand(20_000, 4)
    pi = CategoricalPolicy.from_logits(logits)
    for temperature in [1.0, 3.0]:
        candidates, _ = SampledProposal(2, temperature=temperature).draw(pi, _gen(2))
        freq = torch.bincount(candidates[:, 0], minlength=4).float() / 20_000
        assert (freq - torch.softmax(logits[0] / temperature, -1)).abs().max() < 0.015


def test_discrete_candidates_are_legal_and_distinct():
    rows, num_actions, k = 400, 10, 4
    g = _gen(3)
    logits = torch.randn(rows, num_actions, generator=g) * 2
    legal = torch.rand(rows, num_actions, generator=g) < torch.rand(rows, 1, generator=g)
    legal[torch.arange(rows), torch.randint(0, num_actions, (rows,), generator=g)] = True  # >= 1 legal
    pi = CategoricalPolicy.from_logits(logits)
    num_legal = legal.sum(-1)
    assert bool((num_legal < k).any()) and bool((num_legal > k).any())
    for prior in ["paper", "uniform"]:
        candidates, slot_logits = SampledProposal(k, prior=prior, temperature=1.5).draw(pi, _gen(4), legal)
        assert bool(legal.gather(-1, candidates).all())  # padding slots included
        for row in range(rows):
            n = int(num_legal[row])
            drawn = candidates[row, : min(n, k)].tolist()
            assert len(set(drawn)) == len(drawn)
            assert bool(slot_logits[row, : min(n, k)].isfinite().all())
            if n < k:
                assert set(drawn) == set(torch.nonzero(legal[row]).flatten().tolist())
                assert bool((slot_logits[row, n:] == -math.inf).all())
        # rows whose legal set is drawn entirely get pi over it (paper) or uniform over it
        covered = num_legal <= k
        got = _per_action(candidates, slot_logits, num_actions)[covered]
        if prior == "paper":
            want = torch.softmax(logits.masked_fill(~legal, -math.inf), -1)[covered]
        else:
            want = legal[covered].float() / num_legal[covered, None]
        assert torch.allclose(got, want, atol=1e-6)
    # with replacement: K i.i.d. legal draws, duplicates allowed, no padding
    candidates, slot_logits = SampledProposal(k, replacement=True).draw(pi, _gen(5), legal)
    assert bool(legal.gather(-1, candidates).all()) and bool(slot_logits.isfinite().all())
    assert any(len(set(row.tolist())) < k for row in candidates)


def test_policy_mask_counts_as_illegal_and_k_above_num_actions():
    mask = torch.tensor([[True, False, True], [True, True, True]])
    pi = CategoricalPolicy.from_logits(torch.tensor([[0.0, 5.0, 1.0], [0.0, 1.0, 2.0]]), mask)
    candidates, slot_logits = SampledProposal(5).draw(pi, _gen(0))
    assert candidates.shape == (2, 5)
    assert set(candidates[0].tolist()) == {0, 2} and set(candidates[1, :3].tolist()) == {0, 1, 2}
    assert torch.equal(slot_logits.isfinite(), torch.tensor([[True] * 2 + [False] * 3, [True] * 3 + [False] * 2]))
    with pytest.raises(ValueError, match="no legal action"):
        SampledProposal(2).draw(pi, _gen(0), legal=torch.tensor([[False, True, False], [True, True, True]]))


def test_draws_are_reproducible():
    pi = CategoricalPolicy.from_logits(torch.randn(8, 12, generator=_gen(0)))
    proposal = SampledProposal(5, temperature=1.3)
    first = proposal.draw(pi, _gen(9))
    assert all(torch.equal(a, b) for a, b in zip(first, proposal.draw(pi, _gen(9))))
    assert not torch.equal(first[0], proposal.draw(pi, _gen(10))[0])


# -- continuous --------------------------------------------------------------------------------------
def _box(batch=32, loc=0.8, scale=0.5):
    return TanhNormalPolicy(torch.full((batch, 1), loc), torch.full((batch, 1), scale), -1.0, 1.0)


def test_continuous_paper_prior_with_beta_pi_is_uniform():
    pi = TanhNormalPolicy(torch.randn(4, 3, generator=_gen(0)), torch.rand(4, 3, generator=_gen(1)) + 0.1, -2.0, 2.0)
    candidates, slot_logits = SampledProposal(20).draw(pi, _gen(2))
    assert candidates.shape == (4, 20, 3) and slot_logits.shape == (4, 20)
    assert torch.allclose(slot_logits, slot_logits[:, :1].expand(4, 20), atol=1e-5)
    # with a proposal other than pi, the logits are the importance ratio log pi - log beta
    beta = pi.with_scale(2.0)
    candidates, slot_logits = SampledProposal(20).draw(pi, _gen(2), proposal_policy=beta)
    assert torch.allclose(slot_logits, pi.log_prob(candidates) - beta.log_prob(candidates))
    assert slot_logits.std() > 0.1


def _estimate(proposal: SampledProposal, pi: TanhNormalPolicy, seed: int) -> torch.Tensor:
    """The prior-weighted mean of f(a) = a over each row's slots: an estimate of E_pi[a]."""
    candidates, slot_logits = proposal.draw(pi, _gen(seed))
    return (torch.softmax(slot_logits, -1) * candidates[..., 0]).sum(-1)


@pytest.mark.parametrize("kwargs", [{"temperature": 2.0}, {"widened_fraction": 0.5}, {"widened_fraction": 1.0}])
def test_continuous_paper_prior_is_importance_sampling_consistent(kwargs):
    pi = _box()
    expected = pi[0].sample(1_000_000, generator=_gen(1))[..., 0].mean()
    errors = {}
    for k in [16, 4000]:
        errors[k] = (_estimate(SampledProposal(k, **kwargs), pi, 2) - expected).abs().mean()
    assert errors[4000] < 0.02  # (about 0.004: 1/sqrt(K) shrinkage)
    assert errors[4000] < errors[16] / 4
    # LightZero's uniform prior estimates E_beta[a] instead: off by ~0.12 whatever K
    uniform = (_estimate(SampledProposal(4000, prior="uniform", **kwargs), pi, 2) - expected).abs().mean()
    assert uniform > 0.08


def test_widened_mixture_draws():
    loc = torch.tensor([[3.0, -3.0], [0.0, 0.0]])
    pi = TanhNormalPolicy(loc, torch.full((2, 2), 0.2), -1.0, torch.tensor([1.0, 4.0]))
    proposal = SampledProposal(16, widened_fraction=0.75, widen_factor=3.0)
    assert proposal.num_widened == 12
    candidates, slot_logits = proposal.draw(pi, _gen(0))
    assert candidates.shape == (2, 16, 2)
    assert bool((candidates > pi.low).all()) and bool((candidates < pi.high).all())
    assert bool(slot_logits.isfinite().all())
    # the last 12 slots come from the widened policy: more spread than the first 4
    assert candidates[:, 4:].std(1).mean() > candidates[:, :4].std(1).mean()
    # the mixture density, by hand
    wide = pi.with_scale(3.0)
    mixture = torch.logaddexp(pi.log_prob(candidates) + math.log(4 / 16), wide.log_prob(candidates) + math.log(12 / 16))
    assert torch.allclose(slot_logits, pi.log_prob(candidates) - mixture, atol=1e-5)


def test_draw_rejects_mismatched_inputs():
    box, cat = _box(2), CategoricalPolicy.from_logits(torch.zeros(2, 3))
    with pytest.raises(ValueError, match="widened_fraction"):
        SampledProposal(2, widened_fraction=0.5).draw(cat)
    with pytest.raises(ValueError, match="legal masks"):
        SampledProposal(2).draw(box, legal=torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(TypeError, match="proposal_policy"):
        SampledProposal(2).draw(box, proposal_policy=cat)
    with pytest.raises(ValueError, match="legal"):
        SampledProposal(2).draw(cat, legal=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(TypeError, match="no sampling rule"):
        SampledProposal(2).draw(object())


# -- configuration -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "field, value",
    [
        ("num_samples", 0),
        ("num_samples", 2.5),
        ("num_samples", True),
        ("prior", "density"),
        ("temperature", 0.0),
        ("temperature", float("nan")),
        ("temperature", float("inf")),
        ("replacement", "yes"),
        ("widened_fraction", -0.1),
        ("widened_fraction", 1.5),
        ("widen_factor", 0),
    ],
)
def test_bad_field_values_name_the_field(field, value):
    with pytest.raises(ValueError) as info:
        SampledProposal(**{field: value})
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(f"SampledProposal: {field} must be ")
    assert repr(value) in message


def test_frozen_and_described():
    proposal = SampledProposal()
    fields = (proposal.num_samples, proposal.prior, proposal.temperature, proposal.replacement)
    assert fields == (20, "paper", 1.0, False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        proposal.num_samples = 5
    line = SampledProposal(8, temperature=0.5, replacement=True).describe()
    assert "\n" not in line and "K=8" in line and "with replacement" in line and "temperature=0.5" in line
