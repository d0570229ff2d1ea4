"""UniZero's fused search on 1 and 2 torch threads, alternating in one process.

The fused search splits its trees over torch's intra-op threads
(csrc/fused_loop.h's for_row_chunks). Same model, roots and search as the
cartpole case of test_unizero_search_bench.py (KV cache, 50 simulations,
``search_root`` inside every timed search); each setting is timed as the best
of ``--tries`` searches, the thread counts alternating ``--reps`` times so a
ratio is taken under one load. Wall clock (two threads use two cores).

Run: python benchmarks/unizero_threads.py [--batches 8 64] [--reps 4] [--tries 3]
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_unizero_search_bench import SIMS, _model, _window  # noqa: E402

from torchrl_muzero.mcts import MCTSConfig  # noqa: E402
from torchrl_muzero.mcts.search import muzero_search  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--reps", type=int, default=4)
    parser.add_argument("--tries", type=int, default=3)
    args = parser.parse_args()
    model = _model(True, "cartpole")
    cfg = MCTSConfig(num_simulations=SIMS, backend="auto")
    for B in args.batches:
        obs, actions = _window(B)
        rates: dict[int, list[float]] = {1: [], 2: []}
        for _ in range(args.reps):
            for threads in (1, 2):
                torch.set_num_threads(threads)
                times = []
                for _ in range(args.tries):
                    start = time.perf_counter()
                    muzero_search(model, model.search_root(obs, actions), cfg,
                                  generator=torch.Generator().manual_seed(0))
                    times.append(time.perf_counter() - start)
                rates[threads].append(B / min(times))
        ratio = statistics.median(rates[2]) / statistics.median(rates[1])
        print(f"B={B}: searches/s on 1 thread {[round(r) for r in rates[1]]}, "
              f"on 2 {[round(r) for r in rates[2]]}; 2 / 1 threads (medians) {ratio:.2f}x")


if __name__ == "__main__":
    main()
