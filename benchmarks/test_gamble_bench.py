"""Stochastic MuZero's point on a task small enough to show it on 2 cores: the two-step gamble.

At the offer an agent passes (worth ``env.safe_reward``, 0.2) or bets on a fair coin that it then
sees before its reply (worth 0 with the right reply). MuZero's deterministic dynamics give the bet
one post-bet latent, where the data pair reply 0 with the won games (+1) and reply 1 with the lost
ones (-1): its search picks the won game's reply without the coin having been won, believes the bet
is worth ~+1 and bets. Stochastic MuZero's afterstate is a chance node over learned codes, its
search averages the coin and passes (torchrl_muzero/envs/gamble.py explains the mechanism; a
unit test in test/test_gamble.py shows it on the exact blurred model).

Both algorithms run the shipped ``env=Gamble`` config with the sync pipeline, the same seeds
(``GAMBLE_SEEDS``, default 0-4) and env steps (the config's 10,000, ``GAMBLE_ENV_STEPS``); each run
ends with greedy play of 512 games (``play_gamble``): how often it bets, its mean return, and the
root value of a search restricted to betting / passing. The table goes into docs/variants.md between
``<!-- gamble:begin -->`` and ``<!-- gamble:end -->``.

Run: [GAMBLE_SEEDS=0,1,2,3,4] python -m pytest benchmarks/test_gamble_bench.py --benchmark-only -s
"""
from __future__ import annotations

import os
import re
import time
from pathlib import Path

import pytest
from torchrl.data import OneHot
from torchrl.envs.utils import ExplorationType, set_exploration_type

from torchrl_muzero.envs.gamble import play_gamble
from torchrl_muzero.trainers import SyncTrainer
from torchrl_muzero.trainers.builders import build_policy
from torchrl_muzero.trainers.hydra_entry import compose_config

ROOT = Path(__file__).resolve().parents[1]
CONFIG_DIR = str(ROOT / "sota-implementations" / "muzero" / "config")
DOC = ROOT / "docs" / "variants.md"
SEEDS = [int(s) for s in os.environ.get("GAMBLE_SEEDS", "0,1,2,3,4").split(",")]
ENV_STEPS = os.environ.get("GAMBLE_ENV_STEPS")
ALGOS = ("muzero", "stochastic_muzero")
RESULTS: dict = {}
pytestmark = pytest.mark.timeout(0)  # ten runs of ~40 s each


def train_and_play(run_dir: Path, algo: str, seed: int, *overrides: str) -> dict:
    """Train ``algo`` on ``env=Gamble`` with the sync pipeline, then play it greedily (``play_gamble``)."""
    steps = [f"train.total_env_steps={ENV_STEPS}"] if ENV_STEPS else []
    cfg = compose_config(CONFIG_DIR, ["env=Gamble", f"algo={algo}", f"seed={seed}", f"run_dir={run_dir}",
                                      "logger.progress_bar=false", *steps, *overrides])
    start = time.monotonic()
    trainer = SyncTrainer(cfg)
    summary = trainer.run()
    assert summary["status"] == "ok", summary
    model = trainer.learner.model.eval()
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        policy = build_policy(cfg, model, OneHot(2), temperature=0.0)  # the spec only picks the encoding
        result = play_gamble(policy, safe_reward=cfg.env.safe_reward, win_probability=cfg.env.win_probability)
    result.update(env_steps=summary["env_steps"], wall_s=time.monotonic() - start)
    return result


def render() -> str:
    seeds = sorted({seed for _, seed in RESULTS})
    lines = [f"Gamble (`env=Gamble`: pass = 0.2, bet = 0 with the right reply), sync pipeline, "
             f"{next(iter(RESULTS.values()))['env_steps']:,} env steps per run, seeds {', '.join(map(str, seeds))}; "
             "greedy play of 512 games after training:", "",
             "| algorithm | seed | bets | mean return | search's value of betting / passing | wall s |",
             "|---|---|---|---|---|---|"]
    for algo in ALGOS:
        runs = [(seed, RESULTS[algo, seed]) for seed in seeds if (algo, seed) in RESULTS]
        for seed, r in runs:
            lines.append(f"| {algo} | {seed} | {r['bet_fraction']:.0%} | {r['mean_return']:.3f} | "
                         f"{r['bet_value']:.2f} / {r['pass_value']:.2f} | {r['wall_s']:.0f} |")
        if len(runs) > 1:
            mean = {k: sum(r[k] for _, r in runs) / len(runs) for k in ("bet_fraction", "mean_return")}
            betting = sum(r["bet_fraction"] > 0.5 for _, r in runs)
            lines.append(f"| **{algo}, {len(runs)} seeds** | | **{betting} of {len(runs)} bet** | "
                         f"**{mean['mean_return']:.3f}** | | |")
    return "\n".join(lines)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("algo", ALGOS)
def test_bets_at_equal_env_steps(benchmark, tmp_path, all_cores, algo, seed):
    result = benchmark.pedantic(train_and_play, args=(tmp_path / f"{algo}_{seed}", algo, seed), rounds=1,
                                iterations=1)
    RESULTS[algo, seed] = result
    benchmark.extra_info.update(result)
    print(f"\n{algo} seed {seed}: {result}")
    if DOC.exists():
        text = DOC.read_text()
        new = f"<!-- gamble:begin -->\n{render()}\n<!-- gamble:end -->"
        if "<!-- gamble:begin -->" in text:
            DOC.write_text(re.sub(r"<!-- gamble:begin -->.*?<!-- gamble:end -->", new, text, flags=re.S))
