"""The Ray backend beside the local one, side by side in one run: CartPole and Pong, env steps/s and busy learner.

Each case runs ``async_pipeline.backend=local`` and ``=ray`` alternately (local, ray, local, ray, ...),
``ROUNDS`` rounds, so that a load that changes over the run weighs on both backends alike; every run
has the same replay ratio, one collector, evaluation off, torch on every core (the script's way), and
reports (benchmarks/pipeline_harness.py) wall time, env steps/s, the learner's busy fraction, and the
same two in the steady state (no start-up, no cold start). ``start_s`` is a run's start-up: from
``run()`` until its first batch reaches the buffer (local: the worker processes spawn; Ray: the actors
start); ``ray.init`` (the Ray instance, once per run of the script) is measured apart. ``await_fraction``
is the learner's wait for the lag bound (inside its busy time). Two variants: ``default`` (weights
published every update, ``max_policy_lag=0``) and ``overlap`` (published every ``frames_per_batch *
replay_ratio`` updates, what one collect pays for, with ``max_policy_lag=-1``). The report
gives Ray / local ratios per round and whether the issue's bar holds: the Ray backend no slower than
the local one by more than its start-up (``ray.init`` + ``start_s``).

* ``cartpole``: the shipped CartPole config, ``CARTPOLE_STEPS`` env steps after a 256-step cold start.
* ``pong``: real Pong (``env=Pong``) with the small ResNet of test/test_algorithms_pong.py (8 channels,
  4 simulations, learner batch 8), ``PONG_STEPS`` env steps: a few hundred, what a 2-core machine affords.

Run (figures in docs/performance_pipeline.md, "Ray backend vs local processes"):
    python -m pytest benchmarks/test_ray_vs_local_bench.py --benchmark-only --benchmark-columns=mean,rounds -s
    python benchmarks/test_ray_vs_local_bench.py [--rounds 2] [--cases cartpole,pong] [--variants default,overlap]
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="ray is not installed (pip install torchrl_muzero[ray])")

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the plain entry imports the harness too
from pipeline_harness import build_trainer, run_pipeline_benchmark  # noqa: E402

from torchrl_muzero.trainers.hydra_entry import compose_config  # noqa: E402
from torchrl_muzero.trainers.ray_backend import RaySession  # noqa: E402

CONFIG_DIR = str(Path(__file__).resolve().parents[1] / "sota-implementations" / "muzero" / "config")
ROUNDS = 2
CARTPOLE_STEPS = 768
PONG_STEPS = 384
COMMON = ["logger.progress_bar=false", "logger.backend=none", "train.stop_return=0", "train.max_wall_time_s=0",
          "eval.interval=1000000", "async_pipeline.num_evaluator_actors=0"]
CASES = {
    "cartpole": [f"train.total_env_steps={CARTPOLE_STEPS}", "train.train_start_after_envsteps=256"],
    "pong": ["env=Pong", "device=cpu", "env.num_envs=4", "env.max_episode_steps=200", "env.noop_max=4",
             "model.channels=8", "mcts.num_simulations=4", "optim.batch_size=8", "buffer.capacity=4000",
             "train.frames_per_batch=64", f"train.total_env_steps={PONG_STEPS}",
             "train.train_start_after_envsteps=128", "train.replay_ratio=0.25"],
}
# how often the weights are published: the default (every update, max_policy_lag=0), and every
# frames_per_batch * replay_ratio updates (what one collect pays for) with the lag bound off
VARIANTS = ("default", "overlap")
BACKENDS = ("local", "ray")
RUNS = [(case, variant, r, backend) for case in CASES for variant in VARIANTS for r in range(ROUNDS)
        for backend in BACKENDS]
RESULTS: dict = {}  # (case, variant, round, backend) -> figures
RAY_INIT_S: list[float] = []


def config(case: str, variant: str, backend: str, run_dir):
    """The case's config (the shipped one, composed as the script composes it) on ``backend``."""
    overrides = [f"run_dir={run_dir}", *COMMON, *CASES[case], f"async_pipeline.backend={backend}"]
    cfg = compose_config(CONFIG_DIR, overrides)
    if variant == "default":
        return cfg
    per_collect = max(1, round(cfg.train.frames_per_batch * cfg.train.replay_ratio))
    return compose_config(CONFIG_DIR, [*overrides, f"async_pipeline.weight_sync_interval={per_collect}",
                                       "async_pipeline.max_policy_lag=-1"])


def run_once(benchmark, case: str, variant: str, backend: str, run_dir) -> dict:
    """One run of ``case`` on ``backend``: the harness's figures, ``start_s`` and ``await_fraction``.

    ``await_fraction``: the share of the wall time the learner spent in ``_await_publish`` (inside its
    updates, so inside ``learner_busy_fraction`` too): waiting for the collectors to run the last
    published weights, the price of the lag bound.
    """
    trainer = build_trainer("async", config(case, variant, backend, run_dir))
    first: list[float] = []
    waited = [0.0]
    extend, await_publish = trainer.buffer.extend, trainer._await_publish

    def timed_await():
        t = time.monotonic()
        await_publish()
        waited[0] += time.monotonic() - t

    trainer._await_publish = timed_await

    def timed_extend(batch):
        if not first:
            first.append(time.monotonic())
        return extend(batch)

    trainer.buffer.extend = timed_extend
    t0 = time.monotonic()
    info = run_pipeline_benchmark(benchmark, trainer)
    info["start_s"] = round(first[0] - t0, 1) if first else None
    info["await_fraction"] = round(waited[0] / info["wall_s"], 3)
    info["load_1min"] = round(os.getloadavg()[0], 2)
    publish = getattr(trainer, "publish_s", None)  # Ray: the ray.put of each version
    if publish:
        info["publish_ms_mean"] = round(1000 * sum(publish) / len(publish), 2)
    return info


