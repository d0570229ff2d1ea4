"""Stochastic MuZero: model and search (chance nodes in the shared loop); the loss is in test_stochastic_loss.py."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from torchrl_muzero.mcts import MCTSConfig, allocate_tree
from torchrl_muzero.mcts.search import muzero_search
from torchrl_muzero.mcts.stochastic import ChanceRule, stochastic_muzero_search, stochastic_search
from torchrl_muzero.modules import MuZeroModel, StochasticMuZeroMLPModel
from torchrl_muzero.modules.stochastic import StochasticMuZeroModel, straight_through_one_hot

INF = math.inf
L = 4  # latent width of the fake models


# --------------------------------------------------------------------------- fake model pair
class _Net(nn.Module):
    """The weights both fakes share: MuZero's dynamics = the stochastic fake's phi then g."""

    def __init__(self, A: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(3)
        self.W = nn.Parameter(torch.randn(L, L, generator=g))
        self.U = nn.Parameter(torch.randn(A, L, generator=g))
        self.P = nn.Parameter(2 * torch.randn(L, A, generator=g))


class FakeMuZero(MuZeroModel):
    """Deterministic MuZero model with zero rewards and values and fixed root priors."""

    def __init__(self, net: _Net, root_logits: torch.Tensor) -> None:
        super().__init__((1,), net.U.shape[0], 2, 2)
        self.net, self.root_logits = net, root_logits

    def represent(self, obs):
        return torch.zeros(obs.shape[0], L) + obs

    def predict(self, latent):
        return latent @ self.net.P, torch.zeros(latent.shape[0], self.value_support.num_bins)

    def dynamics(self, latent, action):
        return torch.tanh(latent @ self.net.W + self.net.U[action]), torch.zeros(latent.shape[0], 5)

    def decode_reward_and_value(self, reward_logits, value_logits):
        return torch.zeros(reward_logits.shape[0]), torch.zeros(value_logits.shape[0])

    def search_root(self, obs):
        step = super().search_root(obs)
        step.policy_logits = self.root_logits.clone()
        step.value = torch.zeros(obs.shape[0])
        return step


class FakeStochastic(StochasticMuZeroModel):
    """phi(s, a) = (s, onehot a); g(as, c) = MuZero's dynamics(s, a) whatever c; sigma on code 0 only."""

    def __init__(self, net: _Net, root_logits: torch.Tensor, chance_logits: list[float]) -> None:
        A = net.U.shape[0]
        super().__init__((1,), A, 2, 2, chance_space_size=len(chance_logits), discount=0.9)
        self.net, self.root_logits = net, root_logits
        self.register_buffer("sigma", torch.tensor(chance_logits))

    def represent(self, obs):
        return torch.cat([torch.zeros(obs.shape[0], L) + obs, torch.zeros(obs.shape[0], self.num_actions)], -1)

    def predict(self, latent):
        return latent[:, :L] @ self.net.P, torch.zeros(latent.shape[0], self.value_support.num_bins)

    def afterstate_dynamics(self, latent, action):
        return torch.cat([latent[:, :L], nn.functional.one_hot(action, self.num_actions).float()], -1)

    def afterstate_prediction(self, afterstate):
        B = afterstate.shape[0]
        return self.sigma.expand(B, -1).clone(), torch.zeros(B, self.value_support.num_bins)

    def chance_dynamics(self, afterstate, code):
        s = torch.tanh(afterstate[:, :L] @ self.net.W + afterstate[:, L:] @ self.net.U)
        return torch.cat([s, torch.zeros_like(afterstate[:, L:])], -1), torch.zeros(afterstate.shape[0], 5)

    def chance_encoder_logits(self, observation, next_observation):
        return torch.zeros(observation.shape[0], self.chance_space_size)

    def decode_value(self, value_logits):
        return torch.zeros(value_logits.shape[0])

    def decode_reward_and_value(self, reward_logits, value_logits):
        return torch.zeros(reward_logits.shape[0]), torch.zeros(value_logits.shape[0])

    def search_root(self, obs):
        step = super().search_root(obs)
        pad = torch.full((obs.shape[0], self.chance_space_size), -INF)
        step.policy_logits = torch.cat([self.root_logits, pad], -1)
        step.value = torch.zeros(obs.shape[0])
        return step


