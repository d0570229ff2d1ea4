"""Gumbel MuZero's fast path: the cached considered-visit table, the C++ readout, the per-call prior cache.

* ``cached_considered_visit_table`` is the freshly built table, built once;
* the kernel's ``gumbel_readout`` (``gumbel_result(kernel=True)``) reads a
  finished tree as the torch ``gumbel_result`` does: the same visit counts,
  root value and action, the improved policy to float32 rounding;
* the fused search (which reads its result in C++) against the torch reading
  of the very tree it grew;
* the C++ Gumbel rules' prior cache reuses per-thread buffers across calls of
  any size: select calls on trees of different shapes, interleaved, still
  match the torch descent.
"""
from __future__ import annotations

import pytest
import torch

from torchrl_muzero.mcts import _cpp
from torchrl_muzero.mcts.gumbel import (GumbelInteriorRule, GumbelMCTSConfig, GumbelRootRule, gumbel_muzero_search,
                                        gumbel_result, gumbel_search)
from torchrl_muzero.mcts.loop import start_tree
from torchrl_muzero.mcts.select import descend
from torchrl_muzero.mcts.seq_halving import cached_considered_visit_table, considered_visit_table
from torchrl_muzero.modules import MuZeroMLPModel

HAVE_READOUT = _cpp.has_gumbel_readout()
needs_readout = pytest.mark.skipif(not HAVE_READOUT, reason="C++ kernel without gumbel_readout")


@pytest.mark.parametrize("m,n", [(1, 5), (2, 7), (4, 10), (16, 50), (6, 3), (16, 200)])
def test_cached_table_equals_the_fresh_one(m, n):
    cached = cached_considered_visit_table(m, n)
    assert torch.equal(cached, considered_visit_table(m, n))
    assert cached.dtype == torch.long and cached.shape == (m + 1, n)
    assert cached_considered_visit_table(m, n) is cached  # built once
    assert cached_considered_visit_table(m, n, torch.device("cpu")) is cached


def _model(A: int, seed: int) -> MuZeroMLPModel:
    torch.manual_seed(seed)
    return MuZeroMLPModel((4,), A, latent_dim=16, hidden_dim=32, zero_init_heads=False)


def _mask(B: int, A: int, seed: int) -> torch.Tensor:
    mask = torch.rand(B, A, generator=torch.Generator().manual_seed(seed)) > 0.35
    mask[:, seed % A] = True
    return mask


def _assert_readouts_agree(tree, config):
    torch_out = gumbel_result(tree, config)
    kernel_out = gumbel_result(tree, config, kernel=True)
    assert kernel_out.visit_counts.dtype == torch_out.visit_counts.dtype
    assert torch.equal(kernel_out.visit_counts, torch_out.visit_counts)
    assert torch.equal(kernel_out.root_value, torch_out.root_value)
    assert torch.equal(kernel_out.action, torch_out.action)
    torch.testing.assert_close(kernel_out.search_policy, torch_out.search_policy, atol=1e-6, rtol=1e-5)
    assert bool((kernel_out.search_policy[~tree.root_legal] == 0).all())


@needs_readout
@pytest.mark.parametrize("two_player", [False, True])
@pytest.mark.parametrize("rescale,add_noise,m", [(True, True, 4), (False, True, 16), (True, False, 2)])
def test_kernel_readout_equals_the_torch_readout(two_player, rescale, add_noise, m):
    B, A, S = 9, 6, 24
    model = _model(A, 1)
    root = model.search_root(torch.randn(B, 4, generator=torch.Generator().manual_seed(2)))
    config = GumbelMCTSConfig(num_simulations=S, max_num_considered_actions=m, rescale_values=rescale,
                              backend="torch")
    out = gumbel_muzero_search(model, root, config, action_mask=_mask(B, A, 3), two_player=two_player,
                               add_noise=add_noise, generator=torch.Generator().manual_seed(4))
    _assert_readouts_agree(out.tree, config)


@needs_readout
def test_kernel_readout_of_an_unsearched_tree():
    # No simulation yet: every completed Q is the raw value, the winner the best g + logits.
    B, A = 3, 4
    model = _model(A, 5)
    root = model.search_root(torch.randn(B, 4))
    legal = _mask(B, A, 6)
    tree = start_tree(root, 4, legal, 0.997)
    tree.extra["gumbel"] = torch.randn(B, A, generator=torch.Generator().manual_seed(7))
    _assert_readouts_agree(tree, GumbelMCTSConfig(num_simulations=4))


@needs_readout
def test_fused_search_reads_its_tree_as_torch_would():
    B, A = 32, 5
    model = _model(A, 8)
    if model.fused_search_weights() is None:
        pytest.skip("no fused search for this model")
    config = GumbelMCTSConfig(num_simulations=30, max_num_considered_actions=4, backend="cpp")
    out = gumbel_search(model, torch.randn(B, 4), config, action_mask=_mask(B, A, 9),
                        generator=torch.Generator().manual_seed(10))
    again = gumbel_result(out.tree, config)  # the torch reading of the same tree
    assert torch.equal(out.visit_counts, again.visit_counts)
    assert torch.equal(out.action, again.action)
    assert torch.equal(out.root_value, again.root_value)
    torch.testing.assert_close(out.search_policy, again.search_policy, atol=1e-6, rtol=1e-5)
    assert out.visit_counts.sum(-1).eq(30).all()


@pytest.mark.skipif(_cpp.load_tree_ops() is None, reason="C++ tree kernel not built")
def test_prior_cache_across_calls_of_different_sizes():
    """Interleaved selects on two Gumbel trees of other shapes match the torch descent at every step."""
    params = (0.1, 50.0, True)
    rules = (GumbelRootRule(*params), GumbelInteriorRule(*params))
    grown = []
    for B, A, S, seed in ((7, 6, 20, 11), (3, 4, 33, 12)):
        model = _model(A, seed)
        root = model.search_root(torch.randn(B, 4, generator=torch.Generator().manual_seed(seed)))
        config = GumbelMCTSConfig(num_simulations=S, max_num_considered_actions=4, backend="torch")
        tree = gumbel_muzero_search(model, root, config, action_mask=_mask(B, A, seed),
                                    generator=torch.Generator().manual_seed(seed)).tree
        grown.append(tree)
    for _ in range(3):
        for tree in grown:
            # Descents of the finished trees: deep paths through many cached nodes.
            c_node, c_action = _cpp.cpp_select(tree, *rules)
            t_node, t_action = descend(tree, *rules)
            assert torch.equal(c_node, t_node) and torch.equal(c_action, t_action)
