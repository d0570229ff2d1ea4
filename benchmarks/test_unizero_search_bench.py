"""UniZero search speed: the exact KV cache against recomputing the whole context at every expansion.

LightZero's CartPole UniZero sizes (embed 64, 2 layers, 2 heads, RoPE,
context_length 4 = 9 root tokens, max_blocks 10), 101-bin supports, 2 actions,
50 simulations, one torch thread, B roots with a full history window.
``kv_cache=True`` appends two tokens per expansion to the parent's cached
keys/values; ``kv_cache=False`` runs two full causal forwards over the node's
whole context per expansion (same outputs and visit counts, tested in
test/test_unizero_model.py). Speed-up = mean(recompute) / mean(cache).

Engines: ``fused`` runs every simulation in one C++ call (csrc/unizero_net.h:
the transformer step in C++, the cache keyed by tree node, or the full
recompute), ``torch_step`` calls the torch ``search_step`` per simulation
(the tree bookkeeping in C++ with UZ_BACKEND=cpp). Both modes of one engine
are the cache-vs-recompute comparison; the fused engine is what ``auto``
picks when the kernel is built.

Run: python -m pytest benchmarks/test_unizero_search_bench.py --benchmark-only
     --benchmark-columns=mean,median,rounds
"""
import os

import pytest
import torch

from torchrl_muzero.mcts import MCTSConfig
from torchrl_muzero.mcts.search import muzero_search
from torchrl_muzero.modules.unizero import UniZeroModel

SIMS, ACTIONS = 50, 2
# the tree backend (the model steps are torch either way): UZ_BACKEND=torch|cpp|auto
BACKEND = os.environ.get("UZ_BACKEND", "auto")
BATCHES = [1, 8, 64]
# "cartpole": LightZero's CartPole sizes. "long": a longer context and a wider model (33 root tokens,
# 64 slots), where a full recompute per expansion costs more than the per-op overhead of the cache.
SIZES = {
    "cartpole": dict(embed_dim=64, num_layers=2, num_heads=2, context_length=4, max_blocks=10),
    "long": dict(embed_dim=128, num_layers=2, num_heads=4, context_length=16, max_blocks=32),
}


def _model(kv_cache: bool, size: str = "cartpole") -> UniZeroModel:
    torch.manual_seed(0)
    # random heads (not zero-initialised): the tree shape, and so its cost, follows the values
    return UniZeroModel((4,), ACTIONS, position="rope", kv_cache=kv_cache, zero_init_heads=False,
                        **SIZES[size]).eval()


def _window(B: int, size: str = "cartpole"):
    g = torch.Generator().manual_seed(0)
    K = SIZES[size]["context_length"]
    return torch.randn(B, K + 1, 4, generator=g), torch.randint(ACTIONS, (B, K), generator=g)


class _TorchStep:
    """The model seen through its torch ``search_step`` only (no ``fused_unizero_weights``): the per-step path."""

    def __init__(self, model: UniZeroModel) -> None:
        self.search_step = model.search_step


@pytest.mark.parametrize("engine", ["fused", "torch_step"])
@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("B", BATCHES)
@pytest.mark.parametrize("kv_cache", [True, False], ids=["cache", "recompute"])
def test_unizero_search(benchmark, B, kv_cache, size, engine):
    model = _model(kv_cache, size)
    searched = model if engine == "fused" else _TorchStep(model)
    if engine == "fused" and model.fused_unizero_weights() is None:
        pytest.skip("the fused UniZero search does not run this model")
    obs, actions = _window(B, size)
    cfg = MCTSConfig(num_simulations=SIMS, backend=BACKEND)

    def run():
        gen = torch.Generator().manual_seed(0)
        return muzero_search(searched, model.search_root(obs, actions), cfg, generator=gen)

    run()  # warm-up
    out = benchmark.pedantic(run, rounds={1: 8, 8: 5, 64: 2}[B], iterations=1)
    assert out.visit_counts.sum(-1).eq(SIMS).all()
    benchmark.extra_info["searches_per_s"] = B / benchmark.stats.stats.mean


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("B", BATCHES)
@pytest.mark.parametrize("kv_cache", [True, False], ids=["cache", "recompute"])
def test_unizero_steps_only(benchmark, B, kv_cache, size):
    """The network's share: the root and 50 search steps down one path (no tree), a slide included."""
    model = _model(kv_cache, size)
    obs, actions = _window(B, size)
    path = torch.randint(ACTIONS, (SIMS, B), generator=torch.Generator().manual_seed(1))
    depth = SIZES[size]["max_blocks"] - SIZES[size]["context_length"] - 1  # steps before a slide

    def run():
        root = model.search_root(obs, actions)
        state = root.state
        for s in range(SIMS):  # restart from the root every `depth` steps: search-like depths
            state = model.search_step(root.state if s % depth == 0 else state, path[s]).state
        return state

    run()
    benchmark.pedantic(run, rounds={1: 8, 8: 5, 64: 2}[B], iterations=1)