# mctx's test_stochastic_muzero_policy roots and masks, row 0's priors changed so that its visit
# *proportions* at n and 2n simulations agree under this repository's pUCT (the root starts at 0
# visits here, at 1 in mctx); row 1 is mctx's.
ROOT_LOGITS = torch.tensor([[0.0, 0.0, 2.0, 3.0], [0.0, 2.0, 5.0, -4.0]])
LEGAL = torch.tensor([[True, True, True, False], [False, True, False, True]])


def _pair(chance_logits):
    net = _Net(4)
    return FakeMuZero(net, ROOT_LOGITS), FakeStochastic(net, ROOT_LOGITS, chance_logits)


def _config(n, **kw):
    return MCTSConfig(num_simulations=n, dirichlet_fraction=0.0, temperature=0.0, backend="torch", **kw)


def _run_both(chance_logits, n_muzero, n_stochastic):
    mz, smz = _pair(chance_logits)
    obs = torch.tensor([[0.3], [-0.7]])
    a = muzero_search(mz, mz.search_root(obs), _config(n_muzero), LEGAL, add_noise=False)
    b = stochastic_muzero_search(smz, smz.search_root(obs), _config(n_stochastic), LEGAL, add_noise=False)
    return a, b


# --------------------------------------------------------------------------- (a) one chance outcome = MuZero
@pytest.mark.parametrize("chance_logits", [[0.0], [1.0, -INF, -INF, -INF, -INF]], ids=["C=1", "C=5,one-code"])
def test_one_chance_outcome_matches_muzero_at_twice_the_simulations(chance_logits):
    """mctx's invariant: Stochastic MuZero with 2n simulations = MuZero with n (action and visit policy)."""
    n = 10
    mz, smz = _run_both(chance_logits, n, 2 * n)
    assert torch.equal(smz.action, mz.action)
    torch.testing.assert_close(smz.search_policy, mz.search_policy, rtol=0, atol=0)
    assert smz.visit_counts.shape == (2, 4) and smz.visit_counts.sum().item() == 2 * 2 * n


@pytest.mark.parametrize("chance_logits", [[0.0], [1.0, -INF, -INF, -INF, -INF]], ids=["C=1", "C=5,one-code"])
def test_one_chance_outcome_same_root_visits_as_muzero_for_every_budget(chance_logits):
    """The exact form behind it: with uninformative values the root makes MuZero's choices, one per simulation."""
    for m in range(1, 25):
        mz, smz = _run_both(chance_logits, m, m)
        assert torch.equal(smz.visit_counts, mz.visit_counts), m
    # every chance node has a single selectable slot (code 0) and only decision nodes branch
    tree = smz.tree
    is_chance = tree.embeddings["is_chance"]
    A = 4
    kids = tree.children_index
    assert bool((kids[..., A + 1:][is_chance] < 0).all())
    assert bool((kids[..., :A][is_chance] < 0).all()) and bool((kids[..., A:][~is_chance] < 0).all())


def test_the_fake_pair_composes_to_the_same_dynamics():
    mz, smz = _pair([0.0])
    latent = mz.represent(torch.tensor([[0.3], [-0.7]]))
    action = torch.tensor([1, 3])
    expected, _ = mz.dynamics(latent, action)
    afterstate = smz.afterstate_dynamics(smz.represent(torch.tensor([[0.3], [-0.7]])), action)
    got, _ = smz.chance_dynamics(afterstate, torch.ones(2, 1))
    assert torch.equal(got[:, :L], expected)


# --------------------------------------------------------------------------- (b) chance rule
def _chance_tree(sigma):
    C = len(sigma)
    tree = allocate_tree(1, 8, 2 + C, torch.Size([1]), torch.device("cpu"))
    logits = torch.tensor([0.0, 0.0] + list(sigma)).log()
    tree.children_logits[0, 0] = logits
    tree.children_prior[0, 0] = torch.softmax(logits, -1)
    return tree


