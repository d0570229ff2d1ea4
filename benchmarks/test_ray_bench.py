"""The Ray backend beside the local one, in one run: CartPole throughput and the 8M-parameter publish.

``test_pipeline_ray_vs_local``: the shipped CartPole config (as benchmarks/test_pipeline_bench.py,
``STEPS`` env steps after a 256-step cold start, evaluation off, torch on every core), ``async_pipeline.backend=local`` and
``=ray`` at the same replay ratio, with the weights published every update (the default) and every
10 updates (``max_policy_lag=-1``); env steps/s and the learner's busy fraction (benchmarks/pipeline_harness.py).

``test_publish_8m``: an ~8.4M-parameter MLP (benchmarks/test_weight_sync_bench.py's) published to 2
idle collectors, from the learner's weights until both run them: the local backend's guarded
multi-process publish, and the Ray backend's path (one ``ray.put`` of a snapshot, both actors load
that one ref and copy it into their own parameters).

Run: python -m pytest benchmarks/test_ray_bench.py --benchmark-only --benchmark-columns=mean,median,rounds -s
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("ray", reason="ray is not installed (pip install torchrl_muzero[ray])")

from pipeline_harness import build_trainer, run_pipeline_benchmark  # noqa: E402
from test_weight_sync_bench import ROUNDS, BigMLPPolicy, make_locked_policy, test_publish_guarded, trainer_policy  # noqa: E402,F401,E501

from torchrl_muzero.trainers.hydra_entry import compose_config  # noqa: E402
from torchrl_muzero.trainers.ray_backend import RaySession, WeightPacker, unpack_weights  # noqa: E402

CONFIG_DIR = str(Path(__file__).resolve().parents[1] / "sota-implementations" / "muzero" / "config")
STEPS = 1024


@pytest.fixture(scope="module")
def ray_session():
    import os

    # the actor class below lives in this folder: Ray's workers import it from PYTHONPATH
    here = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join([here, *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))])
    session = RaySession(num_cpus=4)
    ray = session.start()
    yield ray
    session.stop()


def _config(run_dir, extra):
    return compose_config(CONFIG_DIR, [
        f"run_dir={run_dir}", "logger.progress_bar=false", "logger.backend=none",
        f"train.total_env_steps={STEPS}", "train.train_start_after_envsteps=256", "train.stop_return=0",
        "train.max_wall_time_s=0", "eval.interval=1000000", "async_pipeline.num_evaluator_actors=0", *extra])


@pytest.mark.parametrize("interval", [1, 10], ids=["weights-every-update", "weights-every-10"])
@pytest.mark.parametrize("backend", ["local", "ray"])
def test_pipeline_ray_vs_local(benchmark, tmp_path, backend, interval, all_cores, ray_session):
    # every 10 updates: max_policy_lag=-1, or the default bound (0) would still publish every update
    lag = [] if interval == 1 else ["async_pipeline.max_policy_lag=-1"]
    cfg = _config(tmp_path, [f"async_pipeline.backend={backend}", f"async_pipeline.weight_sync_interval={interval}",
                             *lag])
    info = run_pipeline_benchmark(benchmark, build_trainer("async", cfg))
    print(f"\n{backend} interval={interval}: {info}")


class _Holder:
    """A Ray actor holding one 8M-parameter locked policy (what a collector actor loads weights into)."""

    def __init__(self):
        self.policy = make_locked_policy()

    def load(self, weights, version: int) -> int:
        self.policy.load_published_weights(unpack_weights(weights), version)
        return version


def test_publish_8m_ray_object_store(benchmark, ray_session):
    ray = ray_session
    holders = [ray.remote(num_cpus=1)(_Holder).remote() for _ in range(2)]
    torch.manual_seed(0)
    model = BigMLPPolicy().net
    state = {"v": 0}
    packer = WeightPacker(model)

    def publish():
        with torch.no_grad():
            model[0].weight.add_(1e-3)  # each round changes a weight first
        state["v"] += 1
        ref = ray.put(packer.pack(model))  # one object per version, shared by both actors
        ray.get([h.load.remote(ref, state["v"]) for h in holders])

    publish()  # the actors exist and have mapped the store once
    benchmark.pedantic(publish, rounds=ROUNDS, iterations=1)
    for h in holders:
        ray.kill(h)


def test_publish_8m_local_guarded(benchmark, ray_session, trainer_policy):
    """The local backend's publish, in the same run (test_weight_sync_bench's case, reused)."""
    test_publish_guarded(benchmark, trainer_policy)
