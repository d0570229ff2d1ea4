"""Gumbel MuZero's point: policy improvement with few simulations (Danihelka et al. 2022, figure 2's setting).

CartPole-v1, the shipped config, the sync pipeline, one fixed budget of env
steps per run; the same seed for both algorithms at every simulation count
(2, 4, 8, 16, 50). MuZero's policy target at n simulations is the visit
distribution of n visits (2 visits: a policy of halves); Gumbel MuZero's is the
completed-Q improved policy, which the paper shows still improves the policy
at 2 simulations. The score of a run is its last evaluation (greedy, 8
episodes) and its best one. Runs go one after the other (never two trainings
at once); the table is written into docs/variants.md between the markers
``<!-- gumbel-budget:begin -->`` / ``<!-- gumbel-budget:end -->``.

Run: python -m pytest benchmarks/test_gumbel_budget_bench.py --benchmark-only -s
     (about 10 runs of 2-4 minutes on 2 cores)
"""
from __future__ import annotations

import csv
import os
import re
import time
from pathlib import Path

import pytest
import torch

from torchrl_muzero.trainers import SyncTrainer
from torchrl_muzero.trainers.hydra_entry import compose_config

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = str(ROOT / "sota-implementations" / "muzero" / "config")
DOC = ROOT / "docs" / "variants.md"
SIMULATIONS = (2, 4, 8, 16, 50)
ALGOS = ("muzero", "gumbel_muzero")
BUDGET = int(os.environ.get("GUMBEL_BUDGET_ENV_STEPS", 8_000))
SEED = 0
RESULTS: dict = {}


def _run(tmp_path: Path, algo: str, sims: int) -> dict:
    run_dir = tmp_path / f"{algo}-{sims}"
    cfg = compose_config(CONFIG_DIR, [
        f"algo={algo}", f"mcts.num_simulations={sims}", f"seed={SEED}", f"run_dir={run_dir}",
        f"train.total_env_steps={BUDGET}", "train.max_wall_time_s=0", "train.stop_return=0",
        "eval.interval=250", "eval.num_episodes=8", "logger.progress_bar=false",
    ])
    start = time.monotonic()
    summary = SyncTrainer(cfg).run()
    rows = list(csv.DictReader(open(run_dir / "eval.csv")))
    returns = [float(r["mean_return"]) for r in rows]
    return dict(last=returns[-1] if returns else float("nan"), best=max(returns, default=float("nan")),
                wall_s=time.monotonic() - start, env_steps=summary["env_steps"], load=os.getloadavg()[0])


def render() -> str:
    head = "| simulations | " + " | ".join(f"{a}: last / best evaluation" for a in ALGOS) + " |"
    lines = [f"CartPole-v1, shipped config, sync pipeline, {BUDGET:,} env steps per run, seed {SEED}, greedy "
             f"evaluations of 8 episodes every 250 updates (torch {torch.__version__}, "
             f"{os.cpu_count()} cores; load at the end of each run in brackets):", "", head,
             "|---|" + "---|" * len(ALGOS)]
    for sims in SIMULATIONS:
        cells = []
        for algo in ALGOS:
            r = RESULTS.get((algo, sims))
            cells.append("" if r is None else f"{r['last']:.1f} / {r['best']:.1f} ({r['wall_s']:.0f} s, "
                                              f"load {r['load']:.1f})")
        lines.append(f"| {sims} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _write_doc() -> None:
    if not DOC.exists():
        return
    text = DOC.read_text()
    new = f"<!-- gumbel-budget:begin -->\n{render()}\n<!-- gumbel-budget:end -->"
    text, n = re.subn(r"<!-- gumbel-budget:begin -->.*?<!-- gumbel-budget:end -->", new, text, flags=re.S)
    if n:
        DOC.write_text(text)


@pytest.mark.parametrize("sims", SIMULATIONS)
@pytest.mark.parametrize("algo", ALGOS)
def test_return_after_a_fixed_budget(benchmark, tmp_path, all_cores, algo, sims):
    result = benchmark.pedantic(_run, args=(tmp_path, algo, sims), rounds=1, iterations=1)
    RESULTS[(algo, sims)] = result
    benchmark.extra_info.update(result)
    print(f"\n{algo} sims={sims}: last {result['last']:.1f} best {result['best']:.1f} "
          f"({result['wall_s']:.0f} s, load {result['load']:.1f})")
    _write_doc()
