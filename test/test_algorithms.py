"""``algo=``: the registry, and every algorithm through both scripts and the async pipeline's faults.

Per algorithm (parametrized over the registry, so a new one is covered when it
registers): its pieces build from the config and a learner update runs; the
sync script trains to the end; the async script stops on Ctrl-C with a final
checkpoint; a resumed async run continues the counters and then stops on a
NaN loss keeping the last good checkpoint; a killed collector stops the run.
"""
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict

from pipeline_utils import kill_when_training, live_descendants, stop_script_after_checkpoint, tiny_config
from torchrl_muzero.algorithms import algorithm_names, get_algorithm
from torchrl_muzero.trainers import AsyncTrainer, ConfigError, load_config
from torchrl_muzero.trainers.builders import build_buffer, build_loss, build_model, build_policy
from torchrl_muzero.trainers.checkpoint import load_checkpoint
from torchrl_muzero.trainers.hydra_entry import compose_config

REPO = Path(__file__).resolve().parents[1]
CONFIG_DIR = REPO / "sota-implementations" / "muzero" / "config"
ALGOS = algorithm_names()
VARIANTS = [a for a in ALGOS if a != "muzero"]  # muzero's faults: test_trainers.py
SAMPLED = {name for name in ALGOS if get_algorithm(name).takes_action_space}  # the sampled family


def _keys(name: str) -> dict:
    """``algo.name`` and what the algorithm needs on the tiny CartPole runs: a sampled one draws K = 2 of its
    2 actions (its continuous path runs on Pendulum in the scripts' test)."""
    return {"algo.name": name, **({"algo.num_samples": 2} if name in SAMPLED else {})}


def _wait_no_descendants(timeout=15.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not live_descendants():
            return []
        time.sleep(0.2)
    return live_descendants()


def test_the_hydra_group_and_the_registry_list_the_same_algorithms():
    options = sorted(p.stem for p in (CONFIG_DIR / "algo").glob("*.yaml"))
    assert options == sorted(ALGOS)
    assert ALGOS[0] == "muzero"
    assert {"muzero", "efficientzero", "gumbel_muzero", "stochastic_muzero"} <= set(ALGOS)
    for name in ALGOS:
        assert compose_config(CONFIG_DIR, [f"algo={name}"]).algo.name == name


def test_unknown_algorithm_and_foreign_keys_fail_at_start():
    with pytest.raises(ConfigError, match=r"'algo.name' is 'gumbel'\. Did you mean 'gumbel_muzero'\? Known "
                                          r"algorithms: muzero, efficientzero, gumbel_muzero, stochastic_muzero"):
        load_config({"algo": {"name": "gumbel"}})
    with pytest.raises(ConfigError, match=r"'algo.gumbel_scale' \(2.0\) is a setting of gumbel_muzero / "
                                          r"sampled_muzero / sampled_efficientzero / sampled_unizero, not of algo=efficientzero"):
        load_config({"algo": {"name": "efficientzero", "gumbel_scale": 2.0}})
    load_config({"algo": {"name": "gumbel_muzero", "gumbel_scale": 2.0}})  # its own key is fine


def test_script_lists_the_known_algorithms_for_an_unknown_one(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "sota-implementations/muzero/muzero_async.py"),
                           "algo=gumbel"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "error: config group 'algo' has no option 'gumbel'. Did you mean 'algo=gumbel_muzero'? "
        f"Options: {', '.join(sorted(ALGOS))}."]


@pytest.mark.parametrize("name", ALGOS)
def test_pieces_build_from_the_config_and_one_update_runs(tmp_path, name):
    """Model, policy, buffer (targets, reanalyze through the algorithm's own search) and loss fit together."""
    cfg = load_config(tiny_config(tmp_path, **_keys(name), **{"buffer.reanalyze_ratio": 0.5}))
    algo = get_algorithm(name)
    model = build_model(cfg, (4,), 2)
    policy = build_policy(cfg, model, None, generator=torch.Generator().manual_seed(0))
    assert policy.search_fn is algo.search_fn
    buffer = build_buffer(cfg)
    T = 40
    obs = torch.randn(T + 1, 4)
    td = TensorDict({"observation": obs[:-1]}, [T])
    if policy.memory is not None:  # acting from per-env memory: the primer's zeros (T fresh envs)
        td.update(policy.memory.zeros(T))
    td = policy(td)
    done = torch.zeros(T, 1, dtype=torch.bool)
    done[-1] = True
    td.update({("collector", "traj_ids"): torch.zeros(T, dtype=torch.long), ("next", "observation"): obs[1:],
               ("next", "reward"): torch.ones(T, 1), ("next", "done"): done, ("next", "terminated"): done})
    assert torch.allclose(td["search_policy"].sum(-1), torch.ones(T))
    buffer.extend(td)
    batch = buffer.sample(8, model=model, target_model=model, policy_version=0)
    assert set(buffer.sample_keys) <= set(batch.keys(True))
    loss = build_loss(cfg, model)
    out = loss(batch)
    total = sum(v for k, v in out.items() if k.startswith("loss_"))
    total.backward()
    assert torch.isfinite(total)
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and any(bool(g.abs().sum() > 0) for g in grads)


