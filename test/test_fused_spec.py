"""One backend choice (issue 38): a model offers at most one fused search, ``fused_kernel_spec()``.

Each model the kernel mirrors names its entry (EfficientZero's is ``"ez"``,
not MuZero's ``"mlp"``); models it does not mirror, and subclasses that
change the step, answer ``None``. The search runs a spec's entry only when
the tree's node state is the declared one: a user's model whose spec does
not fit the tree is searched per simulation (``"cpp"`` / ``"torch"``), with
the loop's results, instead of crashing. And ``search.py`` decides from the
spec alone: it neither probes the old per-variant method names nor imports a
variant's node-state keys.
"""
from __future__ import annotations

import importlib
import inspect

import pytest
import torch

from torchrl_muzero.mcts import MCTSConfig, _cpp, search
from torchrl_muzero.mcts.search import muzero_search
from torchrl_muzero.mcts.stochastic import stochastic_search
from torchrl_muzero.modules import (EfficientZeroMLPModel, EfficientZeroResNetModel, MuZeroMLPModel,
                                    MuZeroResNetModel, RNNFullObsMLPModel, StochasticMuZeroMLPModel,
                                    StochasticMuZeroResNetModel)
from torchrl_muzero.modules.efficientzero import EZ_NODE_STATE
from torchrl_muzero.modules.fused_spec import FusedSpec, StateLeaf, fused_spec_of
from torchrl_muzero.modules.unizero import UniZeroModel
from torchrl_muzero.modules.unizero.fused import UZ_NODE_STATE, UZ_STATE_KEYS

_OPS = _cpp.load_tree_ops()
# the modules (the package's `search` is the function of the same name)
search_module = importlib.import_module("torchrl_muzero.mcts.search")
stochastic_module = importlib.import_module("torchrl_muzero.mcts.stochastic")


def _need(entry: str) -> None:
    if _OPS is None or not hasattr(_OPS, entry):
        why = _cpp.tree_ops_unavailable_reason() or "a stale build"
        pytest.skip(f"the C++ kernel with {entry} is not built: {why}")


def _muzero(cls=MuZeroMLPModel, **kw):
    torch.manual_seed(0)
    return cls((4,), 3, latent_dim=8, hidden_dim=16, zero_init_heads=False, **kw).eval()


def _efficientzero(cls=EfficientZeroMLPModel, **kw):
    torch.manual_seed(0)
    return cls((4,), 3, latent_dim=8, hidden_dim=16, lstm_hidden_size=8, zero_init_heads=False, **kw).eval()


def _stochastic(cls=StochasticMuZeroMLPModel, **kw):
    torch.manual_seed(0)
    return cls((4,), 3, chance_space_size=4, latent_dim=8, hidden_dim=16, zero_init_heads=False, **kw).eval()


def _unizero(cls=UniZeroModel, kv_cache=True):
    torch.manual_seed(0)
    return cls((4,), 3, embed_dim=16, num_heads=2, context_length=2, max_blocks=5, kv_cache=kv_cache).eval()


def _uz_root(model, B=4):
    g = torch.Generator().manual_seed(1)
    return model.search_root(torch.randn(B, 3, 4, generator=g), torch.randint(3, (B, 2), generator=g))


def _same(a, b) -> bool:
    return (torch.equal(a.visit_counts, b.visit_counts) and torch.equal(a.root_value, b.root_value)
            and torch.equal(a.action, b.action))


# -- each model's one spec ---------------------------------------------------------------------------


def test_each_fusable_model_names_its_kernel():
    assert _muzero().fused_kernel_spec().kernel == "mlp"
    assert _stochastic().fused_kernel_spec().kernel == "stochastic"
    for kv_cache in (True, False):
        spec = _unizero(kv_cache=kv_cache).fused_kernel_spec()
        assert spec.kernel == "unizero"
        assert [leaf.key for leaf in spec.node_state] == list(UZ_STATE_KEYS if kv_cache else UZ_STATE_KEYS[:3])


def test_efficientzero_offers_ez_not_mlp():
    model = _efficientzero()
    spec = model.fused_kernel_spec()
    assert spec.kernel == "ez"
    assert model.fused_search_weights() is None  # MuZero's entry reads a reward head, not a value prefix
    # the spec declares the leaves in the order the kernel's wrapper passes them
    assert tuple(leaf.key for leaf in spec.node_state) == _cpp.EZ_STATE_KEYS
    assert spec.node_state is EZ_NODE_STATE


