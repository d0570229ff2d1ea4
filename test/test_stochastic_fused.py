"""The fused C++ search for StochasticMuZeroMLPModel (``stochastic_search`` in torchrl_muzero/csrc).

As for MuZero's fused search (test/test_fused_search.py, whose module
docstring explains the tolerances), the kernel runs the network with its own
loops, so its float32 results are close to the torch model's, not
bit-identical:

* the network step (test hook ``stochastic_recurrent``) against
  ``model.search_step`` and a float64 copy of the model, on batches mixing
  decision rows (-> afterstates) and chance rows (-> states);
* whole searches against the plain-torch path: identical visit counts on at
  least 95 % of the roots, identical root priors (drawn before the kernel
  runs), and, where the trees are identical, the same per-edge rewards and
  discounts and node kinds;
* results independent of the batch size and of the vector width (bitwise);
* the fallback to the per-simulation loop when the model does not qualify.
"""
from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict

from torchrl_muzero.mcts import MCTSConfig
from torchrl_muzero.mcts import _cpp
from torchrl_muzero.mcts.stochastic import stochastic_muzero_search, stochastic_search
from torchrl_muzero.modules import StochasticMuZeroMLPModel
from torchrl_muzero.modules.step import ModelStep

_OPS = _cpp.load_tree_ops()
pytestmark = pytest.mark.skipif(
    _OPS is None or not hasattr(_OPS, "stochastic_search"),
    reason=f"fused Stochastic MuZero search not built: {_cpp.tree_ops_unavailable_reason() or 'stale build'}",
)

GAMMA = 0.997


def _model(seed, obs_dim=5, A=6, C=8, latent=32, hidden=48, support=10, head_scale=3.0, layers=1):
    torch.manual_seed(seed)
    model = StochasticMuZeroMLPModel(
        (obs_dim,), A, chance_space_size=C, latent_dim=latent, hidden_dim=hidden, value_support_size=support,
        reward_support_size=support, num_layers=layers, zero_init_heads=False,
    ).eval()
    with torch.no_grad():  # values of a few units rather than ~0.1, as after some training
        for layer in (model.prediction_head, model.reward_head[-1], model.afterstate_value_head, model.chance_head):
            layer.weight.mul_(head_scale)
    return model


def _mixed_batch(model, B, seed):
    """``B`` random latents, half decision rows (slot < A), half chance rows (slot A + c)."""
    A, C = model.num_actions, model.chance_space_size
    g = torch.Generator().manual_seed(seed)
    latent = torch.rand(B, model.latent_dim, generator=g)
    is_chance = torch.rand(B, generator=g) < 0.5
    action = torch.where(is_chance, A + torch.randint(C, (B,), generator=g), torch.randint(A, (B,), generator=g))
    return latent, is_chance, action


def _step(model, latent, is_chance, action, baseline=False):
    tensors, reward_eps, value_eps = model.fused_search_weights()
    return _OPS.stochastic_recurrent(tensors, reward_eps, value_eps, latent, is_chance, action, GAMMA, baseline)


def _torch_step(model, latent, is_chance, action):
    state = TensorDict({"latent": latent, "is_chance": is_chance}, [latent.shape[0]])
    return model.search_step(state, action, discount=GAMMA)


