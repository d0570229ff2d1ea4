"""``MCTSConfig.backend`` is the one switch of a search, root included, and ``SearchResult.engine`` says
which engine ran (issue 37).

With ``backend="torch"`` nothing of a search may reach the C++ kernel: the
tests replace the kernel's loader and UniZero's kernel helper by functions
that raise, and the torch searches still run (while the same patch breaks an
``"auto"`` search, so the patch does bite). Then each backend's recorded
engine for MuZero, UniZero and the variants, and the run's one log line.
"""
from __future__ import annotations

import json

import pytest
import torch
from pipeline_utils import tiny_config
from tensordict import TensorDict

from torchrl_muzero.data.reanalyze import muzero_reanalyze, reanalyze_policies
from torchrl_muzero.mcts import MCTSConfig, MCTSPolicy, _cpp, search
from torchrl_muzero.mcts.gumbel import GumbelMCTSConfig, gumbel_search
from torchrl_muzero.mcts.history_memory import HistoryWindowMemory
from torchrl_muzero.mcts.stochastic import stochastic_search
from torchrl_muzero.modules import MuZeroMLPModel, StochasticMuZeroMLPModel
from torchrl_muzero.modules.unizero import UniZeroModel
from torchrl_muzero.modules.unizero import fused

_OPS = _cpp.load_tree_ops()
pytestmark = pytest.mark.skipif(
    _OPS is None or not hasattr(_OPS, "unizero_search"),
    reason=f"the C++ kernel with unizero_search is not built: {_cpp.tree_ops_unavailable_reason() or 'a stale build'}",
)
L = 2


def _unizero(num_heads=2):
    torch.manual_seed(0)
    return UniZeroModel((4,), 3, embed_dim=16, num_heads=num_heads, context_length=L, max_blocks=L + 3,
                        value_support_size=5, reward_support_size=5).eval()


def _muzero(num_layers=1):
    torch.manual_seed(0)
    return MuZeroMLPModel((4,), 3, latent_dim=8, hidden_dim=8, num_layers=num_layers).eval()


class KernelCalled(RuntimeError):
    pass


@pytest.fixture
def no_kernel(monkeypatch):
    """Every way into the kernel raises: its loader and UniZero's helper (which the root uses)."""
    def refuse(*args, **kwargs):
        raise KernelCalled("the C++ kernel was called")

    monkeypatch.setattr(_cpp, "load_tree_ops", refuse)
    monkeypatch.setattr(fused, "_kernel", refuse)


def _history(B, seed=0):
    g = torch.Generator().manual_seed(seed)
    return TensorDict({"history_observation": torch.randn(B, L, 4, generator=g),
                       "history_action": torch.randint(3, (B, L), generator=g),
                       "history_count": torch.tensor([L, 1, 0][:B])}, [B])


def test_a_torch_unizero_search_never_calls_the_kernel(no_kernel):
    model, obs = _unizero(), torch.randn(3, 4)
    config = MCTSConfig(num_simulations=6, backend="torch")
    # the plain search (root from the observation) ...
    assert search(model, obs, config, add_noise=False).engine == "torch"
    # ... the acting policy, whose root is the history window built before the search ...
    policy = MCTSPolicy(model, config, generator=torch.Generator().manual_seed(0), memory=HistoryWindowMemory(L))
    td = policy(TensorDict({"observation": obs}, [3]).update(_history(3)))
    assert td["search_policy"].shape == (3, 3)
    # ... and a reanalyze search from the window the buffer rebuilds
    reanalyze = muzero_reanalyze(config)
    out = reanalyze_policies(reanalyze, model, obs, None, None, add_noise=False, generator=None, num_actions=3,
                             memory=HistoryWindowMemory(L), history=_history(3))
    assert out.shape == (3, 3)


def test_the_same_patch_stops_an_auto_search(no_kernel):
    # the patch above does reach the kernel's callers: the tests there would fail if a torch search used it
    model, obs = _unizero(), torch.randn(3, 4)
    with pytest.raises(KernelCalled):
        search(model, obs, MCTSConfig(num_simulations=6, backend="auto"), add_noise=False)
    policy = MCTSPolicy(model, MCTSConfig(num_simulations=6, backend="auto"), memory=HistoryWindowMemory(L))
    with pytest.raises(KernelCalled):
        policy(TensorDict({"observation": obs}, [3]).update(_history(3)))


