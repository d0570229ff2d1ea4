"""Stochastic MuZero's point: a stochastic task where a deterministic model must average (2048).

After every move of 2048 a new tile lands on a random empty cell: 32 chance
outcomes. MuZero's deterministic dynamics can only predict one next state per
action, so it plans through a blur of them; Stochastic MuZero plans through
afterstates and learned chance codes (Antonoglou et al. 2022, section 5.1).
Both run the shipped ``env=Game2048`` config with the sync pipeline, the same
seeds (``GAME2048_SEEDS``, comma-separated, default 0) and the same number of
env steps (``GAME2048_ENV_STEPS``, default 20,000); each run ends with a greedy
evaluation of 8 games, reported as mean score and max tile, per seed and over
the seeds. The table goes into docs/variants.md between
``<!-- game2048:begin -->`` and ``<!-- game2048:end -->``.

Run: [GAME2048_SEEDS=0,1,2] [GAME2048_OVERRIDES="train.replay_ratio=0.5"] python -m pytest benchmarks/test_game2048_bench.py --benchmark-only -s
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
SEEDS = [int(s) for s in os.environ.get("GAME2048_SEEDS", "0").split(",")]
OVERRIDES = os.environ.get("GAME2048_OVERRIDES", "").split()  # e.g. "train.replay_ratio=0.5", for every run
RESULTS: dict = {}
# One run is 3-10 minutes at 20,000 env steps on 2 cores (more under load or with a longer budget):
# pytest.ini's 600 s per test would kill it.
pytestmark = pytest.mark.timeout(0)


@torch.no_grad()
def _play(make_player, games: int = 8, max_steps: int = 2000) -> dict:
    """``make_player(env)`` -> ``act(td) -> td`` (writes ``"action"``), played on the evaluation games: mean
    score, best and median max tile."""
    from torchrl_muzero.envs.game2048 import make_game2048_env

    env = make_game2048_env(games, seed=12_345, max_steps=max_steps)
    act = make_player(env)
    td = env.reset()
    score = torch.zeros(games)
    max_tile = torch.zeros(games, dtype=torch.long)
    finished = torch.zeros(games, dtype=torch.bool)
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        for _ in range(max_steps):
            td = act(td)
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


def _random_player(env, seed: int = 0):
    """A uniformly random legal move: the score a policy must beat to have learned anything."""
    g = torch.Generator().manual_seed(seed)

    def act(td):
        move = torch.multinomial(td["action_mask"].float(), 1, generator=g).squeeze(-1)
        td["action"] = torch.nn.functional.one_hot(move, td["action_mask"].shape[-1])
        return td

    return act


def _run(tmp_path: Path, algo: str, seed: int) -> dict:
    run_dir = tmp_path / f"{algo}_{seed}"
    cfg = compose_config(CONFIG_DIR, [
        "env=Game2048", f"algo={algo}", *ALGOS[algo], *OVERRIDES, f"seed={seed}", f"run_dir={run_dir}",
        f"train.total_env_steps={ENV_STEPS}", "train.max_wall_time_s=0", "eval.interval=100000",
        "logger.progress_bar=false",
    ])
    start = time.monotonic()
    trainer = SyncTrainer(cfg)
    summary = trainer.run()
    assert summary["status"] == "ok", summary
    assert algorithm(cfg).name == algo
    model = trainer.learner.model.eval()
    result = _play(lambda env: build_policy(cfg, model, env.action_spec, temperature=0.0))
    result.update(wall_s=time.monotonic() - start, env_steps=summary["env_steps"], load=os.getloadavg()[0])
    return result


def render() -> str:
    seeds = sorted({seed for algo, seed in RESULTS if algo in ALGOS})
    extra = f" with `{' '.join(OVERRIDES)}`" if OVERRIDES else ""
    lines = [f"2048 (`env=Game2048`{extra}), sync pipeline, {ENV_STEPS:,} env steps per run, seed"
             f"{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))}; greedy evaluation of 8 games after "
             "training (the same seeded spawns for every run):", "",
             "| algorithm | seed | mean score | max tile (best / median) | wall s | load at the end |",
             "|---|---|---|---|---|---|"]
    random = RESULTS.get(("random", None))
    if random:
        lines.append(f"| random legal moves (no training) | | {random['mean_score']:.0f} | "
                     f"{random['max_tile']} / {random['median_max_tile']} | | |")
    for algo in ALGOS:
        runs = [(seed, RESULTS[algo, seed]) for seed in seeds if (algo, seed) in RESULTS]
        for seed, r in runs:
            lines.append(f"| {algo} | {seed} | {r['mean_score']:.0f} | {r['max_tile']} / {r['median_max_tile']} | "
                         f"{r['wall_s']:.0f} | {r['load']:.1f} |")
        if len(runs) > 1:
            mean = sum(r["mean_score"] for _, r in runs) / len(runs)
            tiles = sorted(r["median_max_tile"] for _, r in runs)
            lines.append(f"| **{algo}, mean of {len(runs)} seeds** | | **{mean:.0f}** | "
                         f"{max(r['max_tile'] for _, r in runs)} / {tiles[len(tiles) // 2]} | | |")
    return "\n".join(lines)


def test_random_play_baseline(benchmark):
    RESULTS["random", None] = benchmark.pedantic(_play, args=(_random_player,), rounds=1, iterations=1)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("algo", list(ALGOS))
def test_score_at_equal_env_steps(benchmark, tmp_path, all_cores, algo, seed):
    result = benchmark.pedantic(_run, args=(tmp_path, algo, seed), rounds=1, iterations=1)
    RESULTS[algo, seed] = result
    benchmark.extra_info.update(result)
    print(f"\n{algo} seed {seed}: {result}")
    if DOC.exists():
        text = DOC.read_text()
        new = f"<!-- game2048:begin -->\n{render()}\n<!-- game2048:end -->"
        DOC.write_text(re.sub(r"<!-- game2048:begin -->.*?<!-- game2048:end -->", new, text, flags=re.S))