# ----------------------------------------------------------------------------
# The network step
# ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "latent,hidden,A,C,support,B",
    [(64, 64, 6, 32, 300, 64), (16, 24, 2, 3, 10, 7), (32, 48, 9, 1, 300, 1), (8, 8, 3, 17, 5, 33),
     (20, 70, 18, 5, 300, 40)],
)
def test_network_step_matches_search_step(latent, hidden, A, C, support, B):
    model = _model(latent + A + C, A=A, C=C, latent=latent, hidden=hidden, support=support)
    model64 = copy.deepcopy(model).double()
    lat, is_chance, act = _mixed_batch(model, B, B)
    ref = _torch_step(model, lat, is_chance, act)
    ref64 = _torch_step(model64, lat.double(), is_chance, act)
    new_latent, reward, logits, value, prior, discount = _step(model, lat, is_chance, act)

    # Latents and logits: a few float32 ulps from the torch model and from the truth; -inf where it has -inf.
    torch.testing.assert_close(new_latent, ref.state["latent"], rtol=0, atol=1e-6)
    assert (new_latent.double() - ref64.state["latent"]).abs().max() < 1e-6
    finite = ref.policy_logits.isfinite()
    assert torch.equal(logits.isfinite(), finite) and (logits[~finite] == -float("inf")).all()
    torch.testing.assert_close(logits[finite], ref.policy_logits[finite], rtol=1e-5, atol=1e-6)
    assert ((logits[finite].double() - ref64.policy_logits[finite]).abs() / (1 + ref64.policy_logits[finite].abs())
            ).max() < 1e-6
    torch.testing.assert_close(prior, torch.softmax(ref.policy_logits, -1), rtol=1e-5, atol=1e-7)
    assert torch.equal(prior[~finite], torch.zeros_like(prior[~finite]))
    torch.testing.assert_close(prior.sum(-1), torch.ones(B), rtol=0, atol=1e-6)

    # Edges: reward 0 and discount 1 into a chance node, the search's discount into a decision node.
    assert torch.equal(discount, ref.discount)
    assert torch.equal(reward[~is_chance], torch.zeros(int((~is_chance).sum())))

    # Reward and value: within the float32 h^-1 step of the float64 truth, no further from it than torch's.
    for ours, torch32, truth in ((reward, ref.reward, ref64.reward), (value, ref.value, ref64.value)):
        err = (ours.double() - truth).abs()
        assert (err <= 1e-3 * (1 + truth.abs()).sqrt()).all(), err.max()
        torch_err = (torch32.double() - truth).abs().max().item()
        assert err.max().item() <= 3 * torch_err + 2e-4
        torch.testing.assert_close(ours, torch32, rtol=1e-4, atol=1e-3)


def test_out_of_range_slots_are_clamped_as_search_step_does():
    # A decision row with a chance slot, a chance row with an action slot: search_step clamps
    # (a -> A - 1, c -> 0); the search never asks for either, but the kernel agrees anyway.
    model = _model(3, A=3, C=4, latent=8, hidden=8)
    lat = torch.rand(2, 8)
    is_chance = torch.tensor([False, True])
    act = torch.tensor([5, 1])
    ours = _step(model, lat, is_chance, act)
    ref = _torch_step(model, lat, is_chance, act)
    torch.testing.assert_close(ours[0], ref.state["latent"], rtol=0, atol=1e-6)


@pytest.mark.parametrize("latent,hidden,A,C,support,B", [(64, 64, 6, 32, 300, 37), (13, 21, 5, 3, 7, 9),
                                                          (8, 8, 2, 2, 3, 1)])
def test_vector_widths_agree_bitwise(latent, hidden, A, C, support, B):
    model = _model(B, A=A, C=C, latent=latent, hidden=hidden, support=support)
    lat, is_chance, act = _mixed_batch(model, B, 0)
    wide = _step(model, lat, is_chance, act)
    narrow = _step(model, lat, is_chance, act, baseline=True)
    for x, y in zip(wide, narrow):
        assert torch.equal(x, y)


def test_network_step_is_independent_of_the_batch():
    # A row alone, or among others of either kind, in any group of 32: the same bits.
    model = _model(7, A=6, C=32, latent=64, hidden=64, support=300)
    lat, is_chance, act = _mixed_batch(model, 70, 1)
    batch = _step(model, lat, is_chance, act)
    for i in (0, 5, 33, 69):
        one = _step(model, lat[i : i + 1], is_chance[i : i + 1], act[i : i + 1])
        for x, y in zip(one, batch):
            assert torch.equal(x[0], y[i])


# ----------------------------------------------------------------------------
# Whole searches against the plain-torch path
# ----------------------------------------------------------------------------
def _search(model, obs, backend, seed, **kw):
    cfg = MCTSConfig(num_simulations=50, backend=backend, discount=GAMMA)
    return stochastic_search(model, obs, cfg, generator=torch.Generator().manual_seed(seed), **kw)


CASES = [
    # (B, roots in total, add_noise, masked)
    (1, 16, True, False),
    (1, 16, False, True),
    (7, 56, True, True),
    (64, 128, False, False),
]


