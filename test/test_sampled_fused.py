"""The fused sampled search over a box (``sampled_ez_search`` / ``sampled_mlp_search``,
torchrl_muzero/csrc/sampled_search.cpp).

The kernel runs SampledModel(EfficientZeroMLPModel(action_dim=D)) with the
value-prefix step of the fused EfficientZero search (SampledModel(MuZeroMLPModel(
action_dim=D)) with the fused MuZero step) and draws every new node's K
candidates itself. Its random numbers are the torch path's: the same
``randn([B, K, D])`` calls on the search's generator, in the same order, so

* the network step with its draws (test hook ``sampled_ez_recurrent``)
  against ``SampledModel.search_step`` with the same generator: the candidates
  agree to a few float32 ulps (the step's outputs are a few ulps from torch's,
  and the draws go through libm's tanh / log1p instead of Sleef's);
* whole searches against the torch path with the same generator: the root's
  candidates bit for bit, the generator left in the same state, identical
  visit counts on almost every root, and on identical trees every node's
  candidates and state close;
* the dispatch: the fused kernel exactly where its spec is offered (a
  uniform slot prior, a fused continuous base), the loop everywhere else.
"""
from __future__ import annotations

import pytest
import torch

from torchrl_muzero.envs.action_spaces import BoxActionSpace, DiscreteActionSpace
from torchrl_muzero.mcts import MCTSConfig, _cpp
from torchrl_muzero.mcts.gumbel import GumbelMCTSConfig
from torchrl_muzero.mcts.rules import PUCT
from torchrl_muzero.mcts.sampled import root_candidates, sampled_search
from torchrl_muzero.modules import EfficientZeroMLPModel, MuZeroMLPModel
from torchrl_muzero.modules.sampled import SampledModel
from torchrl_muzero.modules.sampled_proposal import SampledProposal
from torchrl_muzero.modules.tanh_normal import MIN_SCALE, PRE_TANH_BOUND

_OPS = _cpp.load_tree_ops()
pytestmark = pytest.mark.skipif(
    _OPS is None or not hasattr(_OPS, "sampled_ez_search"),
    reason=f"fused sampled search not built: {_cpp.tree_ops_unavailable_reason() or 'stale build'}",
)

KEYS = _cpp.EZ_STATE_KEYS


def _base(seed: int, D: int = 1, latent: int = 24, hidden: int = 40, lstm: int = 16, horizon: int = 3,
          support: int = 10, layers: int = 1) -> EfficientZeroMLPModel:
    torch.manual_seed(seed)
    base = EfficientZeroMLPModel((3,), 2 * D, latent_dim=latent, hidden_dim=hidden, value_support_size=support,
                                 reward_support_size=support, num_layers=layers, zero_init_heads=False,
                                 lstm_hidden_size=lstm, lstm_horizon_len=horizon, action_dim=D).eval()
    with torch.no_grad():  # values and prefixes of a few units, as after some training
        base.prediction_head.weight.mul_(3.0)
        base.value_prefix_head[-1].weight.mul_(3.0)
    return base


def _model(seed: int = 0, D: int = 1, K: int = 5, sigma: float | None = None, low: float = -2.0,
           high: float = 2.0, **proposal) -> SampledModel:
    base = _base(seed, D=D, horizon=(2, 3, 5)[seed % 3], support=(10, 300)[seed % 2])
    return SampledModel(base, BoxActionSpace(low, high, (D,)), SampledProposal(num_samples=K, **proposal),
                        sigma=sigma)


def _hook(model: SampledModel, state, action, noise, baseline: bool = False):
    spec = model.fused_kernel_spec()
    tensors, (low, high) = list(spec.tensors[:-2]), spec.tensors[-2:]
    reward_eps, value_eps, ln_eps, sigma, min_scale, temperature, bound = spec.floats
    node = state["node"]
    return _OPS.sampled_ez_recurrent(tensors, action.shape[-1], reward_eps, value_eps, ln_eps, spec.ints[0],
                                     *(node[k].contiguous() for k in KEYS), action, noise, low, high, sigma,
                                     min_scale, temperature, bound, baseline)


