"""The opt-in FMA path of the fused C++ searches (``MCTSConfig(kernel_precision="fma")``).

The exact path (the default) rounds every product before its sum, so its
results are bit-identical on every CPU and vector width (test_fused_search.py
and the other fused tests check that). The FMA path (csrc/mlp_kernels.h, flag
``F``) fuses the multiply-adds of the linear layers and of the support
decodes, so it rounds differently. What it keeps, and what is checked here:

* results independent of the batch size, bit for bit (every row runs the same
  fused operations in the same order, whatever tile it lands in);
* closeness to the exact path on the same weights: latents, LSTM states and
  logits within ~1e-5 relative, decoded rewards and values within the float32
  ``h^-1`` step (~1e-4, see test_fused_search.py's docstring); whole searches
  with the exact path's visit counts on most roots (a near-tie of that size
  can go either way, as between the exact path and the torch one);
* the fallback: where the kernel cannot run FMA, ``"fma"`` runs the exact
  path, with one warning;
* the config key: ``mcts.kernel_precision`` reaches every algorithm's search
  config, and a bad value is one clear error.
"""
from __future__ import annotations

import warnings

import pytest
import torch

from torchrl_muzero.mcts import MCTSConfig, _cpp, search, search_from_root
from torchrl_muzero.mcts.gumbel import GumbelMCTSConfig, gumbel_search
from torchrl_muzero.mcts.stochastic import stochastic_search
from torchrl_muzero.modules import EfficientZeroMLPModel, MuZeroMLPModel, StochasticMuZeroMLPModel
from torchrl_muzero.trainers.builders import mcts_config
from torchrl_muzero.trainers.config import ConfigError, load_config

_OPS = _cpp.load_tree_ops()
needs_fma = pytest.mark.skipif(
    _OPS is None or not _cpp.fma_available(_OPS),
    reason="the C++ kernel has no FMA path on this CPU (x86 with AVX2 + FMA needed)",
)
GAMMA = 0.997


def _scaled(model, layers):
    with torch.no_grad():  # values of a few units rather than ~0.1, as after some training
        for layer in layers:
            layer.weight.mul_(3.0)
    return model.eval()


def _muzero(seed, A=6, latent=32, hidden=48, support=300):
    torch.manual_seed(seed)
    m = MuZeroMLPModel((5,), A, latent_dim=latent, hidden_dim=hidden, value_support_size=support,
                       reward_support_size=support, zero_init_heads=False)
    return _scaled(m, (m.prediction_head, m.reward_head[-1]))


def _stochastic(seed, A=6, C=8, latent=32, hidden=48, support=300):
    torch.manual_seed(seed)
    m = StochasticMuZeroMLPModel((5,), A, chance_space_size=C, latent_dim=latent, hidden_dim=hidden,
                                 value_support_size=support, reward_support_size=support, zero_init_heads=False)
    return _scaled(m, (m.prediction_head, m.reward_head[-1], m.afterstate_value_head, m.chance_head))


def _efficientzero(seed, A=6, latent=32, hidden=48, lstm=24, support=300):
    torch.manual_seed(seed)
    m = EfficientZeroMLPModel((5,), A, latent_dim=latent, hidden_dim=hidden, value_support_size=support,
                              reward_support_size=support, zero_init_heads=False, lstm_hidden_size=lstm,
                              lstm_horizon_len=3)
    return _scaled(m, (m.prediction_head, m.value_prefix_head[-1]))


def _assert_step_close(fma, exact, kinds):
    """Per output: "state" (latents, LSTM states, logits, priors: ~1e-5 relative), "decoded" (h^-1 step), "same"."""
    for i, (x, y, kind) in enumerate(zip(fma, exact, kinds)):
        if kind == "same":
            assert torch.equal(x, y), i
        elif kind == "state":
            fin = y.isfinite()
            assert torch.equal(fin, x.isfinite()), i
            torch.testing.assert_close(x[fin], y[fin], rtol=1e-5, atol=1e-6, msg=f"output {i}")
        else:
            torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-3, msg=f"output {i}")