def test_the_spec_carries_the_weights_methods_answer():
    # the spec is built on the public weights methods, which stay as they were (tests and benchmarks use them)
    model = _muzero()
    tensors, reward_eps, value_eps = model.fused_search_weights()
    spec = model.fused_kernel_spec()
    assert all(torch.equal(a, b) for a, b in zip(spec.tensors, tensors)) and len(spec.tensors) == len(tensors)
    assert spec.floats == (reward_eps, value_eps) and spec.ints == ()
    model = _efficientzero()
    tensors, reward_eps, value_eps, ln_eps, horizon = model.fused_value_prefix_weights()
    spec = model.fused_kernel_spec()
    assert len(spec.tensors) == len(tensors) and spec.floats == (reward_eps, value_eps, ln_eps)
    assert spec.ints == (horizon,)
    model = _unizero()
    tensors, ints, floats = model.fused_unizero_weights()
    spec = model.fused_kernel_spec()
    assert spec.tensors is tensors and spec.ints is ints and spec.floats is floats  # UniZero's cached lists


@pytest.mark.parametrize("build", [
    lambda: MuZeroResNetModel((3, 8, 8), 2, channels=8, num_blocks=1, downsample=False),
    lambda: EfficientZeroResNetModel((3, 8, 8), 2, channels=8, num_blocks=1, downsample=False),
    lambda: StochasticMuZeroResNetModel((3, 8, 8), 2, chance_space_size=3, channels=8, num_blocks=1, downsample=False),
    lambda: RNNFullObsMLPModel((4,), 2),
    lambda: _muzero(num_layers=2),
    lambda: _efficientzero(num_layers=2),
    lambda: _stochastic(num_layers=2),
    lambda: _muzero().double(),
    lambda: UniZeroModel((4,), 2, embed_dim=16, num_heads=4),  # head dim 4: not a multiple of 8
], ids=["muzero-resnet", "ez-resnet", "stochastic-resnet", "rnn", "muzero-2-layers", "ez-2-layers",
        "stochastic-2-layers", "float64", "unizero-head-dim-4"])
def test_models_the_kernel_does_not_mirror_offer_none(build):
    assert build().fused_kernel_spec() is None


def test_a_subclass_that_overrides_the_step_gets_none():
    class MuZeroStep(MuZeroMLPModel):
        def recurrent_inference_scalar(self, latent, action):
            return super().recurrent_inference_scalar(latent, action)

    class EfficientZeroStep(EfficientZeroMLPModel):
        def search_step(self, state, action):
            return super().search_step(state, action)

    class StochasticStep(StochasticMuZeroMLPModel):
        def search_step(self, state, action, discount=None):
            return super().search_step(state, action, discount)

    class UniZeroStep(UniZeroModel):
        def search_step(self, state, action):
            return super().search_step(state, action)

    assert _muzero(MuZeroStep).fused_kernel_spec() is None
    assert _efficientzero(EfficientZeroStep).fused_kernel_spec() is None
    assert _stochastic(StochasticStep).fused_kernel_spec() is None
    assert _unizero(UniZeroStep).fused_kernel_spec() is None


def test_switching_the_weights_method_off_on_an_instance_switches_the_spec_off():
    # what the tests and benchmarks do to compare the fused search with the per-simulation loop
    model = _muzero()
    model.fused_search_weights = lambda: None
    assert model.fused_kernel_spec() is None
    model = _efficientzero()
    model.fused_value_prefix_weights = lambda: None
    assert model.fused_kernel_spec() is None


def test_a_spec_names_a_known_kernel_and_checks_the_node_state():
    with pytest.raises(ValueError, match="one of"):
        FusedSpec("mlp_search", [])
    spec = FusedSpec("ez", [], node_state=EZ_NODE_STATE)
    state = _efficientzero().search_root(torch.randn(2, 4)).state.unsqueeze(1).expand(2, 3).contiguous()
    assert spec.matches(state)
    assert not spec.matches(state.exclude("steps"))  # a leaf missing
    assert not spec.matches(state.clone().set("extra", torch.zeros(2, 3)))  # a leaf more
    state["steps"] = state["steps"].int()
    assert not spec.matches(state)  # another dtype
    assert not spec.matches(torch.zeros(2, 3, 8))  # a plain tensor for a TensorDict state
    flat = FusedSpec("mlp", [], node_state=(StateLeaf(None, torch.float32, 3),))
    assert flat.matches(torch.zeros(2, 3, 8)) and not flat.matches(torch.zeros(2, 3, 8, 1))
    assert not flat.matches(torch.zeros(2, 8, 3).transpose(1, 2))  # the kernel reads contiguous rows
    assert fused_spec_of(object()) is None  # a duck-typed model without the method


# -- the search: the spec's entry when the tree fits, else the loop ---------------------------------------


def test_every_fusable_model_runs_fused():
    obs = torch.randn(4, 4)
    cfg = MCTSConfig(num_simulations=8, backend="cpp")
    for model, entry in ((_muzero(), "mlp_search"), (_efficientzero(), "ez_search")):
        _need(entry)
        assert search(model, obs, cfg, generator=torch.Generator().manual_seed(0)).engine == "cpp-fused"
    _need("unizero_search")
    for kv_cache in (True, False):
        model = _unizero(kv_cache=kv_cache)
        assert muzero_search(model, _uz_root(model), cfg).engine == "cpp-fused"