TINY_ARGS = ["env.num_envs=4", "model.latent_dim=16", "model.hidden_dim=16", "mcts.num_simulations=4",
             "optim.batch_size=32", "train.train_start_after_envsteps=128", "train.frames_per_batch=64",
             "logger.progress_bar=false", "eval.num_episodes=2", "train.checkpoint_interval=10"]


def _script(name: str, algo: str, run_dir: Path, *args: str) -> list[str]:
    # the sampled family's point is continuous actions: its scripts run Pendulum (200-step episodes)
    env = ["env=Pendulum", "algo.num_samples=4"] if algo in SAMPLED else []
    return [sys.executable, str(REPO / f"sota-implementations/muzero/{name}"), f"algo={algo}", *env,
            f"run_dir={run_dir}", *TINY_ARGS, *args]


@pytest.mark.parametrize("name", VARIANTS)
def test_both_scripts_run_the_algorithm_and_stop_cleanly(tmp_path, name):
    sync_dir = tmp_path / "sync"
    proc = subprocess.run(_script("muzero_sync.py", name, sync_dir, "train.total_env_steps=384", "eval.interval=40"),
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = json.loads((sync_dir / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["train_iter"] > 0
    assert json.loads((sync_dir / "config.json").read_text())["algo"]["name"] == name
    assert (sync_dir / "eval.csv").read_text().count("\n") >= 2  # a header and an evaluation

    async_dir = tmp_path / "async"
    code, out, leftovers = stop_script_after_checkpoint(
        _script("muzero_async.py", name, async_dir, "train.total_env_steps=1000000",
                "async_pipeline.num_evaluator_actors=0"),
        async_dir, lambda proc, marker: proc.send_signal(signal.SIGINT), cwd=tmp_path)
    assert code == 130, out[-4000:]
    assert leftovers == [], leftovers
    summary = json.loads((async_dir / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert load_checkpoint(async_dir / "ckpt" / "last.pt")["counters"]["train_iter"] == summary["train_iter"] > 0


@pytest.mark.parametrize("name", VARIANTS)
def test_async_resume_then_nan(tmp_path, name, monkeypatch):
    first = AsyncTrainer(tiny_config(tmp_path, **_keys(name), **{"async_pipeline.num_evaluator_actors": 0}))
    summary = first.run()
    assert summary["status"] == "ok", summary
    done_iter = summary["train_iter"]

    # resume: counters and buffer continue; a NaN a few updates later stops with the last good checkpoint
    resumed = AsyncTrainer(tiny_config(tmp_path, resume=str(tmp_path), **_keys(name), **{
        "train.total_env_steps": 10**6, "async_pipeline.num_evaluator_actors": 0}))
    assert resumed.learner.train_iter == done_iter and len(resumed.buffer) > 0
    poison_at = (done_iter // 10 + 2) * 10 + 3  # past the next two periodic checkpoints
    real_forward = resumed.learner.loss_module.forward

    def poisoned(td):
        out = real_forward(td)
        if resumed.learner.train_iter >= poison_at:
            out["loss_value"] = out["loss_value"] * float("nan")
        return out

    monkeypatch.setattr(resumed.learner.loss_module, "forward", poisoned)
    summary = resumed.run()
    assert summary["status"] == "nan" and f"train step {poison_at}" in summary["reason"], summary
    state = load_checkpoint(tmp_path / "ckpt" / "last.pt")
    assert state["counters"]["train_iter"] == poison_at - 3
    assert all(torch.isfinite(v).all() for v in state["model"].values())
    assert not _wait_no_descendants()


@pytest.mark.parametrize("name", VARIANTS)
def test_async_dead_collector_stops_the_run(tmp_path, name):
    """A collector killed mid-run stops the run within seconds, naming it (alone under xdist: conftest.py)."""
    trainer = AsyncTrainer(tiny_config(tmp_path / "dead", **_keys(name), **{"train.total_env_steps": 10**6,
                                                                           "async_pipeline.num_evaluator_actors": 0}))
    killed = kill_when_training(trainer, 5, lambda: trainer.backend.collector.procs[0].pid)
    summary = trainer.run()
    assert killed, "the run never reached 5 updates"
    assert summary["status"] == "fault" and "collector " in summary["reason"] and "died" in summary["reason"]
    assert time.monotonic() - killed[0][0] < 10.0
    assert not _wait_no_descendants()
