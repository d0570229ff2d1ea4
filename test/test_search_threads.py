"""The fused C++ searches split their trees over torch's intra-op threads (csrc/fused_loop.h's
for_row_chunks): the same trees, bit for bit, on any number of threads.

B = 200 is seven groups of 32 trees (the last one partial): two threads take three and four
groups, three threads two, two and three. B = 40 splits inside a group, in units of four trees
(csrc/fused_loop.h's split_unit): 20 + 20 trees on two threads, 12 + 12 + 16 on three. Every
tensor of the tree is compared, not only the visit counts.

The split itself (its chunks, the threads that run them, an error in one chunk) is tested
through the kernel's test hook ``row_chunks_probe``; and where the kernel runs on torch's
OpenMP team, that the process holds one OpenMP runtime, torch's (a second one would bring the
spinning-worker contention that made two threads no faster than one: docs/performance_search.md, "One OpenMP team").
"""
from __future__ import annotations

import os

import pytest
import torch
from kernel_threads import kernel_on_threads

from torchrl_muzero.kernel import build as _kernel_build
from torchrl_muzero.mcts import MCTSConfig, _cpp, search
from torchrl_muzero.mcts.gumbel import GumbelMCTSConfig, gumbel_search
from torchrl_muzero.mcts.stochastic import stochastic_search
from torchrl_muzero.modules import EfficientZeroMLPModel, MuZeroMLPModel, StochasticMuZeroMLPModel

pytestmark = pytest.mark.skipif(_cpp.load_tree_ops() is None, reason="the C++ kernel is not built")


def _obs(seed: int, trees: int) -> torch.Tensor:
    return 2 * torch.randn(trees, 5, generator=torch.Generator().manual_seed(seed))


def _heads_scaled(model, layers):
    with torch.no_grad():  # values of a few units, as after some training: deeper, less uniform trees
        for layer in layers:
            layer.weight.mul_(3.0)
    return model.eval()


def _muzero_search(precision: str, trees: int):
    torch.manual_seed(0)
    m = MuZeroMLPModel((5,), 6, latent_dim=32, hidden_dim=48, zero_init_heads=False)
    model = _heads_scaled(m, (m.prediction_head, m.reward_head[-1]))
    cfg = MCTSConfig(num_simulations=40, backend="cpp", kernel_precision=precision)
    return lambda: search(model, _obs(1, trees), cfg, generator=torch.Generator().manual_seed(1))


def _gumbel_search(precision: str, trees: int):
    torch.manual_seed(1)
    m = MuZeroMLPModel((5,), 6, latent_dim=32, hidden_dim=48, zero_init_heads=False)
    model = _heads_scaled(m, (m.prediction_head, m.reward_head[-1]))
    cfg = GumbelMCTSConfig(num_simulations=40, backend="cpp", kernel_precision=precision,
                           max_num_considered_actions=4)
    return lambda: gumbel_search(model, _obs(2, trees), cfg, generator=torch.Generator().manual_seed(2))


def _stochastic_search(precision: str, trees: int):
    torch.manual_seed(2)
    m = StochasticMuZeroMLPModel((5,), 6, chance_space_size=8, latent_dim=32, hidden_dim=48,
                                 zero_init_heads=False)
    model = _heads_scaled(m, (m.prediction_head, m.reward_head[-1], m.chance_head))
    cfg = MCTSConfig(num_simulations=40, backend="cpp", discount=0.997, kernel_precision=precision)
    return lambda: stochastic_search(model, _obs(3, trees), cfg, generator=torch.Generator().manual_seed(3))


def _efficientzero_search(precision: str, trees: int):
    torch.manual_seed(3)
    m = EfficientZeroMLPModel((5,), 6, latent_dim=32, hidden_dim=48, zero_init_heads=False,
                              lstm_hidden_size=24, lstm_horizon_len=3)
    model = _heads_scaled(m, (m.prediction_head, m.value_prefix_head[-1]))
    cfg = MCTSConfig(num_simulations=40, backend="cpp", kernel_precision=precision)
    return lambda: search(model, _obs(4, trees), cfg, generator=torch.Generator().manual_seed(4))


SEARCHES = {"muzero": _muzero_search, "gumbel_muzero": _gumbel_search,
            "stochastic_muzero": _stochastic_search, "efficientzero": _efficientzero_search}


def _same(a, b) -> bool:
    """Bit for bit, for a tensor or a TensorDict of them (a node state: latents, LSTM states)."""
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    keys = sorted(a.keys(True, True), key=str)
    return keys == sorted(b.keys(True, True), key=str) and all(torch.equal(a[k], b[k]) for k in keys)