def test_chance_rule_visits_follow_sigma_deterministically():
    tree = _chance_tree([0.5, 0.25, 0.25])
    rule, node = ChanceRule(num_actions=2), torch.zeros(1, dtype=torch.long)
    counts = [0, 0, 0]
    for n in range(1, 5):
        slot = int(rule(tree, node, 1))
        assert slot >= 2
        counts[slot - 2] += 1
        if tree.children_index[0, 0, slot] < 0:
            tree.children_index[0, 0, slot] = n
        tree.visit_count[0, tree.children_index[0, 0, slot]] += 1
    assert counts == [2, 1, 1]
    tree = _chance_tree([0.0, 1.0])  # log(0) = -inf: code 0 is never selectable, nor the decision slots
    assert [int(rule(tree, node, 1)) for _ in range(3)] == [3, 3, 3]


def test_chance_node_in_a_search_visits_codes_by_sigma():
    """One action: the root's only child is a chance node; sigma [.5, .25, .25] splits its 4 visits [2, 1, 1]."""

    class OneAction(FakeStochastic):
        def afterstate_prediction(self, afterstate):
            B = afterstate.shape[0]
            sigma = torch.tensor([0.5, 0.25, 0.25]).log()
            return sigma.expand(B, -1).clone(), torch.zeros(B, self.value_support.num_bins)

    net = _Net(1)
    model = OneAction(net, torch.zeros(1, 1), [0.0, 0.0, 0.0])
    out = stochastic_muzero_search(model, model.search_root(torch.zeros(1, 1)), _config(5), add_noise=False)
    tree = out.tree
    chance_node = int(tree.children_index[0, 0, 0])
    assert bool(tree.embeddings["is_chance"][0, chance_node])
    kids = tree.children_index[0, chance_node, 1:].long()
    assert tree.visit_count[0, kids].tolist() == [2, 1, 1]


# --------------------------------------------------------------------------- (c) tree structure
def test_tree_edges_rewards_discounts_and_node_types():
    torch.manual_seed(0)
    A, C = 3, 4
    model = StochasticMuZeroMLPModel((5,), A, chance_space_size=C, latent_dim=8, hidden_dim=16,
                                     zero_init_heads=False)
    config = MCTSConfig(num_simulations=30, discount=0.95, backend="auto")
    out = stochastic_search(model, torch.randn(6, 5), config, generator=torch.Generator().manual_seed(1))
    tree = out.tree
    assert out.visit_counts.shape == (6, A) and out.search_policy.shape == (6, A)
    assert torch.equal(out.visit_counts.sum(-1), torch.full((6,), 30))
    torch.testing.assert_close(out.search_policy.sum(-1), torch.ones(6))
    assert bool((out.action < A).all())
    is_chance = tree.embeddings["is_chance"]
    assert not bool(is_chance[:, 0].any())  # the root is a decision node
    expanded = tree.children_index >= 0
    assert bool(expanded[..., :A].logical_and(is_chance[..., None]).logical_not().all())
    assert bool(expanded[..., A:].logical_and(~is_chance[..., None]).logical_not().all())
    dec_edges = expanded & ~is_chance[..., None]  # decision -> chance, slots < A
    chance_edges = expanded & is_chance[..., None]
    assert bool((tree.children_reward[dec_edges] == 0).all())
    assert bool((tree.children_discount[dec_edges] == 1).all())
    torch.testing.assert_close(tree.children_discount[chance_edges],
                               torch.full_like(tree.children_discount[chance_edges], 0.95))
    assert bool(chance_edges.any()) and bool((tree.children_reward[chance_edges] != 0).any())
    # children alternate types
    child = tree.children_index.long().clamp_min(0)
    child_type = torch.gather(is_chance, 1, child.flatten(1)).view_as(child)
    parent_type = is_chance[..., None].expand_as(child)
    assert bool((child_type != parent_type)[expanded].all())


def test_dirichlet_noise_only_on_legal_action_slots():
    model = StochasticMuZeroMLPModel((4,), 3, chance_space_size=2, latent_dim=8, hidden_dim=8)
    mask = torch.tensor([[True, False, True], [False, True, True]])
    out = stochastic_search(model, torch.randn(2, 4), MCTSConfig(num_simulations=4), action_mask=mask,
                            generator=torch.Generator().manual_seed(0))
    prior = out.tree.children_prior[:, 0]
    assert bool((prior[:, :3][~mask] == 0).all()) and bool((prior[:, 3:] == 0).all())
    torch.testing.assert_close(prior.sum(-1), torch.ones(2))
    assert bool((out.visit_counts[~mask] == 0).all())