def report(runs: list | None = None) -> list[str]:
    """Per case, variant and round: Ray / local ratios, and whether the issue's bar holds.

    The bar: Ray's whole time (``ray.init`` + its run) exceeds the local run's by no more than Ray's
    start-up (``ray.init`` + the actors' ``start_s``), i.e. ``ray wall - local wall <= ray start_s``;
    ``after start-up`` is the difference of the walls with each run's own start-up taken out.
    """
    lines = []
    ray_init = sum(RAY_INIT_S) / max(len(RAY_INIT_S), 1)
    for case, variant, r, _ in (RUNS if runs is None else runs)[::2]:
        local, ray = RESULTS.get((case, variant, r, "local")), RESULTS.get((case, variant, r, "ray"))
        if not (local and ray):
            continue
        ratio = {k: round(ray[k] / local[k], 2) if local.get(k) else None
                 for k in ("wall_s", "env_steps_per_s", "learner_busy_fraction", "steady_env_steps_per_s",
                           "steady_learner_busy", "await_fraction")}
        extra = ray["wall_s"] - local["wall_s"]
        after = (ray["wall_s"] - (ray["start_s"] or 0)) - (local["wall_s"] - (local["start_s"] or 0))
        lines.append(f"{case} {variant} round {r}: ray/local {ratio}; ray wall - local wall {extra:+.1f} s, "
                     f"after start-up {after:+.1f} s; Ray's start-up {ray_init + (ray['start_s'] or 0):.1f} s "
                     f"(ray.init {ray_init:.1f} + actors {ray['start_s']}), local's {local['start_s']} s: bar "
                     f"{'holds' if extra <= (ray['start_s'] or 0) else 'DOES NOT hold'}; "
                     f"load {local['load_1min']} / {ray['load_1min']}")
    return lines


def start_ray() -> RaySession:
    """The Ray instance both entries use, its ``ray.init`` time kept in ``RAY_INIT_S``."""
    session = RaySession(num_cpus=4)
    t0 = time.monotonic()
    session.start()
    RAY_INIT_S.append(time.monotonic() - t0)
    return session


@pytest.fixture(scope="module")
def ray_session():
    """The module's Ray instance (its ``ray.init`` timed); at the end, the report (printed with ``-s``).

    The report is printed here rather than by a test: ``--benchmark-only`` skips tests without a benchmark.
    """
    session = start_ray()
    yield session
    session.stop()
    print(f"\nray.init: {RAY_INIT_S[0]:.1f} s; load average at the end {os.getloadavg()}")
    print("\n".join(report()))


@pytest.mark.parametrize("case,variant,round_,backend", RUNS, ids=["-".join(map(str, run)) for run in RUNS])
def test_backend_side_by_side(benchmark, tmp_path, case, variant, round_, backend, all_cores, ray_session):
    info = RESULTS[(case, variant, round_, backend)] = run_once(benchmark, case, variant, backend, tmp_path)
    print(f"\n{case} {variant} round {round_} {backend}: {info}")


class _Bench:
    """pytest-benchmark's ``pedantic`` and ``extra_info``, for the plain entry."""

    def __init__(self) -> None:
        self.extra_info: dict = {}

    def pedantic(self, fn, rounds: int = 1, iterations: int = 1):
        for _ in range(rounds * iterations):
            fn()


def main(argv: list[str] | None = None) -> None:
    """``python benchmarks/test_ray_vs_local_bench.py``: the same alternation without pytest."""
    import argparse
    import tempfile

    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {list(CASES)}")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {list(VARIANTS)}")
    args = parser.parse_args(argv)
    cases, variants = args.cases.split(","), args.variants.split(",")
    for flag, given, allowed in (("--cases", cases, CASES), ("--variants", variants, VARIANTS)):
        if set(given) - set(allowed):
            parser.error(f"{flag}: {sorted(set(given) - set(allowed))} unknown; allowed: {list(allowed)}")
    runs = [(c, v, r, b) for c in cases for v in variants for r in range(args.rounds) for b in BACKENDS]
    session = start_ray()
    try:
        with tempfile.TemporaryDirectory(prefix="ray_vs_local_") as tmp:
            for run in runs:
                torch.set_num_threads(os.cpu_count() or 1)  # torch on every core, as the script runs
                RESULTS[run] = run_once(_Bench(), *run[:2], run[3], Path(tmp) / "-".join(map(str, run)))
                print(f"{' '.join(map(str, run))}: {RESULTS[run]}", flush=True)
    finally:
        session.stop()
    print(f"ray.init: {RAY_INIT_S[0]:.1f} s, load average at the end {os.getloadavg()}")
    print("\n".join(report(runs)))


if __name__ == "__main__":
    main()
