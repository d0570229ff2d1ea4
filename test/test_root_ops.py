"""The kernel's root noise and readout (csrc/root_ops.cpp) against the torch code they replace, bit for bit."""
import importlib

import pytest
import torch

from torchrl_muzero.mcts import MCTSConfig, _cpp
from torchrl_muzero.mcts.noise import sample_dirichlet
from torchrl_muzero.mcts.search import muzero_search, visit_result
from torchrl_muzero.mcts.tree import allocate_tree
from torchrl_muzero.modules import MuZeroMLPModel

_ops = _cpp.load_tree_ops()
pytestmark = pytest.mark.skipif(_ops is None or not hasattr(_ops, "visit_readout"),
                                reason="C++ kernel with root_ops not built")


@pytest.mark.parametrize("alpha", [0.25, 0.3, 1.0, 2.5])
@pytest.mark.parametrize("B,A", [(1, 2), (3, 5), (64, 18)])
def test_noise_mixing_equals_the_torch_code(alpha, B, A):
    g = torch.Generator().manual_seed(B * A)
    legal = torch.rand(B, A, generator=g) > 0.3
    legal[:, 0] = True
    prior = torch.softmax(torch.randn(B, 4, A, generator=g), -1)
    ref, got = prior.clone(), prior.clone()
    g_ref, g_got = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    noise = sample_dirichlet(alpha, legal, g_ref)
    ref[:, 0].mul_(1 - 0.25).add_(noise.mul_(0.25))
    got_noise = _ops.mix_dirichlet_noise(got, legal, alpha, 0.25, g_got)
    assert torch.equal(got, ref) and torch.equal(got_noise, noise)
    assert torch.equal(torch.rand(3, generator=g_ref), torch.rand(3, generator=g_got))  # the same draws used
    torch.manual_seed(3)  # no generator: the default one, as torch's
    noise = sample_dirichlet(alpha, legal)
    torch.manual_seed(3)
    assert torch.equal(_ops.mix_dirichlet_noise(prior.clone(), legal, alpha, 0.25), noise.mul_(0.25))


def _finished_tree(B, S, A, seed):
    g = torch.Generator().manual_seed(seed)
    tree = allocate_tree(B, S, A, torch.Size([1]), torch.device("cpu"))
    tree.visit_count.copy_(torch.randint(1, 9, (B, S + 1), generator=g, dtype=torch.int32))
    tree.visit_count[0, 0] = 0  # an unvisited root: value 0 / 1
    tree.value_sum.copy_(torch.randn(B, S + 1, generator=g))
    index = torch.randint(-1, S + 1, (B, S + 1, A), generator=g, dtype=torch.int32)
    index[:, 0, 0] = 1  # every root has a visited child (a draw from all-zero counts is an error in both)
    tree.children_index.copy_(index)
    return tree


@pytest.mark.parametrize("temperature", [0.0, 0.25, 1.0, 2])
def test_readout_equals_visit_result(temperature):
    for B, S, A in ((1, 10, 2), (5, 30, 7), (64, 50, 3)):
        tree = _finished_tree(B, S, A, B)
        ref = visit_result(tree, temperature, torch.Generator().manual_seed(1))
        got = _ops.visit_readout(tree.visit_count, tree.value_sum, tree.children_index, float(temperature),
                                 torch.Generator().manual_seed(1))
        for name, t in zip(("visit_counts", "search_policy", "root_value", "action"), got):
            assert torch.equal(t, getattr(ref, name)), (name, B)
            assert t.dtype == getattr(ref, name).dtype


def test_search_draws_the_same_with_and_without_the_kernel(monkeypatch):
    # The whole policy: noise, simulations and readout of the kernel path give the torch path's results.
    torch.manual_seed(0)
    model = MuZeroMLPModel((4,), 3, latent_dim=8, hidden_dim=16, num_layers=1, value_support_size=5,
                           reward_support_size=5)
    root = model.search_root(torch.randn(6, 4))
    mask = torch.ones(6, 3, dtype=torch.bool)
    mask[2, 1] = False
    cfg = MCTSConfig(num_simulations=12, temperature=0.5)
    fused = muzero_search(model, root, cfg, mask, generator=torch.Generator().manual_seed(4))
    search_module = importlib.import_module("torchrl_muzero.mcts.search")  # the package exports a `search` function
    monkeypatch.setattr(search_module, "_root_ops", lambda config, device: None)
    plain = muzero_search(model, root, cfg, mask, generator=torch.Generator().manual_seed(4))
    for name in ("visit_counts", "search_policy", "root_value", "action"):
        assert torch.equal(getattr(fused, name), getattr(plain, name)), name
    assert torch.equal(fused.tree.children_prior, plain.tree.children_prior)


@pytest.mark.parametrize("B,S,A,discount", [(1, 50, 2, 0.997), (5, 8, 6, -0.9), (3, 0, 4, 1.0)])
def test_start_tree_arrays_equal_the_torch_tree(B, S, A, discount):
    from torchrl_muzero.mcts.loop import start_tree
    from torchrl_muzero.modules.step import ModelStep

    g = torch.Generator().manual_seed(B)
    legal = torch.rand(B, A, generator=g) > 0.4
    legal[:, -1] = True
    for logits in (torch.randn(B, A, generator=g), torch.randn(B, A, generator=g, dtype=torch.float64),
                   torch.randn(A, B, generator=g).t()):  # float32, float64, non-contiguous
        root = ModelStep(torch.randn(B, 3, generator=g), torch.zeros(B), logits, torch.randn(B, generator=g))
        before = logits.clone()
        ref, got = start_tree(root, S, legal, discount), start_tree(root, S, legal, discount, ops=_ops)
        assert torch.equal(logits, before)  # the caller's logits are not written
        for name, t in ref.tensors().items():
            if name == "embeddings":
                assert got.embeddings.shape == t.shape and torch.equal(got.embeddings[:, 0], t[:, 0])
            else:
                assert torch.equal(getattr(got, name), t) and getattr(got, name).dtype == t.dtype, name
