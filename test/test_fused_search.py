"""The fused C++ search for MuZeroMLPModel (``mlp_search`` in torchrl_muzero/csrc/tree_ops.cpp).

The kernel runs the network with its own loops, so its float32 results are
not bit-identical to the torch model's (MKL sums a linear layer in another
order, and ATen normalises the softmax before a BLAS dot where the kernel
divides two sums). Two kinds of checks follow from that:

* the network step (test hook ``mlp_recurrent``) against
  ``model.recurrent_inference_scalar`` and against a float64 copy of the model:
  latents and logits agree to a few ulps; decoded rewards and values are as
  close to the float64 truth as the torch path's. Both decode with the
  closed-form ``h^-1`` of support.py, which in float32 moves in steps of
  ~1e-4 (``sqrt(1.004 + ...) - 1`` keeps few significant bits), so two
  correct float32 evaluations of a value differ by such a step about one time
  in five;
* whole searches against the plain-torch path (``backend="torch"``): a pUCT
  choice between two children whose scores are closer than that ~1e-4 can go
  either way, after which that root's tree differs. On random models this
  happens on well under 1 % of roots (measured: 99.8 % of 512 roots with
  identical visit counts, 96 % with identical whole trees), so the test asks
  for identical visit counts on at least 95 % of the roots of every case, and
  for root values equal up to the ``h^-1`` step on the roots whose trees are
  identical. Root priors (Dirichlet noise from the same seeded generator) must
  be bit-identical, since they are drawn before the kernel runs.
"""
from __future__ import annotations

import copy

import pytest
import torch

from torchrl_muzero.mcts import MCTSConfig, search, search_from_root
from torchrl_muzero.mcts import _cpp
from torchrl_muzero.modules import MuZeroMLPModel

_OPS = _cpp.load_tree_ops()
pytestmark = pytest.mark.skipif(
    _OPS is None or not hasattr(_OPS, "mlp_search"),
    reason=f"fused MLP search not built: {_cpp.tree_ops_unavailable_reason() or 'stale build without mlp_search'}",
)


def _model(seed, obs_dim=5, A=6, latent=32, hidden=48, support=10, head_scale=3.0, layers=1):
    torch.manual_seed(seed)
    model = MuZeroMLPModel(
        (obs_dim,), A, latent_dim=latent, hidden_dim=hidden, value_support_size=support,
        reward_support_size=support, num_layers=layers, zero_init_heads=False,
    ).eval()
    with torch.no_grad():  # values of a few units rather than ~0.1, as after some training
        model.prediction_head.weight.mul_(head_scale)
        model.reward_head[-1].weight.mul_(head_scale)
    return model


def _step(model, latent, action):
    tensors, reward_eps, value_eps = model.fused_search_weights()
    return _OPS.mlp_recurrent(tensors, model.num_actions, reward_eps, value_eps, latent, action)


