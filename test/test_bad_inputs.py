"""Bad input through the real script: one ``error:`` line naming the key, exit status 2, no traceback.

Every case runs ``sota-implementations/muzero/muzero_async.py`` in a subprocess
(two at a time), from an empty working folder, and must be rejected before a
run starts: within 20 s, nothing written into an existing run folder, and for
the checks made before hydra starts, not even hydra's ``outputs/`` folder.
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import torch

from pipeline_utils import tiny_config
from torchrl_muzero.trainers import SyncTrainer, load_config
from torchrl_muzero.trainers.config_ranges import RANGES, _numeric_leaves
from torchrl_muzero.trainers.hydra_entry import preflight

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "sota-implementations" / "muzero" / "muzero_async.py"
CONFIG_DIR = SCRIPT.parent / "config"


def _folder_digest(folder: Path) -> dict:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def targets(tmp_path_factory):
    """Folders and files the resume / run_dir cases point at, made once."""
    root = tmp_path_factory.mktemp("targets")
    run = root / "run"  # a real (small) run folder: config.json, eval.csv, ckpt/last.pt
    trainer = SyncTrainer(tiny_config(run, **{"model.hidden_dim": 16}))
    trainer.save()
    trainer.metrics.close()
    (root / "no_ckpt").mkdir()
    for name, data in {"corrupt": b"not a checkpoint at all",
                       "truncated": (run / "ckpt" / "last.pt").read_bytes()[:300]}.items():
        (root / name / "ckpt").mkdir(parents=True)
        (root / name / "ckpt" / "last.pt").write_bytes(data)
    (root / "a_file.txt").write_text("not a folder")
    fake_ale = root / "no_ale"  # an ale_py that fails to import (a broken or removed install)
    (fake_ale / "ale_py").mkdir(parents=True)
    (fake_ale / "ale_py" / "__init__.py").write_text("raise ImportError('No module named ale_py')\n")
    return root


TINY = ["env.num_envs=4", "train.frames_per_batch=64", "logger.progress_bar=false"]

# (case id, overrides, text the error line must hold, extra environment, folder that must stay untouched)
CASES = [
    ("negative-replay-ratio", ["train.replay_ratio=-1"], "'train.replay_ratio' must be >= 0", None, None),
    ("lag-below-minus-one", ["async_pipeline.max_policy_lag=-2"], "'async_pipeline.max_policy_lag'", None, None),
    ("batch-size-zero", ["optim.batch_size=0"], "'optim.batch_size' must be >= 1", None, None),
    ("no-collectors", ["async_pipeline.num_collector_actors=0"], "'async_pipeline.num_collector_actors'", None, None),
    ("zero-simulations", ["mcts.num_simulations=0"], "'mcts.num_simulations'", None, None),
    ("discount-above-one", ["mcts.discount=1.5"], "'mcts.discount' must be in (0, 1]", None, None),
    ("probability-above-one", ["mcts.dirichlet_fraction=2"], "'mcts.dirichlet_fraction' must be in [0, 1]",
     None, None),
    ("reanalyze-negative", ["buffer.reanalyze_ratio=-0.1"], "'buffer.reanalyze_ratio'", None, None),
    ("no-envs", ["env.num_envs=0"], "'env.num_envs'", None, None),
    ("frames-not-a-multiple", ["train.frames_per_batch=66"], "'train.frames_per_batch' must be a multiple",
     None, None),
    ("eval-interval-zero", ["eval.interval=0"], "'eval.interval'", None, None),
    ("sync-interval-zero", ["async_pipeline.weight_sync_interval=0"], "'async_pipeline.weight_sync_interval'",
     None, None),
    ("inflight-not-per-worker", ["async_pipeline.max_collect_inflight=3"], "'async_pipeline.max_collect_inflight'",
     None, None),
    ("negative-niceness", ["async_pipeline.actor_niceness=-1"], "'async_pipeline.actor_niceness'", None, None),
    ("temperature-schedule", ["train.temperature_schedule=[[2,1]]"], "'train.temperature_schedule'", None, None),
    ("negative-seed", ["seed=-1"], "'seed'", None, None),
    ("unknown-key", ["train.replay_ratoi=1"], "Did you mean 'train.replay_ratio'", None, None),
    ("lightzero-kv-cache-key", ["algo=unizero", "algo.kv_cache_clear_interval=2000"],
     "'algo.kv_cache_clear_interval' is not used by torchrl_muzero: UniZero keeps no KV cache", None, None),
    ("unknown-env-option", ["env=Pongg"], "config group 'env' has no option 'Pongg'", None, None),
    ("wrong-type", ["train.replay_ratio=abc"], "'train.replay_ratio'", None, None),
    ("unparsable", ["seed=[1"], "'seed=[1'", None, None),
    ("device-tpu", ["device=tpu"], "'device' must be auto, cpu, cuda", None, None),
    ("unknown-env-id", ["env.id=CartPole-v9"], "'env.id': unknown env id 'CartPole-v9'", None, None),
    ("atari-kind-for-cartpole", ["env.kind=atari"], "'env.id': env.kind='atari' needs an ALE env id", None, None),
    ("sampled-k-zero", ["algo=sampled_muzero", "algo.num_samples=0"], "'algo.num_samples' must be >= 1", None, None),
    ("sampled-k-above-a", ["algo=sampled_muzero", "algo.num_samples=5", "run_dir={root}/fresh/run"],
     "'algo.num_samples' is 5, more than the env's 2 discrete actions", None, None),
    ("discrete-only-on-pendulum", ["env=Pendulum", "algo=muzero", "run_dir={root}/fresh/run"],
     "supports discrete actions only, but env.id='Pendulum-v1' has continuous actions", None, None),
    ("sampled-prior-typo", ["algo=sampled_muzero", "algo.sampled_prior=unifrom"],
     "Did you mean 'uniform'", None, None),
    ("resnet-for-vectors", ["model.kind=resnet", "run_dir={root}/fresh/run"],
     "'model.kind' is 'resnet', which does not fit", None, None),
    ("atari-without-ale", ["env=Pong"], "pip install 'ale-py>=0.10'", "no_ale", None),
    ("resume-a-file", ["resume={root}/a_file.txt"], "'resume'", None, None),
    ("resume-missing", ["resume={root}/missing"], "'resume': the run folder", None, None),
    ("resume-no-checkpoint", ["resume={root}/no_ckpt"], "no_ckpt/ckpt/last.pt", None, "no_ckpt"),
    ("resume-corrupt", ["resume={root}/corrupt"], "corrupt/ckpt/last.pt' is corrupt", None, "corrupt"),
    ("resume-truncated", ["resume={root}/truncated"], "truncated/ckpt/last.pt' is corrupt", None, "truncated"),
    # resume keeps the saved model (hidden_dim=16): changing its size on resume is what is refused
    ("resume-other-model", ["resume={root}/run", "model.hidden_dim=64"], "model.hidden_dim=16 (this run: 64)", None,
     "run"),
    ("run-dir-holds-a-run", ["run_dir={root}/run"], "'run_dir'", None, "run"),
    ("run-dir-a-file", ["run_dir={root}/a_file.txt"], "'run_dir'", None, None),
    ("run-dir-unwritable", ["run_dir=/proc/torchrl_muzero_run"], "'run_dir': the run folder", None, None),
]
if not torch.cuda.is_available():
    CASES += [
        ("cuda-missing", ["device=cuda"], "CUDA is not available", None, None),
        ("gpu-actors-missing", ["async_pipeline.collector_num_gpus=1"], "'async_pipeline.collector_num_gpus'",
         None, None),
    ]


def _run_case(case, root: Path, workdir: Path):
    name, overrides, _, extra_env, _ = case
    env = {k: v for k, v in os.environ.items() if k != "HYDRA_FULL_ERROR"}
    if extra_env:
        env["PYTHONPATH"] = f"{root / extra_env}{os.pathsep}{env.get('PYTHONPATH', '')}"
    args = [o.format(root=root) for o in overrides]
    t0 = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, str(SCRIPT), *TINY, *args], cwd=workdir, env=env,
                              capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired as err:  # the run started: report it as this case's failure
        proc = subprocess.CompletedProcess(err.cmd, None, str(err.stdout), str(err.stderr))
    return proc, time.monotonic() - t0


@pytest.fixture(scope="module")
def outcomes(targets, tmp_path_factory, machine_alone):
    """Every case run once, two at a time (the machine has two cores); with the run folders' digests.

    The cases run with the other test worker idle (``machine_alone``, conftest.py): each must be
    rejected within 20 s, as on a machine running nothing else.
    """
    before = {case[0]: _folder_digest(targets / case[4]) for case in CASES if case[4]}
    workdirs = {case[0]: tmp_path_factory.mktemp(case[0]) for case in CASES}
    with machine_alone(), ThreadPoolExecutor(2) as pool:
        results = dict(zip([c[0] for c in CASES],
                           pool.map(lambda c: _run_case(c, targets, workdirs[c[0]]), CASES)))
    after = {case[0]: _folder_digest(targets / case[4]) for case in CASES if case[4]}
    return results, workdirs, before, after


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_input_fails_in_one_line(case, outcomes, targets):
    name, _, expected, _, folder = case
    results, workdirs, before, after = outcomes
    proc, seconds = results[name]
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert seconds < 20, f"rejected after {seconds:.1f} s"
    assert "Traceback" not in output and "HYDRA_FULL_ERROR" not in output, output
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), output
    assert expected in lines[0], lines[0]
    if folder:
        assert after[name] == before[name], "a rejected start changed an existing run folder"
    probed = ("resnet-for-vectors", "sampled-k-above-a", "discrete-only-on-pendulum")
    if name in probed:  # rejected once the env was probed: the run folder is not left behind
        assert not (targets / "fresh").exists()
    if name not in ("resume-other-model", *probed):  # checked before hydra starts: no output folder
        assert not (workdirs[name] / "outputs").exists()


def test_hydra_full_error_keeps_the_traceback(tmp_path):
    env = {**os.environ, "HYDRA_FULL_ERROR": "1"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "optim.batch_size=0"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "Traceback" in proc.stderr and "optim.batch_size" in proc.stderr


def test_good_command_lines_pass_preflight():
    preflight(CONFIG_DIR, [])
    preflight(CONFIG_DIR, ["env=Pong", "train.replay_ratio=0.5", "async_pipeline.max_policy_lag=-1",
                           "optim.max_grad_norm=0", "train.checkpoint_interval=0", "+hydra.job.name=x"])


def test_every_numeric_key_has_a_range():
    keys = {key for key, _ in _numeric_leaves(load_config())}
    assert keys == set(RANGES), (keys - set(RANGES), set(RANGES) - keys)


def test_the_shipped_configs_are_in_range():
    from torchrl_muzero.trainers.hydra_entry import compose_config

    for env in sorted(p.stem for p in (CONFIG_DIR / "env").glob("*.yaml")):
        compose_config(CONFIG_DIR, [f"env={env}"])
    load_config()