class _MisdeclaredMuZero(MuZeroMLPModel):
    """A user's model whose spec declares a TensorDict node state; its search tree holds a plain latent."""

    def fused_kernel_spec(self):
        spec = super().fused_kernel_spec()
        return FusedSpec("mlp", spec.tensors, floats=spec.floats, node_state=(StateLeaf("latent", torch.float32, 3),))


class _EzSpecOnMuZero(MuZeroMLPModel):
    """A user's model that hands EfficientZero's entry to MuZero's tree: the keys do not match."""

    def fused_kernel_spec(self):
        return _efficientzero().fused_kernel_spec()


class _StochasticSpecOnMuZero(MuZeroMLPModel):
    """A spec whose entry is not MuZero's search's (Stochastic MuZero's own)."""

    def fused_kernel_spec(self):
        return _stochastic().fused_kernel_spec()


@pytest.mark.parametrize("cls", [_MisdeclaredMuZero, _EzSpecOnMuZero, _StochasticSpecOnMuZero])
def test_a_spec_that_does_not_fit_the_tree_falls_back_to_the_loop(cls):
    model, loop = _muzero(cls), _muzero()
    loop.fused_search_weights = lambda: None
    obs = torch.randn(5, 4)
    backends = ("torch",) + (("cpp",) if _OPS is not None else ())
    for backend in backends:
        cfg = MCTSConfig(num_simulations=12, backend=backend)
        out = search(model, obs, cfg, generator=torch.Generator().manual_seed(3))
        ref = search(loop, obs, cfg, generator=torch.Generator().manual_seed(3))
        assert out.engine == ref.engine == backend
        assert _same(out, ref)


def test_a_unizero_spec_without_the_trees_kv_falls_back():
    # the keys come from the spec, not from the model's kv_cache flag: a spec declaring the recompute
    # state for a tree that holds the cache is not run
    _need("unizero_search")

    class NoKv(UniZeroModel):
        def fused_kernel_spec(self):
            spec = super().fused_kernel_spec()
            return FusedSpec("unizero", spec.tensors, spec.ints, spec.floats, UZ_NODE_STATE[:3])

    model = _unizero(NoKv, kv_cache=True)
    cfg = MCTSConfig(num_simulations=8, backend="cpp")
    assert muzero_search(model, _uz_root(model), cfg).engine == "cpp"


def test_a_stochastic_spec_that_does_not_fit_falls_back():
    _need("stochastic_search")

    class Misdeclared(StochasticMuZeroMLPModel):
        def fused_kernel_spec(self):
            spec = super().fused_kernel_spec()
            return FusedSpec("stochastic", spec.tensors, floats=spec.floats,
                             node_state=(StateLeaf("latent", torch.float32, 3),))  # no "is_chance"

    model, loop = _stochastic(Misdeclared), _stochastic()
    loop.fused_search_weights = lambda: None
    obs = torch.randn(4, 4)
    cfg = MCTSConfig(num_simulations=12, backend="auto")
    out = stochastic_search(model, obs, cfg, generator=torch.Generator().manual_seed(2))
    ref = stochastic_search(loop, obs, cfg, generator=torch.Generator().manual_seed(2))
    assert out.engine == ref.engine and out.engine in ("cpp", "torch")
    assert _same(out, ref)
    assert stochastic_search(_stochastic(), obs, cfg).engine in ("cpp-fused", "torch")


def test_the_search_decides_from_the_spec_alone():
    _need("mlp_search")
    inner = _muzero()
    obs = torch.randn(4, 4)
    cfg = MCTSConfig(num_simulations=10, backend="cpp")

    class OldNames:
        """A duck-typed model with the old per-variant method but no spec: the search does not probe it."""

        search_step = inner.search_step
        fused_search_weights = inner.fused_search_weights

    class WithSpec(OldNames):
        fused_kernel_spec = inner.fused_kernel_spec

    ref = muzero_search(inner, inner.search_root(obs), cfg, generator=torch.Generator().manual_seed(0))
    old = muzero_search(OldNames(), inner.search_root(obs), cfg, generator=torch.Generator().manual_seed(0))
    new = muzero_search(WithSpec(), inner.search_root(obs), cfg, generator=torch.Generator().manual_seed(0))
    assert old.engine == "cpp" and new.engine == ref.engine == "cpp-fused"
    assert _same(new, ref)


def test_search_py_knows_no_variant():
    # a complement to the behaviour tests above: the source of the decision holds no per-variant names
    source = inspect.getsource(search_module)
    for name in ("fused_search_weights", "fused_value_prefix_weights", "fused_unizero_weights", "UZ_STATE_KEYS",
                 "EZ_STATE_KEYS", "kv_cache", "hasattr(model", "getattr(model, \"fused"):
        assert name not in source, name
    for function in (search_module.run_engine, search_module._run_fused):
        assert "hasattr(" not in inspect.getsource(function)
    stochastic_source = inspect.getsource(stochastic_module)
    assert "fused_search_weights" not in stochastic_source and "hasattr(" not in stochastic_source
