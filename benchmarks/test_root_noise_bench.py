"""The root's Dirichlet noise per call: the fused searches' C++ mixing and the torch path's sampler.

Both draw their Gamma variates with ATen's ``_standard_gamma`` from the search's
generator (mcts/noise.py, csrc/root_ops.cpp). One torch thread.

Run: python -m pytest benchmarks/test_root_noise_bench.py --benchmark-only --benchmark-columns=min,median
"""
import pytest
import torch

from torchrl_muzero.mcts import _cpp
from torchrl_muzero.mcts.noise import sample_dirichlet

CASES = [(1, 2), (8, 6), (64, 6)]  # (B, A)


@pytest.mark.parametrize("B,A", CASES, ids=[f"B{b}xA{a}" for b, a in CASES])
def test_torch_sample_dirichlet(benchmark, B, A):
    legal, g = torch.ones(B, A, dtype=torch.bool), torch.Generator().manual_seed(0)
    noise = benchmark(sample_dirichlet, 0.25, legal, g)
    assert torch.allclose(noise.sum(-1), torch.ones(B))


@pytest.mark.parametrize("B,A", CASES, ids=[f"B{b}xA{a}" for b, a in CASES])
def test_cpp_mix_dirichlet_noise(benchmark, B, A):
    ops = _cpp.load_tree_ops()
    if ops is None or not hasattr(ops, "mix_dirichlet_noise"):
        pytest.skip("C++ kernel with root_ops not built")
    prior = torch.softmax(torch.randn(B, 51, A), -1)
    legal, g = torch.ones(B, A, dtype=torch.bool), torch.Generator().manual_seed(0)
    noise = benchmark(ops.mix_dirichlet_noise, prior, legal, 0.25, 0.25, g)
    assert torch.allclose(noise.sum(-1), torch.ones(B))
