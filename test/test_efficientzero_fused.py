"""The fused C++ search for EfficientZeroMLPModel (``ez_search``, torchrl_muzero/csrc/ez_net.h).

As for MuZero's fused search (test/test_fused_search.py, whose docstring
explains the two kinds of checks), the kernel runs the network with its own
float32 loops, so it is close to the torch model but not bit-identical:

* the network step (test hook ``ez_recurrent``) against
  ``model.search_step`` on the same parent states, along paths deeper than
  the LSTM horizon (the reset of the LSTM state and prefix included):
  latents, LSTM states and logits agree to a few ulps, the decoded prefixes,
  rewards and values to the float32 ``h^-1`` step (~1e-4), the step counts
  and resets exactly;
* whole searches against the plain-torch path: identical visit counts on at
  least 95 % of the roots, node states close on the roots whose trees are
  identical, root priors bit-identical.
"""
from __future__ import annotations

import copy

import pytest
import torch
from tensordict import TensorDict

from torchrl_muzero.mcts import MCTSConfig, _cpp, search
from torchrl_muzero.mcts.rules import PUCT
from torchrl_muzero.mcts.search import muzero_search
from torchrl_muzero.modules import EfficientZeroMLPModel
from torchrl_muzero.modules.step import ModelStep

_OPS = _cpp.load_tree_ops()
pytestmark = pytest.mark.skipif(
    _OPS is None or not hasattr(_OPS, "ez_search"),
    reason=f"fused EfficientZero search not built: {_cpp.tree_ops_unavailable_reason() or 'stale build'}",
)

KEYS = _cpp.EZ_STATE_KEYS


def _model(seed, obs_dim=5, A=6, latent=32, hidden=48, lstm=24, horizon=3, support=10, head_scale=3.0,
           layers=1) -> EfficientZeroMLPModel:
    torch.manual_seed(seed)
    model = EfficientZeroMLPModel(
        (obs_dim,), A, latent_dim=latent, hidden_dim=hidden, value_support_size=support,
        reward_support_size=support, num_layers=layers, zero_init_heads=False, lstm_hidden_size=lstm,
        lstm_horizon_len=horizon,
    ).eval()
    with torch.no_grad():  # values and prefixes of a few units, as after some training
        model.prediction_head.weight.mul_(head_scale)
        model.value_prefix_head[-1].weight.mul_(head_scale)
    return model


def _step(model, state, action, baseline=False):
    """The kernel's search step: a TensorDict state and (reward, logits, value, prior)."""
    tensors, reward_eps, value_eps, ln_eps, horizon = model.fused_value_prefix_weights()
    out = _OPS.ez_recurrent(tensors, model.num_actions, reward_eps, value_eps, ln_eps, horizon,
                            *(state[k].contiguous() for k in KEYS), action, baseline)
    child = TensorDict(dict(zip(KEYS, out[:5])), batch_size=state.batch_size)
    return child, out[5], out[6], out[7], out[8]


