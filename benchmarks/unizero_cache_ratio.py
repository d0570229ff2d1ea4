"""UniZero search: KV cache vs full recompute, fused C++ step vs torch step, interleaved in one run.

The rows of test_unizero_search_bench.py measured one after the other drift
with the load of a shared machine; here every round runs the four engines
back to back (the order rotated each round) and the medians are compared, so
a ratio is taken under one load. Same models, roots and search as the
pytest benchmark (50 simulations, one torch thread, ``search_root`` inside
every timed search). The clock is the process's CPU time by default (one
thread, so that is the search's own time; on a shared 2-core machine the wall
clock mostly measures the other processes), ``--wall`` for the wall clock.

Each engine is timed on blocks of consecutive searches (``BLOCK``, as an actor
searches), the blocks of the engines alternating.

Run: python benchmarks/unizero_cache_ratio.py [--sizes cartpole long] [--batches 1 8 64] [--wall] [--block N]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_unizero_search_bench import SIMS, SIZES, _model, _TorchStep, _window  # noqa: E402

from torchrl_muzero.mcts import MCTSConfig  # noqa: E402
from torchrl_muzero.mcts.search import muzero_search  # noqa: E402

ENGINES = ("fused cache", "fused recompute", "torch-step cache", "torch-step recompute")
ROUNDS = {1: 12, 8: 5, 64: 2}
# Searches per timed block: an actor searches back to back with one model, so each engine is timed
# on consecutive searches (its weights and tree buffers warm in the caches), the engines still
# alternating block by block under one load. One search per block (--block 1) times each search
# right after another engine's, with its ~0.5 MB of weights evicted from L2: a cold start that
# costs the faster engine the larger share (docs/performance_search.md, "UniZero search").
BLOCK = {1: 20, 8: 4, 64: 1}


def _runner(engine: str, size: str, B: int):
    kv_cache = engine.endswith("cache")
    model = _model(kv_cache, size)
    searched = model if engine.startswith("fused") else _TorchStep(model)
    obs, actions = _window(B, size)
    cfg = MCTSConfig(num_simulations=SIMS, backend="auto")

    def run():
        out = muzero_search(searched, model.search_root(obs, actions), cfg, generator=torch.Generator().manual_seed(0))
        assert out.visit_counts.sum(-1).eq(SIMS).all()

    return run


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES))
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 8, 64])
    parser.add_argument("--skip", nargs="*", default=[], help="engines to leave out, e.g. 'torch-step recompute'")
    parser.add_argument("--wall", action="store_true", help="wall clock instead of the process's CPU time")
    parser.add_argument("--block", type=int, default=0,
                        help="searches per timed block (0: 20 / 4 / 1 at B = 1 / 8 / 64)")
    args = parser.parse_args(argv)
    clock = time.perf_counter if args.wall else time.process_time
    torch.set_num_threads(1)
    print(f"clock: {'wall' if args.wall else 'process CPU time'}; block: {args.block or 'default'}; "
          f"load before: {os.getloadavg()[0]:.2f}")
    print("| size | B | " + " | ".join(f"{e} (searches/s)" for e in ENGINES)
          + " | fused cache / fused recompute | fused cache / torch-step cache |")
    print("|---|---|" + "---|" * (len(ENGINES) + 2))
    for size in args.sizes:
        for B in args.batches:
            engines = [e for e in ENGINES if e not in args.skip]
            runs = {e: _runner(e, size, B) for e in engines}
            for run in runs.values():
                run()  # warm-up (and the kernel's weight packing)
            times = {e: [] for e in engines}
            block = args.block or BLOCK.get(B, 1)
            # as many timed searches per engine whatever the block, so a smaller block gets more
            # rounds (--block 1 at B = 1: 240 single searches per engine, not 12)
            rounds = max(ROUNDS.get(B, 2), ROUNDS.get(B, 2) * BLOCK.get(B, 1) // block)
            for r in range(rounds):
                for e in engines[r % len(engines):] + engines[: r % len(engines)]:
                    t0 = clock()
                    for _ in range(block):
                        runs[e]()
                    times[e].append((clock() - t0) / block)
            med = {e: statistics.median(t) for e, t in times.items()}
            cells = [f"{B / med[e]:,.1f}" if e in med else "" for e in ENGINES]
            ratio = med["fused recompute"] / med["fused cache"] if "fused recompute" in med else float("nan")
            vs_torch = med["torch-step cache"] / med["fused cache"] if "torch-step cache" in med else float("nan")
            print(f"| {size} | {B} | " + " | ".join(cells) + f" | **{ratio:.1f}x** | {vs_torch:.1f}x |", flush=True)
    print(f"load after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
