"""Play a run's weights against the random and the perfect (minimax) tic-tac-toe players.

A match plays ``num_games`` games at once (one batched search per ply);
MuZero moves first in the first half of the games and second in the other
half, greedily (no root noise, the most visited action). Scores are from
MuZero's view: +1 win, 0 draw, -1 loss.

Play a run's final weights (``ckpt/last.pt``) against both opponents::

    python sota-implementations/muzero/board_eval.py outputs/2026-12-01/10-00-00 --games 100

Exit status 2 with one ``error:`` line when the checkpoint is missing, corrupt or holds pickled code.
"""
from __future__ import annotations

import argparse
import json

from torchrl_muzero.trainers.board_eval import evaluate_board, load_run_model
from torchrl_muzero.trainers.builders import algorithm, mcts_config
from torchrl_muzero.trainers.checkpoint import CheckpointError


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("run_dir")
    parser.add_argument("--checkpoint", default="last.pt", help="file in <run_dir>/ckpt (default last.pt)")
    parser.add_argument("--games", type=int, default=100, help="games per opponent")
    parser.add_argument("--simulations", type=int, default=0, help="0: the run's eval.num_simulations")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        model, cfg = load_run_model(args.run_dir, args.checkpoint)
    except CheckpointError as err:  # missing, corrupt, or holding pickled code: one line, exit 2
        parser.exit(2, f"error: {err}\n")
    sims = args.simulations or cfg.eval.num_simulations or cfg.mcts.num_simulations
    scores, stats = evaluate_board(model, mcts_config(cfg, temperature=0.0, num_simulations=sims),
                                   args.games, args.seed, search_fn=algorithm(cfg).search_fn)
    out = {"run_dir": str(args.run_dir), "checkpoint": args.checkpoint, "games_per_opponent": args.games,
           "simulations": sims, "mean_score": sum(scores) / len(scores), **stats}
    print(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