KERNELS = {"muzero": "mlp_search", "gumbel_muzero": "mlp_search", "stochastic_muzero": "stochastic_search",
           "efficientzero": "ez_search"}


def _kernel_on_threads(monkeypatch, algo: str, threads: int) -> list[int]:
    return kernel_on_threads(monkeypatch, _cpp.load_tree_ops(), KERNELS[algo], threads)


@pytest.mark.parametrize("trees", [200, 40])
@pytest.mark.parametrize("precision", ["exact", "fma"])
@pytest.mark.parametrize("algo", SEARCHES)
def test_a_search_gives_the_same_trees_on_any_number_of_threads(algo, precision, trees, monkeypatch):
    if precision == "fma" and not _cpp.fma_available():
        pytest.skip("no FMA path on this CPU")
    run = SEARCHES[algo](precision, trees)
    assert torch.get_num_threads() == 1  # test/conftest.py
    one = run()
    assert one.tree.visit_count[:, 0].min() > 0  # the search ran on every tree
    for threads in (2, 3):
        with monkeypatch.context() as patch:
            calls = _kernel_on_threads(patch, algo, threads)
            split = run()
        assert calls == [threads]  # the fused kernel ran, on that many threads
        for name, value in one.tree.tensors().items():
            assert _same(value, getattr(split.tree, name)), (algo, threads, name)
        assert torch.equal(one.visit_counts, split.visit_counts)
        assert torch.equal(one.action, split.action)


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("trees", [1, 4, 5, 8, 33, 64, 127, 128, 200, 256])
def test_the_trees_split_in_whole_units_one_chunk_per_thread(trees, threads):
    ops = _cpp.load_tree_ops()
    torch.set_num_threads(threads)
    try:
        ranges, distinct = ops.row_chunks_probe(trees)
    finally:
        torch.set_num_threads(1)
    # whole groups of 32 trees where each thread gets two at least, else units of 4 trees
    unit = 32 if trees >= 2 * threads * 32 else 4
    units = -(-trees // unit)
    assert len(ranges) == min(threads, units)
    assert distinct == len(ranges)  # each chunk on a thread of its own
    assert ranges[0][0] == 0 and ranges[-1][1] == trees  # every tree once, in order
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert all(b0 % unit == 0 for b0, _ in ranges)
    sizes = [-(-(b1 - b0) // unit) for b0, b1 in ranges]
    assert max(sizes) - min(sizes) <= 1  # units shared as evenly as they go


def test_small_searches_split_evenly_inside_a_group():
    ops = _cpp.load_tree_ops()
    torch.set_num_threads(2)
    try:
        assert ops.row_chunks_probe(8)[0] == [(0, 4), (4, 8)]
        assert ops.row_chunks_probe(33)[0] == [(0, 16), (16, 33)]  # not 32 + 1
        assert ops.row_chunks_probe(3)[0] == [(0, 3)]  # below two units: one thread
        assert ops.row_chunks_probe(128)[0] == [(0, 64), (64, 128)]
    finally:
        torch.set_num_threads(1)


@pytest.mark.parametrize("fail_at", [0, 150, 199])
def test_an_error_in_one_chunk_reaches_python_once_every_chunk_is_done(fail_at):
    ops = _cpp.load_tree_ops()
    torch.set_num_threads(3)
    try:
        with pytest.raises(RuntimeError, match=f"failed at row {fail_at}"):
            ops.row_chunks_probe(200, fail_at)
        ranges, _ = ops.row_chunks_probe(200)  # the threads are usable afterwards
    finally:
        torch.set_num_threads(1)
    assert ranges == [(0, 64), (64, 128), (128, 200)]


def _openmp_runtimes_mapped() -> set[str]:
    with open("/proc/self/maps") as maps:
        paths = {line.split()[-1] for line in maps if "/" in line}
    return {os.path.realpath(p) for p in paths
            if os.path.basename(p).startswith(("libgomp", "libiomp", "libomp"))}


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="needs Linux's /proc")
def test_the_kernel_splits_on_torchs_own_openmp_team_where_torch_ships_one():
    ops = _cpp.load_tree_ops()
    gomp = _kernel_build.torch_openmp_library()
    # The build links the kernel to torch's libgomp whenever torch ships one: a build that
    # lost the flags would run on threads of its own, at half speed beside torch's workers.
    assert ops.search_threads_on_torch_team() == (gomp is not None)
    if gomp is not None:
        assert _openmp_runtimes_mapped() == {os.path.realpath(gomp)}