def test_search_is_reproducible_from_a_generator():
    model = StochasticMuZeroMLPModel((4,), 2, chance_space_size=3, latent_dim=8, hidden_dim=8)
    obs = torch.randn(4, 4)
    runs = [stochastic_search(model, obs, MCTSConfig(num_simulations=12), generator=torch.Generator().manual_seed(5))
            for _ in range(2)]
    assert torch.equal(runs[0].visit_counts, runs[1].visit_counts)
    assert torch.equal(runs[0].action, runs[1].action)


def test_search_rejects_two_player_cpp_and_bad_roots():
    model = StochasticMuZeroMLPModel((4,), 2, chance_space_size=3, latent_dim=8, hidden_dim=8)
    obs = torch.randn(2, 4)
    with pytest.raises(ValueError, match="two-player"):
        stochastic_search(model, obs, MCTSConfig(num_simulations=2), to_play=torch.zeros(2, dtype=torch.long))
    with pytest.raises(ValueError, match="two-player"):
        stochastic_muzero_search(model, model.search_root(obs), MCTSConfig(num_simulations=2), two_player=True)
    root = model.search_root(obs)
    root.policy_logits = root.policy_logits[:, :2]
    with pytest.raises(ValueError, match=r"\[B, A \+ C\]"):
        stochastic_muzero_search(model, root, MCTSConfig(num_simulations=2))
    with pytest.raises(ValueError, match="observations of shape"):
        stochastic_search(model, torch.randn(2, 5), MCTSConfig(num_simulations=2))


def test_cpp_and_torch_backends_give_the_same_search():
    """Where the loaded kernel runs the chance rule (csrc/rules.h), both backends visit alike."""
    from torchrl_muzero.mcts import _cpp
    from torchrl_muzero.mcts.loop import cpp_rules_supported
    from torchrl_muzero.mcts.rules import PUCT
    from torchrl_muzero.mcts.stochastic import StochasticRule

    ops = _cpp.load_tree_ops()
    if not cpp_rules_supported(ops, PUCT(), StochasticRule(PUCT(), ChanceRule(3))):
        with pytest.raises((ValueError, RuntimeError), match="backend='auto'"):
            stochastic_search(StochasticMuZeroMLPModel((4,), 3, chance_space_size=2), torch.randn(2, 4),
                              MCTSConfig(num_simulations=2, backend="cpp"))
        pytest.skip("the loaded C++ kernel does not run Stochastic MuZero's rules")
    torch.manual_seed(0)
    model = StochasticMuZeroMLPModel((4,), 3, chance_space_size=4, latent_dim=8, hidden_dim=16,
                                     zero_init_heads=False)
    model.fused_search_weights = lambda: None  # the C++ rules with the torch model (the fused path: test_stochastic_fused.py)
    obs = torch.randn(5, 4)
    out = {}
    for backend in ("torch", "cpp"):
        config = MCTSConfig(num_simulations=40, discount=0.95, backend=backend)
        out[backend] = stochastic_search(model, obs, config, generator=torch.Generator().manual_seed(2))
    assert torch.equal(out["torch"].visit_counts, out["cpp"].visit_counts)
    assert torch.equal(out["torch"].tree.children_index, out["cpp"].tree.children_index)
    torch.testing.assert_close(out["torch"].root_value, out["cpp"].root_value)


# --------------------------------------------------------------------------- model
def test_straight_through_code_is_one_hot_forward_and_softmax_backward():
    logits = torch.randn(6, 4, requires_grad=True)
    code, probs = straight_through_one_hot(logits)
    assert torch.equal(code.detach(), nn.functional.one_hot(logits.argmax(-1), 4).float())
    w = torch.randn(4)
    (code * w).sum().backward()
    expected = torch.autograd.grad((torch.softmax(logits, -1) * w).sum(), logits)[0]
    torch.testing.assert_close(logits.grad, expected)