def test_a_torch_search_roots_in_torch_and_an_auto_one_in_the_kernel(monkeypatch):
    calls = []
    kernel = fused._kernel
    monkeypatch.setattr(fused, "_kernel", lambda name: calls.append(name) or kernel(name))
    model, window, actions = _unizero(), torch.randn(2, L + 1, 4), torch.randint(3, (2, L))
    root = model.search_root(window, actions)  # outside any search: the kernel, as before
    assert calls == ["unizero_root_window"]
    with fused.use_kernel(False):
        torch_root = model.search_root(window, actions)
        assert torch.equal(model.root_value(window, actions), torch_root.value)
    assert calls == ["unizero_root_window"]  # not called again
    torch.testing.assert_close(torch_root.value, root.value, atol=5e-4, rtol=0)  # the decode's ~1e-4 steps
    torch.testing.assert_close(torch_root.policy_logits, root.policy_logits, atol=1e-4, rtol=1e-4)
    calls.clear()
    search(model, window[:, -1], MCTSConfig(num_simulations=4, backend="torch"))
    assert calls == []
    search(model, window[:, -1], MCTSConfig(num_simulations=4, backend="auto"))
    assert calls == ["unizero_root_window"]


@pytest.mark.parametrize("backend,fusable,expected", [
    ("auto", True, "cpp-fused"), ("cpp", True, "cpp-fused"), ("torch", True, "torch"),
    ("auto", False, "cpp"), ("cpp", False, "cpp"), ("torch", False, "torch"),
])
def test_each_backend_records_its_engine(backend, fusable, expected):
    config = MCTSConfig(num_simulations=5, backend=backend)
    obs = torch.randn(2, 4)
    # not fusable: two hidden layers (MuZero), a head dimension of 4 (UniZero): the model runs in torch
    muzero, unizero = _muzero(1 if fusable else 2), _unizero(2 if fusable else 4)
    assert search(muzero, obs, config).engine == expected
    assert search(unizero, obs, config).engine == expected
    gumbel = GumbelMCTSConfig(num_simulations=5, backend=backend, max_num_considered_actions=2)
    assert gumbel_search(muzero, obs, gumbel).engine == expected
    torch.manual_seed(0)
    stochastic = StochasticMuZeroMLPModel((4,), 3, chance_space_size=2, latent_dim=8, hidden_dim=8,
                                          num_layers=1 if fusable else 2)
    assert stochastic_search(stochastic, obs, config).engine == expected


def test_a_run_names_its_search_engine_once(tmp_path, capsys):
    from torchrl_muzero.trainers import SyncTrainer

    summary = SyncTrainer(tiny_config(tmp_path, **{"train.total_env_steps": 64})).run()
    lines = [line for line in capsys.readouterr().out.splitlines() if "search engine" in line]
    assert lines == ["torchrl_muzero: search engine: cpp-fused (mcts.backend=auto)"]
    assert summary["search_engine"] == "cpp-fused"
    assert json.loads((tmp_path / "summary.json").read_text())["search_engine"] == "cpp-fused"

    trainer = SyncTrainer(tiny_config(tmp_path / "torch", **{"mcts.backend": "torch", "algo.name": "unizero"}))
    assert trainer.search_engine == "torch"
    assert "torchrl_muzero: search engine: torch (mcts.backend=torch)" in capsys.readouterr().out


def test_a_torch_unizero_run_never_calls_the_kernel(tmp_path, no_kernel):
    """Acting, value targets (UniZero's root values) and evaluation of a run with mcts.backend=torch."""
    from torchrl_muzero.trainers import SyncTrainer

    cfg = tiny_config(tmp_path, **{"mcts.backend": "torch", "algo.name": "unizero", "algo.embed_dim": 16,
                                   "train.total_env_steps": 192, "train.train_start_after_envsteps": 64,
                                   "optim.batch_size": 8})
    summary = SyncTrainer(cfg).run()
    assert summary["status"] == "ok" and summary["train_iter"] > 0 and summary["search_engine"] == "torch"