# ----------------------------------------------------------------------------
# The network step
# ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "latent,hidden,A,support,B",
    [(64, 64, 6, 300, 64), (16, 24, 2, 10, 7), (32, 48, 9, 300, 1), (8, 8, 3, 5, 33), (20, 70, 18, 300, 5)],
)
def test_network_step_matches_model(latent, hidden, A, support, B):
    model = _model(latent + A, A=A, latent=latent, hidden=hidden, support=support)
    model64 = copy.deepcopy(model).double()
    g = torch.Generator().manual_seed(B)
    lat = torch.rand(B, latent, generator=g)
    act = torch.randint(A, (B,), generator=g)
    ref = model.recurrent_inference_scalar(lat, act)
    ref64 = model64.recurrent_inference_scalar(lat.double(), act)
    next_latent, reward, logits, value, prior = _step(model, lat, act)

    # Latents and logits: a few float32 ulps from the torch model and from the truth.
    torch.testing.assert_close(next_latent, ref[0], rtol=0, atol=1e-6)
    torch.testing.assert_close(logits, ref[2], rtol=1e-5, atol=1e-6)
    assert (next_latent.double() - ref64[0]).abs().max() < 1e-6
    assert ((logits.double() - ref64[2]).abs() / (1 + ref64[2].abs())).max() < 1e-6
    torch.testing.assert_close(prior, torch.softmax(ref[2], -1), rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(prior.sum(-1), torch.ones(B), rtol=0, atol=1e-6)

    # Reward and value: within the float32 h^-1 step of the float64 truth, and
    # no further from it than the torch path is (its error sets the scale).
    for ours, torch32, truth in ((reward, ref[1], ref64[1]), (value, ref[3], ref64[3])):
        err = (ours.double() - truth).abs()
        assert (err <= 1e-3 * (1 + truth.abs()).sqrt()).all(), err.max()
        torch_err = (torch32.double() - truth).abs().max().item()
        assert err.max().item() <= 3 * torch_err + 2e-4
        torch.testing.assert_close(ours, torch32, rtol=1e-4, atol=1e-3)


def test_zero_heads_decode_to_exact_zero():
    # Zero-initialised heads give all-zero logits: a uniform softmax over bins
    # symmetric around 0. The kernel's sum(e * bin) / sum(e) is then exactly 0;
    # the torch path's normalise-then-dot leaves a rounding residual that h^-1
    # turns into ~-2.6e-5 for every reward and value (a float artefact).
    torch.manual_seed(0)
    model = MuZeroMLPModel((4,), 5, latent_dim=16, hidden_dim=16, value_support_size=300,
                           reward_support_size=300).eval()
    lat = torch.rand(9, 16)
    act = torch.randint(5, (9,))
    next_latent, reward, logits, value, prior = _step(model, lat, act)
    assert torch.equal(reward.abs(), torch.zeros(9)) and torch.equal(value.abs(), torch.zeros(9))
    assert torch.equal(logits, torch.zeros(9, 5)) and torch.equal(prior, torch.full((9, 5), 0.2))
    torch.testing.assert_close(next_latent, model.recurrent_inference_scalar(lat, act)[0], rtol=0, atol=1e-6)


@pytest.mark.parametrize("latent,hidden,A,support,B", [(64, 64, 6, 300, 37), (13, 21, 5, 7, 9), (8, 8, 2, 3, 1)])
def test_vector_widths_agree_bitwise(latent, hidden, A, support, B):
    # The kernel's 4-wide build (SSE2 / NEON) and its AVX2 build (taken on this
    # machine when the CPU has AVX2; otherwise both calls run the 4-wide one)
    # must round identically: search results may not depend on the CPU.
    model = _model(B, A=A, latent=latent, hidden=hidden, support=support)
    tensors, reward_eps, value_eps = model.fused_search_weights()
    lat = torch.rand(B, latent)
    act = torch.randint(A, (B,))
    wide = _OPS.mlp_recurrent(tensors, A, reward_eps, value_eps, lat, act)
    narrow = _OPS.mlp_recurrent(tensors, A, reward_eps, value_eps, lat, act, baseline=True)
    for x, y in zip(wide, narrow):
        assert torch.equal(x, y)


def test_unroll_hook_chains_steps():
    model = _model(3, A=4, latent=16, hidden=16)
    tensors, reward_eps, value_eps = model.fused_search_weights()
    lat = torch.rand(6, 16)
    actions = torch.randint(4, (5, 6))
    expected = lat
    for s in range(5):
        expected = _step(model, expected, actions[s])[0]
    assert torch.equal(_OPS.mlp_unroll(tensors, 4, reward_eps, value_eps, lat, actions), expected)


# ----------------------------------------------------------------------------
# Whole searches against the plain-torch path
# ----------------------------------------------------------------------------
CASES = [
    # (B, roots in total, add_noise, two_player, masked)
    (1, 24, True, False, False),
    (1, 24, False, True, True),
    (7, 70, True, True, True),
    (7, 70, False, False, False),
    (64, 128, True, False, True),
    (64, 128, False, True, False),
]


@pytest.mark.parametrize("B,roots,add_noise,two_player,masked", CASES)
def test_search_matches_torch_path(B, roots, add_noise, two_player, masked):
    same_visits = same_trees = total = 0
    for seed in range(roots // B):
        A = (2, 4, 6, 9)[seed % 4]
        model = _model(100 * B + seed, A=A, support=(10, 300)[seed % 2])
        g = torch.Generator().manual_seed(seed)
        obs = 2 * torch.randn(B, 5, generator=g)
        mask = None
        if masked:
            mask = torch.rand(B, A, generator=g) < 0.6
            mask[torch.arange(B), torch.randint(A, (B,), generator=g)] = True
        kw = dict(action_mask=mask, to_play=torch.zeros(B) if two_player else None, add_noise=add_noise)
        out = {
            backend: search(model, obs, MCTSConfig(num_simulations=50, backend=backend),
                            generator=torch.Generator().manual_seed(seed), **kw)
            for backend in ("torch", "cpp")
        }
        ref, fused = out["torch"], out["cpp"]
        assert torch.equal(ref.tree.children_prior[:, 0], fused.tree.children_prior[:, 0])
        assert fused.visit_counts.sum(-1).eq(50).all()
        if masked:
            assert fused.visit_counts[~mask].eq(0).all()
        equal = ref.visit_counts.eq(fused.visit_counts).all(-1)
        trees = ref.tree.children_index.eq(fused.tree.children_index).flatten(1).all(-1)
        v_ref, v_fused = ref.root_value[trees].double(), fused.root_value[trees].double()
        assert ((v_ref - v_fused).abs() <= 1e-3 + 1e-4 * v_ref.abs()).all()
        same_visits += int(equal.sum())
        same_trees += int(trees.sum())
        total += B
    assert same_visits >= 0.95 * total, (same_visits, same_trees, total)


def test_fused_search_is_batch_invariant():
    # One root searched alone or among 63 others gives the same tree: each
    # sample's arithmetic is fixed by the kernel, whatever tile it lands in.
    model = _model(5, A=6, latent=24, hidden=40, support=300)
    g = torch.Generator().manual_seed(0)
    latent, logits, _ = model.initial_inference(2 * torch.randn(64, 5, generator=g))
    cfg = MCTSConfig(num_simulations=30, backend="cpp")
    batch = search_from_root(model, latent, logits, cfg, add_noise=False, two_player=True)
    for i in (0, 13, 63):
        one = search_from_root(model, latent[i : i + 1], logits[i : i + 1], cfg,
                               add_noise=False, two_player=True)
        for name, t in one.tree.tensors().items():
            assert torch.equal(t[0], getattr(batch.tree, name)[i]), name


# ----------------------------------------------------------------------------
# When the fused path is (not) taken
# ----------------------------------------------------------------------------
def test_fused_path_is_taken_only_for_one_hidden_layer_float32_mlps():
    model = _model(0, A=3, latent=8, hidden=8)
    assert model.fused_search_weights() is not None
    assert _model(0, A=3, latent=8, hidden=8, layers=2).fused_search_weights() is None
    assert copy.deepcopy(model).double().fused_search_weights() is None

    class Custom(MuZeroMLPModel):
        def recurrent_inference_scalar(self, latent, action):
            return super().recurrent_inference_scalar(latent, action)

    torch.manual_seed(0)
    assert Custom((5,), 3, latent_dim=8, hidden_dim=8).fused_search_weights() is None

    # The fused search never calls the Python step; the torch backend does.
    obs = torch.randn(3, 5)
    model.recurrent_inference_scalar = None  # any call would raise
    out = search(model, obs, MCTSConfig(num_simulations=10, backend="cpp"))
    assert out.visit_counts.sum(-1).eq(10).all()
    assert out.tree.embeddings[:, 1:].abs().sum() > 0  # the kernel wrote every node's latent
    with pytest.raises(TypeError):
        search(model, obs, MCTSConfig(num_simulations=10, backend="torch"))

    # Deeper networks search through the per-simulation loop.
    deep = _model(0, A=3, latent=8, hidden=8, layers=2)
    assert search(deep, obs, MCTSConfig(num_simulations=10, backend="cpp")).visit_counts.sum(-1).eq(10).all()


def test_kernel_rejects_bad_inputs():
    model = _model(1, A=3, latent=8, hidden=8)
    tensors, reward_eps, value_eps = model.fused_search_weights()
    cfg = MCTSConfig(num_simulations=5, backend="cpp")
    out = search(model, torch.randn(2, 5), cfg)
    t = out.tree
    args = [t.visit_count, t.value_sum, t.parent, t.action_from_parent, t.children_index, t.children_prior,
            t.children_reward, t.min_q, t.max_q, t.root_legal, t.embeddings]
    with pytest.raises(RuntimeError, match="searched already"):
        _OPS.mlp_search(*args, tensors, reward_eps, value_eps, 19652.0, 1.25, 0.997)
    with pytest.raises(RuntimeError, match="must have shape"):
        _OPS.mlp_recurrent(tensors, 4, reward_eps, value_eps, torch.rand(2, 8), torch.zeros(2, dtype=torch.long))
    with pytest.raises(RuntimeError, match="out of range"):
        _OPS.mlp_recurrent(tensors, 3, reward_eps, value_eps, torch.rand(2, 8), torch.tensor([0, 3]))
    with pytest.raises(RuntimeError, match="float32"):
        _OPS.mlp_recurrent([x.double() for x in tensors], 3, reward_eps, value_eps, torch.rand(2, 8),
                           torch.zeros(2, dtype=torch.long))