# ----------------------------------------------------------------------------
# The step and its draws
# ----------------------------------------------------------------------------
@pytest.mark.parametrize("D,K,sigma,proposal,B", [
    (1, 5, None, {}, 7), (2, 20, None, {}, 40), (3, 4, 0.3, {}, 5), (1, 8, None, {"prior": "uniform", "temperature": 0.5}, 33),
])
def test_step_and_draws_match_search_step(D, K, sigma, proposal, B):
    model = _model(seed=D, D=D, K=K, sigma=sigma, **proposal)
    g = torch.Generator().manual_seed(5)
    root = model.sample_node(model.search_root(2 * torch.randn(B, 3, generator=g)), generator=g)
    state = root.state
    for depth in range(4):  # deeper than the LSTM horizon: the resets too
        action = state["candidate_actions"][:, depth % K].contiguous()
        seed = 100 + depth
        ref = model.search_step(state, action, generator=torch.Generator().manual_seed(seed))
        noise = torch.randn(B, K, D, generator=torch.Generator().manual_seed(seed))  # the draws search_step made
        out = _hook(model, state, action, noise)
        latent, h, c, prefix, steps, reward, params, value, candidates = out
        node = ref.state["node"]
        torch.testing.assert_close(latent, node["latent"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(h, node["lstm_h"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(c, node["lstm_c"], rtol=1e-5, atol=1e-5)
        assert torch.equal(steps, node["steps"])
        torch.testing.assert_close(prefix, node["value_prefix"], rtol=1e-4, atol=1e-3)
        torch.testing.assert_close(reward, ref.reward, rtol=1e-4, atol=1e-3)
        torch.testing.assert_close(value, ref.value, rtol=1e-4, atol=1e-3)
        torch.testing.assert_close(params, model.base.predict(latent)[0], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(candidates, ref.state["candidate_actions"], rtol=0, atol=1e-5)
        assert ref.policy_logits.eq(0).all()  # the slot prior the kernel assumes: uniform
        # the 4-wide build gives the same bits as the AVX2 one
        assert all(torch.equal(x, y) for x, y in zip(out, _hook(model, state, action, noise, baseline=True)))
        state = ref.state


def test_draws_clamp_to_the_box():
    # a location far outside: every pre-tanh draw clamps to the bound, the action stays inside the box
    model = _model(K=6, low=-1.0, high=3.0)
    with torch.no_grad():
        model.base.prediction_head.bias[0] = 50.0
        model.base.prediction_head.weight[0] = 0.0
    g = torch.Generator().manual_seed(0)
    root = model.sample_node(model.search_root(torch.randn(3, 3, generator=g)), generator=g)
    action = root.state["candidate_actions"][:, 0].contiguous()
    ref = model.search_step(root.state, action, generator=torch.Generator().manual_seed(1))
    out = _hook(model, root.state, action, torch.randn(3, 6, 1, generator=torch.Generator().manual_seed(1)))
    top = -1.0 + (torch.tanh(torch.tensor(PRE_TANH_BOUND)) + 1) / 2 * 4.0
    assert torch.equal(out[-1], ref.state["candidate_actions"]) and bool((out[-1] == top).all())
    assert bool((out[-1] < 3.0).all())


# ----------------------------------------------------------------------------
# Whole searches
# ----------------------------------------------------------------------------
CASES = [  # B, roots, D, K, add_noise, sigma
    (1, 12, 1, 5, True, None),
    (8, 48, 1, 20, True, None),
    (32, 64, 2, 5, False, None),
    (16, 32, 1, 8, True, 0.4),
]


@pytest.mark.parametrize("B,roots,D,K,add_noise,sigma", CASES)
def test_search_matches_torch_path(B, roots, D, K, add_noise, sigma):
    same_visits = same_trees = total = 0
    for seed in range(roots // B):
        model = _model(seed, D=D, K=K, sigma=sigma)
        obs = 2 * torch.randn(B, 3, generator=torch.Generator().manual_seed(seed))
        runs = {}
        for backend in ("torch", "cpp"):
            g = torch.Generator().manual_seed(seed)
            runs[backend] = (sampled_search(model, obs, MCTSConfig(num_simulations=30, backend=backend),
                                            add_noise=add_noise, generator=g), g.get_state())
        (ref, g_ref), (fused, g_fused) = runs["torch"], runs["cpp"]
        assert (ref.engine, fused.engine) == ("torch", "cpp-fused")
        # the same draws consumed: the root's, the noise, one randn per simulation, the readout
        assert torch.equal(g_ref, g_fused)
        assert torch.equal(root_candidates(model, ref), root_candidates(model, fused))
        assert torch.equal(ref.tree.children_prior[:, 0], fused.tree.children_prior[:, 0])
        assert fused.visit_counts.sum(-1).eq(30).all()
        assert fused.tree.children_logits.eq(0).all()  # uniform slot prior at every node
        equal = ref.visit_counts.eq(fused.visit_counts).all(-1)
        trees = ref.tree.children_index.eq(fused.tree.children_index).flatten(1).all(-1)
        emb_ref, emb_fused = ref.tree.embeddings[trees], fused.tree.embeddings[trees]
        torch.testing.assert_close(emb_fused["candidate_actions"], emb_ref["candidate_actions"], rtol=0, atol=1e-5)
        assert torch.equal(emb_fused["node", "steps"], emb_ref["node", "steps"])
        for key in ("latent", "lstm_h", "lstm_c"):
            torch.testing.assert_close(emb_fused["node", key], emb_ref["node", key], rtol=1e-4, atol=1e-4)
        v_ref, v_fused = ref.root_value[trees].double(), fused.root_value[trees].double()
        assert ((v_ref - v_fused).abs() <= 1e-3 + 1e-4 * v_ref.abs()).all()
        same_visits += int(equal.sum())
        same_trees += int(trees.sum())
        total += B
    assert same_visits >= 0.9 * total, (same_visits, same_trees, total)


@pytest.mark.parametrize("B,D,K,sigma", [(1, 1, 5, None), (16, 2, 8, None), (8, 1, 20, 0.3)])
def test_muzero_mlp_search_matches_torch_path(B, D, K, sigma):
    same_visits = total = 0
    for seed in range(3):
        torch.manual_seed(seed)
        base = MuZeroMLPModel((3,), 2 * D, latent_dim=24, hidden_dim=40, value_support_size=10,
                              reward_support_size=10, zero_init_heads=False, action_dim=D).eval()
        model = SampledModel(base, BoxActionSpace(-1.0, 2.0, (D,)), SampledProposal(num_samples=K), sigma=sigma)
        assert model.fused_kernel_spec().kernel == "sampled_mlp"
        obs = 2 * torch.randn(B, 3, generator=torch.Generator().manual_seed(seed))
        runs = {}
        for backend in ("torch", "cpp"):
            g = torch.Generator().manual_seed(seed)
            runs[backend] = (sampled_search(model, obs, MCTSConfig(num_simulations=30, backend=backend),
                                            generator=g), g.get_state())
        (ref, g_ref), (fused, g_fused) = runs["torch"], runs["cpp"]
        assert (ref.engine, fused.engine) == ("torch", "cpp-fused")
        assert torch.equal(g_ref, g_fused)
        assert torch.equal(root_candidates(model, ref), root_candidates(model, fused))
        trees = ref.tree.children_index.eq(fused.tree.children_index).flatten(1).all(-1)
        emb_ref, emb_fused = ref.tree.embeddings[trees], fused.tree.embeddings[trees]
        torch.testing.assert_close(emb_fused["candidate_actions"], emb_ref["candidate_actions"], rtol=0, atol=1e-5)
        torch.testing.assert_close(emb_fused["node"], emb_ref["node"], rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(fused.tree.children_reward[trees], ref.tree.children_reward[trees],
                                   rtol=1e-4, atol=1e-3)
        same_visits += int(ref.visit_counts.eq(fused.visit_counts).all(-1).sum())
        total += B
    assert same_visits >= 0.9 * total, (same_visits, total)


def test_search_is_the_same_on_any_number_of_threads():
    model = _model(1, D=2, K=6)
    obs = torch.randn(24, 3, generator=torch.Generator().manual_seed(0))
    threads = torch.get_num_threads()
    outs = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            outs.append(sampled_search(model, obs, MCTSConfig(num_simulations=20, backend="cpp"),
                                       generator=torch.Generator().manual_seed(3)))
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(outs[0].visit_counts, outs[1].visit_counts)
    assert torch.equal(outs[0].tree.embeddings["candidate_actions"], outs[1].tree.embeddings["candidate_actions"])


def test_gumbel_search_over_the_candidates_is_fused_too():
    model = _model(2, K=8)
    obs = torch.randn(8, 3, generator=torch.Generator().manual_seed(0))
    cfg = dict(num_simulations=16, max_num_considered_actions=4)
    ref, fused = (sampled_search(model, obs, GumbelMCTSConfig(backend=b, **cfg), generator=torch.Generator().manual_seed(1))
                  for b in ("torch", "cpp"))
    assert (ref.engine, fused.engine) == ("torch", "cpp-fused")
    assert torch.equal(root_candidates(model, ref), root_candidates(model, fused))
    assert ref.visit_counts.eq(fused.visit_counts).all(-1).float().mean() >= 0.85


# ----------------------------------------------------------------------------
# When the fused path is (not) taken
# ----------------------------------------------------------------------------
def _engine(model, backend: str = "auto") -> str:
    obs = torch.randn(3, *model.observation_shape)
    return sampled_search(model, obs, MCTSConfig(num_simulations=6, backend=backend),
                          generator=torch.Generator().manual_seed(0)).engine


def test_the_fused_path_is_taken_exactly_where_the_spec_is_offered():
    assert _engine(_model()) == "cpp-fused"
    assert _engine(_model(), "torch") == "torch"
    assert _engine(_model(prior="uniform", temperature=0.5)) == "cpp-fused"  # uniform at any temperature
    assert _engine(_model(sigma=0.3)) == "cpp-fused"
    # slot logits that are not all 0, or a mixture of two scales: the loop
    assert _engine(_model(temperature=0.5)) == "cpp"
    assert _engine(_model(widened_fraction=0.5)) == "cpp"
    # a base without a fused continuous step: deeper networks, a MuZero MLP with its own step, a disabled spec
    space = BoxActionSpace(-2.0, 2.0, (1,))
    deep = SampledModel(_base(0, layers=2), space, SampledProposal(num_samples=4))
    assert deep.fused_kernel_spec() is None and _engine(deep) == "cpp"
    muzero = SampledModel(MuZeroMLPModel((3,), 2, latent_dim=8, hidden_dim=8, action_dim=1), space,
                          SampledProposal(num_samples=4))
    assert _engine(muzero) == "cpp-fused"

    class OwnDynamics(MuZeroMLPModel):
        def dynamics(self, latent, action):
            return super().dynamics(latent, action)

    mine = SampledModel(OwnDynamics((3,), 2, latent_dim=8, hidden_dim=8, action_dim=1), space,
                        SampledProposal(num_samples=4))
    assert mine.fused_kernel_spec() is None and _engine(mine) == "cpp"
    off = _model()
    off.base.fused_continuous_weights = lambda: None
    assert _engine(off) == "cpp"
    # a discrete sampled model's slots index a drawn subset: never this kernel
    discrete = SampledModel(EfficientZeroMLPModel((3,), 4, latent_dim=8, hidden_dim=8, lstm_hidden_size=8),
                            DiscreteActionSpace(4), SampledProposal(num_samples=3))
    assert discrete.fused_kernel_spec() is None and _engine(discrete) == "cpp"

    class OwnDraws(SampledModel):
        def sample_node(self, step, generator=None, legal=None, proposal=None, candidates=None):
            return super().sample_node(step, generator, legal, proposal, candidates)

    own = OwnDraws(_base(0), space, SampledProposal(num_samples=4))
    assert own.fused_kernel_spec() is None and _engine(own) == "cpp"


def test_the_fused_path_never_calls_the_python_step():
    model = _model(K=4)

    def python_step(state, action, generator=None):
        raise RuntimeError("the Python search step was called")

    python_step.takes_generator = True
    model.search_step = python_step
    out = sampled_search(model, torch.randn(3, 3), MCTSConfig(num_simulations=10, backend="cpp"))
    assert out.engine == "cpp-fused" and out.visit_counts.sum(-1).eq(10).all()
    with pytest.raises(RuntimeError, match="Python search step"):
        sampled_search(model, torch.randn(3, 3), MCTSConfig(num_simulations=10, backend="torch"))


def test_kernel_rejects_bad_inputs():
    model = _model(K=4)
    spec = model.fused_kernel_spec()
    out = sampled_search(model, torch.randn(2, 3), MCTSConfig(num_simulations=5, backend="cpp"))
    g = torch.Generator().manual_seed(0)
    before = g.get_state()
    with pytest.raises(RuntimeError, match="searched already"):
        _cpp.cpp_sampled_search(out.tree, spec, PUCT(), PUCT(), g)
    assert torch.equal(g.get_state(), before)  # a rejected search draws nothing
    g = torch.Generator().manual_seed(0)
    state = model.sample_node(model.search_root(torch.randn(2, 3)), generator=g).state
    action = state["candidate_actions"][:, 0].contiguous()
    noise = torch.randn(2, 4, 1)
    with pytest.raises(RuntimeError, match=r"`noise` must have shape \[2, 4, 1\]"):
        _hook(model, state, action, torch.randn(2, 4, 2))
    with pytest.raises(RuntimeError, match="`action` must be Float"):
        _hook(model, state, action.double(), noise)
    with pytest.raises(RuntimeError, match="D >= 1"):
        _OPS.sampled_ez_recurrent(list(spec.tensors[:-2]), 0, *spec.floats[:3], spec.ints[0],
                                  *(state["node"][k] for k in KEYS), action, noise, *spec.tensors[-2:],
                                  0.0, MIN_SCALE, 1.0, PRE_TANH_BOUND)
    bad_box = [spec.tensors[-1], spec.tensors[-2]]  # low > high
    with pytest.raises(RuntimeError, match="finite low < high"):
        _OPS.sampled_ez_recurrent(list(spec.tensors[:-2]), 1, *spec.floats[:3], spec.ints[0],
                                  *(state["node"][k] for k in KEYS), action, noise, *bad_box,
                                  0.0, MIN_SCALE, 1.0, PRE_TANH_BOUND)
    with pytest.raises(RuntimeError, match="does not fit a box of D = 2 dims"):  # a D the network does not take
        _OPS.sampled_ez_recurrent(list(spec.tensors[:-2]), 2, *spec.floats[:3], spec.ints[0],
                                  *(state["node"][k] for k in KEYS), torch.zeros(2, 2), torch.zeros(2, 4, 2),
                                  torch.zeros(2) - 1, torch.ones(2), 0.0, MIN_SCALE, 1.0, PRE_TANH_BOUND)