# ----------------------------------------------------------------------------
# The network step
# ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "latent,hidden,lstm,A,support,horizon,B",
    [(64, 64, 64, 6, 300, 5, 64), (16, 24, 8, 2, 10, 3, 7), (32, 48, 24, 9, 300, 2, 1), (8, 8, 5, 3, 5, 1, 33),
     (20, 70, 40, 18, 300, 4, 5)],
)
def test_network_step_matches_search_step(latent, hidden, lstm, A, support, horizon, B):
    model = _model(latent + A, A=A, latent=latent, hidden=hidden, lstm=lstm, horizon=horizon, support=support)
    g = torch.Generator().manual_seed(B)
    state = model.search_root(torch.randn(B, 5, generator=g)).state
    for depth in range(1, 2 * horizon + 3):  # past two resets
        action = torch.randint(A, (B,), generator=g)
        ref = model.search_step(state, action)
        child, reward, logits, value, prior = _step(model, state, action)
        # Step counts, resets and stored prefixes of reset nodes: exact.
        assert torch.equal(child["steps"], ref.state["steps"]) and torch.equal(child["steps"], torch.full((B,), depth % horizon))
        if depth % horizon == 0:
            for key in ("lstm_h", "lstm_c", "value_prefix"):
                assert torch.equal(child[key], torch.zeros_like(child[key])), (depth, key)
        # Latent, LSTM state, logits: a few float32 ulps.
        torch.testing.assert_close(child["latent"], ref.state["latent"], rtol=0, atol=1e-6)
        torch.testing.assert_close(child["lstm_h"], ref.state["lstm_h"], rtol=0, atol=1e-6)
        torch.testing.assert_close(child["lstm_c"], ref.state["lstm_c"], rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(logits, ref.policy_logits, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(prior, torch.softmax(ref.policy_logits, -1), rtol=1e-5, atol=1e-7)
        # Decoded prefix, reward and value: within the float32 h^-1 step.
        for ours, theirs in ((child["value_prefix"], ref.state["value_prefix"]), (reward, ref.reward),
                             (value, ref.value)):
            torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-3)
        state = ref.state


def test_network_step_is_close_to_float64_truth():
    # The kernel's LSTM state and prefix are no further from a float64 model than torch's float32 ones.
    model = _model(7, latent=64, hidden=64, lstm=64, horizon=5, support=300)
    model64 = copy.deepcopy(model).double()
    g = torch.Generator().manual_seed(0)
    state = model.search_root(torch.randn(48, 5, generator=g)).state
    for _ in range(4):  # inside one horizon: a state that is not reset
        action = torch.randint(6, (48,), generator=g)
        ref = model.search_step(state, action)
        ref64 = model64.search_step(state.apply(lambda t: t.double() if t.is_floating_point() else t), action)
        child, reward, _, value, _ = _step(model, state, action)
        for key in ("latent", "lstm_h", "lstm_c"):
            err = (child[key].double() - ref64.state[key]).abs().max().item()
            torch_err = (ref.state[key].double() - ref64.state[key]).abs().max().item()
            assert err <= 4 * torch_err + 1e-7, (key, err, torch_err)
        for ours, torch32, truth in ((reward, ref.reward, ref64.reward), (value, ref.value, ref64.value)):
            err = (ours.double() - truth).abs().max().item()
            assert err <= 3 * (torch32.double() - truth).abs().max().item() + 2e-4
        state = ref.state


def test_chained_kernel_steps_follow_the_torch_chain():
    # The kernel fed its own states (as in a search), deeper than two horizons.
    model = _model(3, latent=16, hidden=24, lstm=8, horizon=3)
    g = torch.Generator().manual_seed(1)
    ours = theirs = model.search_root(torch.randn(9, 5, generator=g)).state
    for _ in range(8):
        action = torch.randint(6, (9,), generator=g)
        theirs = model.search_step(theirs, action).state
        ours = _step(model, ours, action)[0]
        assert torch.equal(ours["steps"], theirs["steps"])
        for key in ("latent", "lstm_h", "lstm_c"):
            torch.testing.assert_close(ours[key], theirs[key], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("latent,lstm,A,support,B", [(64, 64, 6, 300, 37), (13, 7, 5, 7, 9), (8, 12, 2, 3, 1)])
def test_vector_widths_agree_bitwise(latent, lstm, A, support, B):
    # The 4-wide build (SSE2 / NEON) and the AVX2 build round identically.
    model = _model(B, A=A, latent=latent, lstm=lstm, support=support)
    g = torch.Generator().manual_seed(0)
    state = model.search_root(torch.randn(B, 5, generator=g)).state
    state = model.search_step(state, torch.randint(A, (B,), generator=g)).state  # a non-zero LSTM state
    action = torch.randint(A, (B,), generator=g)
    wide, narrow = _step(model, state, action), _step(model, state, action, baseline=True)
    assert all(torch.equal(wide[0][k], narrow[0][k]) for k in KEYS)
    assert all(torch.equal(x, y) for x, y in zip(wide[1:], narrow[1:]))


# ----------------------------------------------------------------------------
# Whole searches against the plain-torch path
# ----------------------------------------------------------------------------
CASES = [
    # (B, roots in total, add_noise, two_player, masked)
    (1, 16, True, False, False),
    (1, 16, False, True, True),
    (7, 56, True, True, True),
    (64, 128, True, False, False),
    (64, 128, False, True, True),
]


@pytest.mark.parametrize("B,roots,add_noise,two_player,masked", CASES)
def test_search_matches_torch_path(B, roots, add_noise, two_player, masked):
    same_visits = same_trees = total = 0
    for seed in range(roots // B):
        A = (2, 4, 6, 9)[seed % 4]
        model = _model(100 * B + seed, A=A, horizon=(2, 3, 5)[seed % 3], support=(10, 300)[seed % 2])
        g = torch.Generator().manual_seed(seed)
        obs = 2 * torch.randn(B, 5, generator=g)
        mask = None
        if masked:
            mask = torch.rand(B, A, generator=g) < 0.6
            mask[torch.arange(B), torch.randint(A, (B,), generator=g)] = True
        kw = dict(action_mask=mask, to_play=torch.zeros(B) if two_player else None, add_noise=add_noise)
        ref, fused = (search(model, obs, MCTSConfig(num_simulations=50, backend=backend),
                             generator=torch.Generator().manual_seed(seed), **kw) for backend in ("torch", "cpp"))
        assert torch.equal(ref.tree.children_prior[:, 0], fused.tree.children_prior[:, 0])
        assert fused.visit_counts.sum(-1).eq(50).all()
        if masked:
            assert fused.visit_counts[~mask].eq(0).all()
        equal = ref.visit_counts.eq(fused.visit_counts).all(-1)
        trees = ref.tree.children_index.eq(fused.tree.children_index).flatten(1).all(-1)
        v_ref, v_fused = ref.root_value[trees].double(), fused.root_value[trees].double()
        assert ((v_ref - v_fused).abs() <= 1e-3 + 1e-4 * v_ref.abs()).all()
        # On identical trees every node's state is the torch path's (steps exactly).
        states_ref, states_fused = ref.tree.embeddings[trees], fused.tree.embeddings[trees]
        assert torch.equal(states_ref["steps"], states_fused["steps"])
        for key in ("latent", "lstm_h", "lstm_c"):
            torch.testing.assert_close(states_fused[key], states_ref[key], rtol=1e-4, atol=1e-4)
        # Prefixes (and so rewards, their differences) within the h^-1 step, which grows with the magnitude.
        torch.testing.assert_close(states_fused["value_prefix"], states_ref["value_prefix"], rtol=1e-4, atol=1e-3)
        scale = float(states_ref["value_prefix"].abs().max()) if bool(trees.any()) else 0.0
        torch.testing.assert_close(fused.tree.children_reward[trees], ref.tree.children_reward[trees],
                                   rtol=1e-4, atol=1e-3 + 2e-4 * scale)
        same_visits += int(equal.sum())
        same_trees += int(trees.sum())
        total += B
    assert same_visits >= 0.95 * total, (same_visits, same_trees, total)


def test_fused_search_is_batch_invariant():
    # One root searched alone or among 63 others gives the same tree, node states included.
    model = _model(5, A=6, latent=24, hidden=40, lstm=16, support=300)
    root = model.search_root(2 * torch.randn(64, 5, generator=torch.Generator().manual_seed(0)))
    cfg = MCTSConfig(num_simulations=30, backend="cpp")
    batch = muzero_search(model, root, cfg, add_noise=False, two_player=True)
    for i in (0, 13, 63):
        part = ModelStep(root.state[i : i + 1], root.reward[i : i + 1], root.policy_logits[i : i + 1],
                         root.value[i : i + 1])
        one = muzero_search(model, part, cfg, add_noise=False, two_player=True)
        for name, t in one.tree.tensors().items():
            other = getattr(batch.tree, name)
            if isinstance(t, torch.Tensor):
                assert torch.equal(t[0], other[i]), name
            else:
                assert all(torch.equal(t[0][k], other[i][k]) for k in KEYS), name


# ----------------------------------------------------------------------------
# When the fused path is (not) taken
# ----------------------------------------------------------------------------
def test_fused_path_is_taken_only_for_one_hidden_layer_float32_models():
    model = _model(0, A=3, latent=8, hidden=8, lstm=4)
    assert model.fused_value_prefix_weights() is not None
    assert model.fused_search_weights() is None  # MuZero's kernel has no value-prefix LSTM
    assert _model(0, A=3, latent=8, hidden=8, lstm=4, layers=2).fused_value_prefix_weights() is None
    assert copy.deepcopy(model).double().fused_value_prefix_weights() is None

    class Custom(EfficientZeroMLPModel):
        def search_step(self, state, action):
            return super().search_step(state, action)

    torch.manual_seed(0)
    assert Custom((5,), 3, latent_dim=8, hidden_dim=8, lstm_hidden_size=4).fused_value_prefix_weights() is None

    # The fused search never calls the Python step; the torch backend does.
    obs = torch.randn(3, 5)

    def python_step(state, action):
        raise RuntimeError("the Python search step was called")

    model.search_step = python_step
    out = search(model, obs, MCTSConfig(num_simulations=10, backend="cpp"))
    assert out.visit_counts.sum(-1).eq(10).all()
    assert out.tree.embeddings["latent"][:, 1:].abs().sum() > 0  # the kernel wrote every node's latent
    with pytest.raises(RuntimeError, match="Python search step"):
        search(model, obs, MCTSConfig(num_simulations=10, backend="torch"))

    # Deeper networks and the torch backend search through the per-simulation loop, with the same results
    # shape; the fallback still resets the LSTM state every horizon.
    deep = _model(0, A=3, latent=8, hidden=8, lstm=4, layers=2, horizon=1)
    out = search(deep, obs, MCTSConfig(num_simulations=10, backend="cpp"))
    assert out.visit_counts.sum(-1).eq(10).all()
    assert out.tree.embeddings["lstm_h"].abs().sum() == 0


def test_efficientzero_algorithm_takes_the_fused_path(monkeypatch):
    from torchrl_muzero.algorithms.efficientzero import EFFICIENTZERO

    calls = []
    real = _cpp.cpp_ez_search
    monkeypatch.setattr(_cpp, "cpp_ez_search", lambda *a, **k: (calls.append(1), real(*a, **k))[1])
    model = _model(1, A=3, latent=8, hidden=8, lstm=4)
    out = EFFICIENTZERO.search_fn(model, torch.randn(4, 5), MCTSConfig(num_simulations=8, backend="cpp"))
    assert calls == [1] and out.visit_counts.sum(-1).eq(8).all()
    EFFICIENTZERO.search_fn(model, torch.randn(4, 5), MCTSConfig(num_simulations=8, backend="torch"))
    assert calls == [1]


def test_kernel_rejects_bad_inputs():
    model = _model(1, A=3, latent=8, hidden=8, lstm=4)
    fused = model.fused_value_prefix_weights()
    tensors, reward_eps, value_eps, ln_eps, horizon = fused
    out = search(model, torch.randn(2, 5), MCTSConfig(num_simulations=5, backend="cpp"))

    with pytest.raises(RuntimeError, match="searched already"):
        _cpp.cpp_ez_search(out.tree, fused, PUCT(), PUCT())
    state = model.search_root(torch.randn(2, 5)).state
    args = [tensors, 3, reward_eps, value_eps, ln_eps, horizon]
    with pytest.raises(RuntimeError, match="out of range"):
        _OPS.ez_recurrent(*args, *(state[k] for k in KEYS), torch.tensor([0, 3]), False)
    with pytest.raises(RuntimeError, match="must have shape"):
        _OPS.ez_recurrent(*args, torch.rand(2, 9), *(state[k] for k in KEYS[1:]), torch.zeros(2, dtype=torch.long),
                          False)
    with pytest.raises(RuntimeError, match="float32"):
        _OPS.ez_recurrent([t.double() for t in tensors], *args[1:], *(state[k] for k in KEYS),
                          torch.zeros(2, dtype=torch.long), False)
    with pytest.raises(RuntimeError, match="lstm_horizon_len"):
        _OPS.ez_recurrent(*args[:5], 0, *(state[k] for k in KEYS), torch.zeros(2, dtype=torch.long), False)