def test_lightzero_commitment_form_has_no_gradient_ours_has():
    """``mse(x, ST(x))`` is flat in x (LightZero); ``||sg(c) - softmax(x)||^2`` is not."""
    x = torch.randn(5, 3, requires_grad=True)
    hard = nn.functional.one_hot(x.argmax(-1), 3).float()
    lz = ((x - (hard + x - x.detach())) ** 2).sum()
    assert torch.autograd.grad(lz, x)[0].abs().max() == 0
    code, probs = straight_through_one_hot(x)
    ours = ((code.detach() - probs) ** 2).sum()
    assert torch.autograd.grad(ours, x)[0].abs().max() > 0


def test_model_training_api_shapes_and_errors():
    model = StochasticMuZeroMLPModel((2, 3), 3, chance_space_size=5, latent_dim=8, hidden_dim=8)
    obs = torch.randn(4, 2, 3)
    latent, _, _ = model.initial_inference(obs)
    afterstate, sigma, q = model.afterstate_inference(latent, torch.tensor([0, 1, 2, 0]))
    assert afterstate.shape == latent.shape and sigma.shape == (4, 5) and q.shape == (4, 21)
    code, probs = model.encode_chance(obs, torch.randn(4, 2, 3))
    out = model.chance_inference(afterstate, code)
    assert [t.shape for t in out] == [torch.Size([4, 8]), torch.Size([4, 21]), torch.Size([4, 3]), torch.Size([4, 21])]
    with pytest.raises(ValueError, match="chance_space_size"):
        model.chance_inference(afterstate, code[:, :3])
    with pytest.raises(ValueError, match="next_observation"):
        model.encode_chance(obs, torch.randn(3, 2, 3))
    with pytest.raises(ValueError, match=r"actions must lie in \[0, 3\)"):
        model.afterstate_inference(latent, torch.tensor([0, 1, 2, 3]))
    with pytest.raises(ValueError, match="chance_space_size must be >= 1"):
        StochasticMuZeroMLPModel((2,), 2, chance_space_size=0)
    # MuZero's interface: dynamics takes the most likely code
    nxt, r = model.dynamics(latent, torch.tensor([0, 1, 2, 0]))
    best = nn.functional.one_hot(sigma.argmax(-1), 5).float()
    torch.testing.assert_close(nxt, model.chance_dynamics(afterstate, best)[0])


def test_search_step_matches_the_training_steps():
    torch.manual_seed(1)
    model = StochasticMuZeroMLPModel((4,), 2, chance_space_size=3, latent_dim=8, hidden_dim=8,
                                     zero_init_heads=False)
    root = model.search_root(torch.randn(3, 4))
    mixed = root.state.clone()
    mixed["is_chance"] = torch.tensor([False, True, False])
    step = model.search_step(mixed, torch.tensor([1, 4, 0]), discount=0.5)
    latent = root.state["latent"]
    afterstate, sigma, q = model.afterstate_inference(latent, torch.tensor([1, 0, 0]))
    codes = nn.functional.one_hot(torch.tensor([0, 2, 0]), 3).float()  # row 1: slot 4 = A + code 2
    nxt, r, p, v = model.chance_inference(latent, codes)
    for row in (0, 2):  # decision rows
        torch.testing.assert_close(step.state["latent"][row], afterstate[row])
        assert step.policy_logits[row, :2].isinf().all() and torch.equal(step.policy_logits[row, 2:], sigma[row])
        assert step.reward[row] == 0 and step.discount[row] == 1
        torch.testing.assert_close(step.value[row], model.decode_value(q)[row])
    torch.testing.assert_close(step.state["latent"][1], nxt[1])
    assert torch.equal(step.policy_logits[1, :2], p[1]) and step.policy_logits[1, 2:].isinf().all()
    reward, value = model.decode_reward_and_value(r, v)
    torch.testing.assert_close(step.reward[1], reward[1])
    torch.testing.assert_close(step.value[1], value[1])
    assert step.discount[1] == 0.5
    assert step.state["is_chance"].tolist() == [True, False, True]
    assert model.search_step(mixed, torch.tensor([1, 4, 0])).discount[1] == pytest.approx(0.997)