def _assert_rows_independent(step, B):
    """``step(rows)`` on the whole batch equals it on chunks of 1, 2, 3, 5 and 8 rows, bit for bit."""
    whole = step(slice(0, B))
    parts, at = [], 0
    for size in (1, 2, 3, 5, 8) * B:
        if at >= B:
            break
        parts.append(step(slice(at, min(B, at + size))))
        at += size
    for i, full in enumerate(whole):
        assert torch.equal(full, torch.cat([p[i] for p in parts])), i


# ----------------------------------------------------------------------------
# The network steps
# ----------------------------------------------------------------------------
@needs_fma
@pytest.mark.parametrize("latent,hidden,A,support,B", [(64, 64, 6, 300, 64), (16, 24, 2, 10, 7), (8, 8, 3, 5, 1)])
def test_muzero_step_close_to_exact_and_batch_invariant(latent, hidden, A, support, B):
    model = _muzero(latent + A, A=A, latent=latent, hidden=hidden, support=support)
    tensors, reward_eps, value_eps = model.fused_search_weights()
    g = torch.Generator().manual_seed(B)
    lat, act = torch.rand(B, latent, generator=g), torch.randint(A, (B,), generator=g)

    def step(rows, fma=True):
        return _OPS.mlp_recurrent(tensors, A, reward_eps, value_eps, lat[rows], act[rows], fma=fma)

    fma, exact = step(slice(None)), step(slice(None), fma=False)
    _assert_step_close(fma, exact, ("state", "decoded", "state", "decoded", "state"))
    if B == 64:  # the fused path really ran: some logit rounds differently
        assert not torch.equal(fma[2], exact[2])
    _assert_rows_independent(step, B)


@needs_fma
def test_unroll_hook_takes_the_fma_path():
    model = _muzero(3, A=4, latent=16, hidden=16)
    tensors, reward_eps, value_eps = model.fused_search_weights()
    lat, actions = torch.rand(6, 16), torch.randint(4, (5, 6))
    expected = lat
    for s in range(5):
        expected = _OPS.mlp_recurrent(tensors, 4, reward_eps, value_eps, expected, actions[s], fma=True)[0]
    assert torch.equal(_OPS.mlp_unroll(tensors, 4, reward_eps, value_eps, lat, actions, fma=True), expected)


@needs_fma
@pytest.mark.parametrize("A,C,support,B", [(6, 32, 300, 64), (2, 3, 10, 9)])
def test_stochastic_step_close_to_exact_and_batch_invariant(A, C, support, B):
    model = _stochastic(A + C, A=A, C=C, support=support)
    tensors, reward_eps, value_eps = model.fused_search_weights()
    g = torch.Generator().manual_seed(B)
    lat = torch.rand(B, model.latent_dim, generator=g)
    is_chance = torch.rand(B, generator=g) < 0.5
    act = torch.where(is_chance, A + torch.randint(C, (B,), generator=g), torch.randint(A, (B,), generator=g))

    def step(rows, fma=True):
        return _OPS.stochastic_recurrent(tensors, reward_eps, value_eps, lat[rows], is_chance[rows], act[rows],
                                         GAMMA, fma=fma)

    # (new latent, reward, logits, value, prior, edge discount)
    _assert_step_close(step(slice(None)), step(slice(None), fma=False),
                       ("state", "decoded", "state", "decoded", "state", "same"))
    _assert_rows_independent(step, B)


@needs_fma
@pytest.mark.parametrize("B", [33, 4])
def test_efficientzero_step_close_to_exact_and_batch_invariant(B):
    model = _efficientzero(B)
    fused = model.fused_value_prefix_weights()
    tensors, reward_eps, value_eps, ln_eps, horizon = fused
    root = model.search_root(torch.randn(B, 5, generator=torch.Generator().manual_seed(B)))
    state = root.state
    state["steps"] = torch.arange(B) % 3  # some rows reset their LSTM state at this step
    act = torch.randint(model.num_actions, (B,), generator=torch.Generator().manual_seed(0))
    leaves = [state[k].contiguous() for k in _cpp.EZ_STATE_KEYS]

    def step(rows, fma=True):
        return _OPS.ez_recurrent(tensors, model.num_actions, reward_eps, value_eps, ln_eps, horizon,
                                 *(t[rows].contiguous() for t in leaves), act[rows], fma=fma)

    # (latent, lstm_h, lstm_c, value_prefix, steps, reward, logits, value, prior)
    _assert_step_close(step(slice(None)), step(slice(None), fma=False),
                       ("state", "state", "state", "decoded", "same", "decoded", "state", "decoded", "state"))
    _assert_rows_independent(step, B)