@pytest.mark.parametrize("B,roots,add_noise,masked", CASES)
def test_search_matches_torch_path(B, roots, add_noise, masked):
    same_visits = total = 0
    for seed in range(roots // B):
        A, C = (2, 4, 6, 9)[seed % 4], (1, 3, 8, 32)[seed % 4]
        model = _model(100 * B + seed, A=A, C=C, support=(10, 300)[seed % 2])
        g = torch.Generator().manual_seed(seed)
        obs = 2 * torch.randn(B, 5, generator=g)
        mask = None
        if masked:
            mask = torch.rand(B, A, generator=g) < 0.6
            mask[torch.arange(B), torch.randint(A, (B,), generator=g)] = True
        ref = _search(model, obs, "torch", seed, action_mask=mask, add_noise=add_noise)
        fused = _search(model, obs, "cpp", seed, action_mask=mask, add_noise=add_noise)
        assert torch.equal(ref.tree.children_prior[:, 0], fused.tree.children_prior[:, 0])
        assert fused.visit_counts.sum(-1).eq(50).all()
        if masked:
            assert fused.visit_counts[~mask].eq(0).all()
        equal = ref.visit_counts.eq(fused.visit_counts).all(-1)
        trees = ref.tree.children_index.eq(fused.tree.children_index).flatten(1).all(-1)
        # On identical trees: the same node kinds, edge discounts (exact) and rewards and values (h^-1 step).
        kinds = ref.tree.embeddings["is_chance"].eq(fused.tree.embeddings["is_chance"]).all(-1)
        assert kinds[trees].all()
        assert torch.equal(ref.tree.children_discount[trees], fused.tree.children_discount[trees])
        torch.testing.assert_close(fused.tree.children_reward[trees], ref.tree.children_reward[trees],
                                   rtol=1e-4, atol=1e-3)
        v_ref, v_fused = ref.root_value[trees].double(), fused.root_value[trees].double()
        assert ((v_ref - v_fused).abs() <= 1e-3 + 1e-4 * v_ref.abs()).all()
        same_visits += int(equal.sum())
        total += B
    assert same_visits >= 0.95 * total, (same_visits, total)


def test_fused_tree_edges_follow_the_node_kinds():
    model = _model(11, A=4, C=5)
    out = _search(model, 2 * torch.randn(9, 5), "cpp", 0)
    tree = out.tree
    kind = tree.embeddings["is_chance"]
    child = tree.children_index.long()
    parent_chance = kind[:, :, None].expand_as(child)
    expanded = child >= 0
    assert not kind[:, 0].any()
    # Every child has the other kind than its parent; chance nodes expand code slots only.
    child_kind = torch.gather(kind, 1, child.clamp_min(0).flatten(1)).view_as(child)
    assert torch.equal(child_kind[expanded], ~parent_chance[expanded])
    slot = torch.arange(4 + 5).expand_as(child)
    assert (slot[expanded & parent_chance] >= 4).all() and (slot[expanded & ~parent_chance] < 4).all()
    # Decision -> chance edges: reward 0, discount 1; chance -> decision: the search's discount.
    dec = expanded & ~parent_chance
    assert tree.children_reward[dec].eq(0).all() and tree.children_discount[dec].eq(1).all()
    assert tree.children_discount[expanded & parent_chance].eq(torch.tensor(GAMMA)).all()
    # Node logits: -inf on the other kind's slots.
    logits = tree.children_logits[:, 1 : tree.num_nodes]
    is_c = kind[:, 1 : tree.num_nodes, None]
    assert torch.equal(logits[..., :4].isinf(), is_c.expand(-1, -1, 4))
    assert torch.equal(logits[..., 4:].isinf(), ~is_c.expand(-1, -1, 5))


def test_fused_search_is_batch_invariant():
    # One root searched alone or among 63 others gives the same tree, bit for bit.
    model = _model(5, A=6, C=32, latent=24, hidden=40, support=300)
    g = torch.Generator().manual_seed(0)
    root = model.search_root(2 * torch.randn(64, 5, generator=g))
    cfg = MCTSConfig(num_simulations=30, backend="cpp")
    batch = stochastic_muzero_search(model, root, cfg, add_noise=False)
    for i in (0, 13, 63):
        one_root = ModelStep(root.state[i : i + 1], root.reward[i : i + 1], root.policy_logits[i : i + 1],
                             root.value[i : i + 1])
        one = stochastic_muzero_search(model, one_root, cfg, add_noise=False)
        for name, t in one.tree.tensors().items():
            ref = getattr(batch.tree, name)
            if isinstance(t, torch.Tensor):
                assert torch.equal(t[0], ref[i]), name
            else:  # the node state
                for key in ("latent", "is_chance"):
                    assert torch.equal(t[key][0], ref[key][i]), (name, key)


# ----------------------------------------------------------------------------
# When the fused path is (not) taken
# ----------------------------------------------------------------------------
def test_fused_path_is_taken_only_for_one_hidden_layer_float32_mlps():
    model = _model(0, A=3, C=4, latent=8, hidden=8)
    assert model.fused_search_weights() is not None
    assert _model(0, A=3, C=4, latent=8, hidden=8, layers=2).fused_search_weights() is None
    assert copy.deepcopy(model).double().fused_search_weights() is None

    class Custom(StochasticMuZeroMLPModel):
        def afterstate_prediction(self, afterstate):
            return super().afterstate_prediction(afterstate)

    torch.manual_seed(0)
    assert Custom((5,), 3, chance_space_size=4, latent_dim=8, hidden_dim=8).fused_search_weights() is None

    # The fused search never calls the Python step; the torch backend does.
    obs = torch.randn(3, 5)
    model.search_step = None  # any call would raise
    out = _search(model, obs, "cpp", 0)
    assert out.visit_counts.sum(-1).eq(50).all()
    assert out.tree.embeddings["latent"][:, 1:].abs().sum() > 0  # the kernel wrote every node's latent
    assert out.tree.embeddings["is_chance"][:, 1:].any()
    with pytest.raises(TypeError):
        _search(model, obs, "torch", 0)

    # Models that do not qualify search through the per-simulation loop, with the same result shape.
    for other in (_model(0, A=3, C=4, latent=8, hidden=8, layers=2), Custom((5,), 3, chance_space_size=4,
                                                                            latent_dim=8, hidden_dim=8)):
        assert _search(other.eval(), obs, "cpp", 0).visit_counts.sum(-1).eq(50).all()


def test_kernel_rejects_a_searched_tree_and_bad_inputs():
    model = _model(1, A=3, C=4, latent=8, hidden=8)
    out = _search(model, torch.randn(2, 5), "cpp", 0)
    tensors, reward_eps, value_eps = model.fused_search_weights()
    from torchrl_muzero.mcts.rules import PUCT
    from torchrl_muzero.mcts.stochastic import ChanceRule, StochasticRule

    with pytest.raises(RuntimeError, match="searched already"):
        _cpp.cpp_stochastic_search(out.tree, tensors, reward_eps, value_eps, GAMMA, PUCT(),
                                   StochasticRule(PUCT(), ChanceRule(3)))
    with pytest.raises(RuntimeError, match="out of range"):
        _OPS.stochastic_recurrent(tensors, reward_eps, value_eps, torch.rand(2, 8), torch.zeros(2, dtype=torch.bool),
                                  torch.tensor([0, 7]), GAMMA)
    with pytest.raises(RuntimeError, match="float32"):
        _OPS.stochastic_recurrent([x.double() for x in tensors], reward_eps, value_eps, torch.rand(2, 8),
                                  torch.zeros(2, dtype=torch.bool), torch.zeros(2, dtype=torch.long), GAMMA)


def test_the_per_simulation_cpp_loop_still_equals_the_torch_path_exactly():
    # With the fused path switched off, backend "cpp" runs the C++ rules around the torch model:
    # same model arithmetic as backend "torch", so the same trees and values, bit for bit.
    model = _model(2, A=3, C=4, latent=8, hidden=16)
    model.fused_search_weights = lambda: None
    obs = torch.randn(5, 5)
    ref, loop = (_search(model, obs, backend, 2) for backend in ("torch", "cpp"))
    assert torch.equal(ref.visit_counts, loop.visit_counts)
    assert torch.equal(ref.tree.children_index, loop.tree.children_index)
    assert torch.equal(ref.root_value, loop.root_value)
