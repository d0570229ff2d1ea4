"""Stochastic MuZero's point: a stochastic task where a deterministic model must average (2048).

After every move of 2048 a new tile lands on a random empty cell: 32 chance
outcomes. MuZero's deterministic dynamics can only predict one next state per
action, so it plans through a blur of them; Stochastic MuZero plans through
afterstates and learned chance codes (Antonoglou et al. 2022, section 5.1).
Both run the shipped ``env=Game2048`` config with the sync pipeline, the same
seed and the same number of env steps (``GAME2048_ENV_STEPS``, default 20,000);
each run ends with a greedy evaluation of 8 games, reported as mean score and
max tile. The table goes into docs/variants.md between
``<!-- game2048:begin -->`` and ``<!-- game2048:end -->``.

Run: python -m pytest benchmarks/test_game2048_bench.py --benchmark-only -s
"""
from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
import torch
from torchrl.envs.utils import ExplorationType, set_exploration_type

from torchrl_muzero.trainers import SyncTrainer
from torchrl_muzero.trainers.builders import algorithm, build_policy
from torchrl_muzero.trainers.hydra_entry import compose_config

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = str(ROOT / "sota-implementations" / "muzero" / "config")
DOC = ROOT / "docs" / "variants.md"
ENV_STEPS = int(os.environ.get("GAME2048_ENV_STEPS", 20_000))
ALGOS = {"muzero": [], "stochastic_muzero": ["algo.chance_space_size=32"]}
SEED = 0
RESULTS: dict = {}


@torch.no_grad()
def _play(cfg, model, games: int = 8, max_steps: int = 2000) -> dict:
    from torchrl_muzero.envs.game2048 import make_game2048_env

    env = make_game2048_env(games, seed=12_345, max_steps=max_steps)
    policy = build_policy(cfg, model, env.action_spec, temperature=0.0)
    td = env.reset()
    score = torch.zeros(games)
    max_tile = torch.zeros(games, dtype=torch.long)
    finished = torch.zeros(games, dtype=torch.bool)
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        for _ in range(max_steps):
            td = policy(td)
            td, nxt = env.step_and_maybe_reset(td)
            live = ~finished
            score[live] += td["next", "reward"].reshape(-1)[live]
            max_tile[live] = torch.maximum(max_tile[live], td["next", "max_tile"].reshape(-1)[live])
            finished |= td["next", "done"].reshape(-1)
            if bool(finished.all()):
                break
            td = nxt
    return dict(mean_score=float(score.mean()), max_tile=int(max_tile.max()),
                median_max_tile=int(max_tile.median()))


def _run(tmp_path: Path, algo: str) -> dict:
    run_dir = tmp_path / algo
    cfg = compose_config(CONFIG_DIR, [
        "env=Game2048", f"algo={algo}", *ALGOS[algo], f"seed={SEED}", f"run_dir={run_dir}",
        f"train.total_env_steps={ENV_STEPS}", "train.max_wall_time_s=0", "eval.interval=100000",
        "logger.progress_bar=false",
    ])
    start = time.monotonic()
    trainer = SyncTrainer(cfg)
    summary = trainer.run()
    assert summary["status"] == "ok", summary
    assert algorithm(cfg).name == algo
    result = _play(cfg, trainer.learner.model.eval())
    result.update(wall_s=time.monotonic() - start, env_steps=summary["env_steps"], load=os.getloadavg()[0])
    return result


def render() -> str:
    lines = [f"2048 (`env=Game2048`), sync pipeline, {ENV_STEPS:,} env steps per run, seed {SEED}; greedy "
             "evaluation of 8 games (the same seeded spawns for both) after training:", "",
             "| algorithm | mean score | max tile (best / median) | wall s | load at the end |", "|---|---|---|---|---|"]
    for algo in ALGOS:
        r = RESULTS.get(algo)
        if r:
            lines.append(f"| {algo} | {r['mean_score']:.0f} | {r['max_tile']} / {r['median_max_tile']} | "
                         f"{r['wall_s']:.0f} | {r['load']:.1f} |")
    return "\n".join(lines)


@pytest.mark.parametrize("algo", list(ALGOS))
def test_score_at_equal_env_steps(benchmark, tmp_path, all_cores, algo):
    result = benchmark.pedantic(_run, args=(tmp_path, algo), rounds=1, iterations=1)
    RESULTS[algo] = result
    benchmark.extra_info.update(result)
    print(f"\n{algo}: {result}")
    if DOC.exists():
        text = DOC.read_text()
        new = f"<!-- game2048:begin -->\n{render()}\n<!-- game2048:end -->"
        DOC.write_text(re.sub(r"<!-- game2048:begin -->.*?<!-- game2048:end -->", new, text, flags=re.S))