@needs_fma
def test_unizero_step_close_to_exact():
    from torchrl_muzero.modules.unizero import UniZeroModel
    from torchrl_muzero.modules.unizero.fused import fused_search_step

    torch.manual_seed(0)
    model = UniZeroModel((4,), 3, embed_dim=32, num_layers=2, num_heads=2, context_length=2, max_blocks=5,
                         value_support_size=10, reward_support_size=10).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.15 * torch.randn_like(p))
    g = torch.Generator().manual_seed(0)
    obs, actions = torch.randn(6, 3, 4, generator=g), torch.randint(3, (6, 2), generator=g)
    state = model.search_root(obs, actions, torch.ones(6, 3, dtype=torch.bool)).state
    for depth in range(4):
        action = torch.randint(3, (6,), generator=g)
        fma, exact = fused_search_step(model, state, action, fma=True), fused_search_step(model, state, action)
        torch.testing.assert_close(fma.state["latents"], exact.state["latents"], rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(fma.policy_logits, exact.policy_logits, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(fma.reward, exact.reward, rtol=1e-4, atol=1e-3)
        torch.testing.assert_close(fma.value, exact.value, rtol=1e-4, atol=1e-3)
        state = exact.state


# ----------------------------------------------------------------------------
# Whole searches
# ----------------------------------------------------------------------------
def _same_visits(run, seeds, B):
    """Roots (of ``len(seeds) * B``) whose visit counts agree between the FMA and the exact search."""
    same = 0
    for seed in seeds:
        fma, exact = run(seed, "fma"), run(seed, "exact")
        assert fma.visit_counts.sum(-1).eq(exact.visit_counts.sum(-1)).all()
        same += int(fma.visit_counts.eq(exact.visit_counts).all(-1).sum())
    return same


@needs_fma
def test_muzero_and_gumbel_searches_agree_with_exact():
    B, seeds = 64, range(2)

    def muzero(seed, precision):
        model = _muzero(seed, A=(4, 6)[seed % 2])
        obs = 2 * torch.randn(B, 5, generator=torch.Generator().manual_seed(seed))
        cfg = MCTSConfig(num_simulations=50, backend="cpp", kernel_precision=precision)
        return search(model, obs, cfg, generator=torch.Generator().manual_seed(seed))

    def gumbel(seed, precision):
        model = _muzero(seed + 10, A=(4, 6)[seed % 2])
        obs = 2 * torch.randn(B, 5, generator=torch.Generator().manual_seed(seed))
        cfg = GumbelMCTSConfig(num_simulations=50, backend="cpp", kernel_precision=precision,
                               max_num_considered_actions=4)
        return gumbel_search(model, obs, cfg, generator=torch.Generator().manual_seed(seed))

    assert _same_visits(muzero, seeds, B) >= 0.95 * B * len(seeds)
    assert _same_visits(gumbel, seeds, B) >= 0.95 * B * len(seeds)


@needs_fma
def test_stochastic_and_efficientzero_searches_agree_with_exact():
    B, seeds = 64, range(2)

    def stochastic(seed, precision):
        model = _stochastic(seed, C=8)
        obs = 2 * torch.randn(B, 5, generator=torch.Generator().manual_seed(seed))
        cfg = MCTSConfig(num_simulations=50, backend="cpp", discount=GAMMA, kernel_precision=precision)
        return stochastic_search(model, obs, cfg, generator=torch.Generator().manual_seed(seed))

    def efficientzero(seed, precision):
        model = _efficientzero(seed)
        obs = 2 * torch.randn(B, 5, generator=torch.Generator().manual_seed(seed))
        cfg = MCTSConfig(num_simulations=50, backend="cpp", kernel_precision=precision)
        return search(model, obs, cfg, generator=torch.Generator().manual_seed(seed))

    assert _same_visits(stochastic, seeds, B) >= 0.95 * B * len(seeds)
    assert _same_visits(efficientzero, seeds, B) >= 0.95 * B * len(seeds)


@needs_fma
def test_fma_search_is_batch_invariant():
    # One root searched alone or among 63 others gives the same tree under FMA too (B = 1 runs the
    # wide 1-row tiles, B = 64 the 4-row ones).
    model = _muzero(5, A=6, latent=24, hidden=40)
    g = torch.Generator().manual_seed(0)
    latent, logits, _ = model.initial_inference(2 * torch.randn(64, 5, generator=g))
    cfg = MCTSConfig(num_simulations=30, backend="cpp", kernel_precision="fma")
    batch = search_from_root(model, latent, logits, cfg, add_noise=False)
    exact = search_from_root(model, latent, logits, MCTSConfig(num_simulations=30, backend="cpp"), add_noise=False)
    assert not torch.equal(batch.tree.raw_value, exact.tree.raw_value)  # the FMA path ran
    for i in (0, 13, 63):
        one = search_from_root(model, latent[i : i + 1], logits[i : i + 1], cfg, add_noise=False)
        for name, t in one.tree.tensors().items():
            assert torch.equal(t[0], getattr(batch.tree, name)[i]), name


def test_fallback_runs_the_exact_path_and_warns_once(monkeypatch):
    if _OPS is None or not hasattr(_OPS, "mlp_search"):
        pytest.skip("fused MLP search not built")
    model = _muzero(1, A=4, latent=16, hidden=16, support=10)
    obs = torch.randn(5, 5, generator=torch.Generator().manual_seed(0))

    def run(precision):
        cfg = MCTSConfig(num_simulations=12, backend="cpp", kernel_precision=precision)
        return search(model, obs, cfg, generator=torch.Generator().manual_seed(0))

    exact = run("exact")
    monkeypatch.setattr(_cpp, "fma_available", lambda ops=None: False)
    monkeypatch.setattr(_cpp, "_fma_fallback_warned", False)
    with pytest.warns(RuntimeWarning, match="runs the exact path"):
        first = run("fma")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        second = run("fma")  # warned once per process
    for out in (first, second):
        assert torch.equal(out.tree.raw_value, exact.tree.raw_value)
        assert torch.equal(out.visit_counts, exact.visit_counts)


# ----------------------------------------------------------------------------
# The setting
# ----------------------------------------------------------------------------
def test_bad_precision_is_one_clear_error():
    with pytest.raises(ValueError, match=r"MCTSConfig.kernel_precision must be one of \('exact', 'fma'\), "
                                         r"got 'fast'"):
        MCTSConfig(kernel_precision="fast")
    with pytest.raises(ConfigError, match=r"config key 'mcts.kernel_precision' must be one of \('exact', 'fma'\), "
                                          r"got 'FMA'"):
        load_config({"mcts": {"kernel_precision": "FMA"}})


@pytest.mark.parametrize("algo", ["muzero", "gumbel_muzero", "stochastic_muzero", "efficientzero"])
def test_config_key_reaches_every_search_config(algo):
    cfg = load_config({"algo": {"name": algo}, "mcts": {"kernel_precision": "fma"}})
    assert mcts_config(cfg).kernel_precision == "fma"
    assert mcts_config(load_config({"algo": {"name": algo}})).kernel_precision == "exact"


def test_hydra_override_picks_the_fma_path():
    from pathlib import Path

    from torchrl_muzero.trainers.hydra_entry import compose_config

    config_dir = Path(__file__).resolve().parents[1] / "sota-implementations" / "muzero" / "config"
    assert compose_config(config_dir, ["mcts.kernel_precision=fma"]).mcts.kernel_precision == "fma"
    assert compose_config(config_dir, []).mcts.kernel_precision == "exact"
    with pytest.raises(ConfigError, match="mcts.kernel_precision"):
        compose_config(config_dir, ["mcts.kernel_precision=fast"])
