"""Search speed on the canonical case of the MuZero core issue.

50 simulations, 6 actions, a tiny MLP (latent 64, hidden 64, 601-bin value
and reward heads), one torch thread, B roots at once. ``test_search`` times a
whole search; ``test_network_only`` times the same model calls without any
tree (the floor). searches/s = B / mean time; the share of search time spent
in the network is network / search.

Backends: ``torch`` (tree in tensor ops), ``cpp-loop`` (C++ tree kernel, the
model called from Python once per simulation) and ``cpp`` (what
``backend="cpp"`` does for this model: the fused C++ search, network
included); ``cpp-fma`` is ``cpp`` with ``kernel_precision="fma"`` (the opt-in
FMA network path, where the CPU has AVX2 + FMA). The fused search's network
share is ``test_network_only_fused`` (the same 50 network steps in the
kernel's own loops, plus the root's initial inference, without a tree) over
``test_search[cpp-B]``; its ``exact`` / ``fma`` cases compare the two
network paths. For an FMA / exact ratio on a loaded machine run the cases
of one B together (``-k "cpp-64 or cpp-fma-64"``: pytest-benchmark runs them
back to back, so both see the same load).

Run: python -m pytest benchmarks/test_search_bench.py --benchmark-only
     --benchmark-columns=mean,median,rounds
"""
import pytest
import torch

from torchrl_muzero.mcts import MCTSConfig, search
from torchrl_muzero.mcts import _cpp
from torchrl_muzero.modules import MuZeroMLPModel

SIMS, ACTIONS = 50, 6
BATCHES = [1, 8, 64, 256]
_OPS = _cpp.load_tree_ops()
FUSED = _OPS is not None and hasattr(_OPS, "mlp_search")
FMA = FUSED and _cpp.fma_available(_OPS)
BACKENDS = ["torch"] + (["cpp-loop", "cpp"] if _OPS is not None else []) + (["cpp-fma"] if FMA else [])
PRECISIONS = ["exact"] + (["fma"] if FMA else [])


def _model():
    torch.manual_seed(0)
    return MuZeroMLPModel((8,), ACTIONS, latent_dim=64, hidden_dim=64, value_support_size=300,
                          reward_support_size=300, zero_init_heads=False).eval()


def _rounds(B):
    return {1: 60, 8: 40, 64: 15, 256: 8}[B]


@pytest.mark.parametrize("B", BATCHES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_search(benchmark, B, backend):
    model = _model()
    if backend == "cpp-loop":  # no fused search: the kernel's select/backup around Python model calls
        model.fused_search_weights = lambda: None
    obs = torch.randn(B, 8)
    precision = "fma" if backend == "cpp-fma" else "exact"
    cfg = MCTSConfig(num_simulations=SIMS, backend=backend.split("-")[0], kernel_precision=precision)  # noise on
    gen = torch.Generator().manual_seed(0)
    search(model, obs, cfg, generator=gen)  # warm-up
    out = benchmark.pedantic(lambda: search(model, obs, cfg, generator=gen), rounds=_rounds(B), iterations=1)
    assert out.visit_counts.sum(-1).eq(SIMS).all()
    benchmark.extra_info["searches_per_s"] = B / benchmark.stats.stats.mean


@pytest.mark.parametrize("B", BATCHES)
def test_network_only(benchmark, B):
    model = _model()
    obs = torch.randn(B, 8)
    actions = torch.randint(ACTIONS, (SIMS, B))

    @torch.no_grad()
    def calls():
        latent, logits, value_logits = model.initial_inference(obs)
        model.value_support.decode(value_logits)
        for s in range(SIMS):
            latent, reward, logits, value = model.recurrent_inference_scalar(latent, actions[s])
            torch.softmax(logits, -1)

    calls()
    benchmark.pedantic(calls, rounds=_rounds(B), iterations=1)
    benchmark.extra_info["searches_per_s"] = B / benchmark.stats.stats.mean


@pytest.mark.skipif(not FUSED, reason="fused MLP search not built")
@pytest.mark.parametrize("precision", PRECISIONS)  # the two paths of one B run back to back
@pytest.mark.parametrize("B", BATCHES)
def test_network_only_fused(benchmark, B, precision):
    """The fused search's network work without its tree: root inference, then 50 kernel steps."""
    model = _model()
    obs = torch.randn(B, 8)
    actions = torch.randint(ACTIONS, (SIMS, B))
    fma = {"fma": True} if precision == "fma" else {}

    @torch.no_grad()
    def calls():
        latent, logits, value_logits = model.initial_inference(obs)
        model.value_support.decode_fast(value_logits)
        torch.softmax(logits, -1)
        tensors, reward_eps, value_eps = model.fused_search_weights()
        _OPS.mlp_unroll(tensors, ACTIONS, reward_eps, value_eps, latent, actions, **fma)

    calls()
    benchmark.pedantic(calls, rounds=_rounds(B), iterations=1)
    benchmark.extra_info["searches_per_s"] = B / benchmark.stats.stats.mean


def _step_flops(model) -> int:
    """Floating-point operations of one search step's network (2 per multiply-add of every linear layer)."""
    macs = sum(m.in_features * m.out_features for name, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and not name.startswith("representation"))
    return 2 * macs


@pytest.mark.parametrize("B", [64, 256])
def test_network_roofline(benchmark, B):
    """The ceiling of the network step on this CPU: its linear layers as torch (MKL / oneDNN) GEMMs, one thread.

    The same layers ``[B, in] @ [in, out]`` the fused kernel runs per simulation (bias and activations left
    out), timed as plain matrix products. ``gflops`` = the step's flops (``_step_flops``) / mean time; compare
    with the fused kernel's own rate, ``_step_flops * B * SIMS / mean(test_network_only_fused[B])``: the gap is
    all a better dense kernel could win, and it bounds any search's searches/s from above (docs/performance_search.md).
    """
    model = _model()
    torch.set_num_threads(1)
    shapes = [(m.in_features, m.out_features) for name, m in model.named_modules()
              if isinstance(m, torch.nn.Linear) and not name.startswith("representation")]
    xs = [(torch.randn(B, i), torch.randn(i, o)) for i, o in shapes]

    def calls():
        for _ in range(SIMS):
            for x, w in xs:
                torch.mm(x, w)

    calls()
    benchmark.pedantic(calls, rounds=_rounds(B), iterations=1)
    flops = _step_flops(model)
    benchmark.extra_info["step_flops"] = flops
    benchmark.extra_info["gflops"] = flops * B * SIMS / benchmark.stats.stats.mean / 1e9
