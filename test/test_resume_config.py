"""``resume=RUN`` continues the saved run: its config.json is the base, only the given keys change.

One small finished run (MemoryLen, non-default model sizes and simulations) is made once; each test
resumes a copy of it (a resume rewrites the folder), in-process except where the command line itself
is what is tested.
"""
from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from torchrl_muzero.trainers import ConfigError, SyncTrainer, TrainConfig
from torchrl_muzero.trainers.config import config_to_dict
from torchrl_muzero.trainers.hydra_entry import compose_config
from torchrl_muzero.trainers.resume_config import FROZEN_KEYS, load_run_config

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = REPO / "sota-implementations" / "muzero"
CONFIG_DIR = SCRIPTS / "config"

# the original run's command line: a non-default env, model sizes and simulations, tiny budgets
ORIGINAL = ["env=MemoryLen", "model.latent_dim=24", "model.hidden_dim=24", "mcts.num_simulations=5",
            "env.num_envs=4", "env.memory_length=3", "train.total_env_steps=128", "train.frames_per_batch=64",
            "train.train_start_after_envsteps=64", "train.checkpoint_interval=10", "optim.batch_size=16",
            "buffer.capacity=2000", "buffer.num_unroll_steps=3", "buffer.td_steps=4", "eval.num_episodes=2",
            "eval.interval=10", "train.stop_return=0", "logger.progress_bar=false", "logger.log_interval=5",
            "async_pipeline.enabled=false"]


@pytest.fixture(scope="module")
def made_run(tmp_path_factory) -> Path:
    """A finished run of ORIGINAL (config.json, ckpt/last.pt, ckpt/buffer.pt); tests copy it."""
    run = tmp_path_factory.mktemp("made") / "run"
    summary = SyncTrainer(compose_config(CONFIG_DIR, [*ORIGINAL, f"run_dir={run}"])).run()
    assert summary["status"] == "ok" and summary["env_steps"] >= 128
    return run


@pytest.fixture
def run(made_run, tmp_path) -> Path:
    copied = tmp_path / "run"
    shutil.copytree(made_run, copied)
    return copied


def _saved(run: Path) -> dict:
    return json.loads((run / "config.json").read_text())


def _expected(saved: dict, run: Path, **changes) -> dict:
    expected = copy.deepcopy(saved)
    expected["resume"] = str(run)
    for dotted, value in changes.items():
        section, key = dotted.split(".")
        expected[section][key] = value
    return expected


# -- the resumed configuration ---------------------------------------------------------------------
def test_resume_keeps_the_saved_config_and_applies_only_the_given_keys(run):
    saved = _saved(run)
    assert saved["env"]["id"] == "memory_len" and saved["model"]["hidden_dim"] == 24  # not the defaults
    expected = _expected(saved, run, **{"train.total_env_steps": 256})
    from_command_line = compose_config(CONFIG_DIR, [f"resume={run}", "train.total_env_steps=256"])
    assert config_to_dict(from_command_line) == expected
    from_python = load_run_config({"resume": str(run), "train": {"total_env_steps": 256}})
    assert config_to_dict(from_python) == expected


def test_repeating_the_original_command_line_changes_nothing(run):
    """The documented way before: pass the same overrides again (group choices included)."""
    cfg = compose_config(CONFIG_DIR, [*ORIGINAL, "algo=muzero", f"resume={run}"])
    assert config_to_dict(cfg) == _expected(_saved(run), run)


def test_keys_that_may_change_are_applied(run):
    changes = {"train.max_wall_time_s": 60.0, "logger.backend": "none", "async_pipeline.num_collector_actors": 2,
               "device": "cpu", "seed": 3, "mcts.num_simulations": 7, "optim.lr": 0.001, "env.num_envs": 8,
               "env.memory_length": 5, "loss.value_loss_weight": 0.5}
    cfg = config_to_dict(compose_config(CONFIG_DIR, [f"resume={run}", *(f"{k}={v}" for k, v in changes.items())]))
    expected = _expected(_saved(run), run)
    for dotted, value in changes.items():
        *section, key = dotted.split(".")
        (expected[section[0]] if section else expected)[key] = value
    assert cfg == expected


def test_a_resumed_run_reaches_the_new_budget_with_the_saved_settings(run):
    first = json.loads((run / "summary.json").read_text())
    trainer = SyncTrainer({"resume": str(run), "train": {"total_env_steps": 256}})
    assert trainer.env_steps == first["env_steps"]
    summary = trainer.run()
    assert summary["status"] == "ok" and summary["env_steps"] >= 256 > first["env_steps"]
    assert summary["train_iter"] > first["train_iter"]
    assert _saved(run)["model"]["hidden_dim"] == 24 and _saved(run)["mcts"]["num_simulations"] == 5


def test_a_resumed_run_trains_with_the_given_learning_rate(run):
    """The optimizer state in the checkpoint holds the old lr / weight decay: the resume's keys win."""
    saved = _saved(run)["optim"]
    trainer = SyncTrainer({"resume": str(run), "optim": {"lr": saved["lr"] / 10, "weight_decay": 0.0}})
    groups = trainer.learner.optimizer.param_groups
    assert [g["lr"] for g in groups] == [saved["lr"] / 10] * len(groups)
    assert [g["weight_decay"] for g in groups] == [0.0] * len(groups)
    assert trainer.learner.optimizer.state  # Adam's moments came back from the checkpoint


def test_the_script_resumes_with_the_saved_config(run, tmp_path):
    """Through the real command line (hydra's job, not preflight alone): only the budget is given."""
    saved = _saved(run)
    proc = subprocess.run([sys.executable, str(SCRIPTS / "muzero_sync.py"), f"resume={run}",
                           "train.total_env_steps=192"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["status"] == "ok" and summary["env_steps"] >= 192
    assert _saved(run) == _expected(saved, run, **{"train.total_env_steps": 192})


# -- keys that cannot change ----------------------------------------------------------------------
@pytest.mark.parametrize("override, message", [
    ("model.hidden_dim=32", r"config key 'model\.hidden_dim' cannot change when resuming .*model\.hidden_dim=24 "
                            r"\(this run: 32\)"),
    ("model.kind=resnet", r"'model\.kind'.*model\.kind='mlp' \(this run: 'resnet'\)"),
    ("algo=unizero", r"'algo\.name'.*algo\.name='muzero' \(this run: 'unizero', from algo=unizero\)"),
    ("algo.name=efficientzero", r"'algo\.name'.*'muzero' \(this run: 'efficientzero'\)"),
    ("env=CartPole", r"'env\.id'.*env\.id='memory_len' \(this run: 'CartPole-v1', from env=CartPole\)"),
    ("model.value_support_size=5", r"'model\.value_support_size'.*=2 \(this run: 5\)"),
    ("loss.consistency_loss_weight=2", r"'loss\.consistency_loss_weight'.*=0\.0 \(this run: 2\.0\)"),
    ("buffer.capacity=4000", r"'buffer\.capacity'.*buffer\.pt.*=2000 \(this run: 4000\).*delete that file"),
    ("env_algo=CartPole_unizero", r"config group 'env_algo' cannot be chosen when resuming"),
    ("~seed", r"'~seed' removes a key"),
])
def test_a_key_that_shapes_the_checkpoint_is_refused_in_one_line(run, override, message):
    with pytest.raises(ConfigError, match=message) as info:
        compose_config(CONFIG_DIR, [f"resume={run}", override])
    assert "\n" not in str(info.value)


def test_the_python_api_refuses_the_same_keys(run):
    with pytest.raises(ConfigError, match=r"'model\.hidden_dim'.*model\.hidden_dim=24 \(this run: 32\)"):
        SyncTrainer({"resume": str(run), "model": {"hidden_dim": 32}})
    # a whole TrainConfig counts as given: its defaults differ from the run's model
    with pytest.raises(ConfigError, match=r"'model\.latent_dim'.*=24 \(this run: 64\)"):
        SyncTrainer(TrainConfig(resume=str(run)))
    # repeating a frozen key with its saved value is fine
    assert load_run_config({"resume": str(run), "model": {"hidden_dim": 24}}).model.hidden_dim == 24


def test_the_script_refuses_a_frozen_key_before_anything_starts(run, tmp_path):
    before = sorted(p.name for p in run.rglob("*"))
    proc = subprocess.run([sys.executable, str(SCRIPTS / "muzero_async.py"), f"resume={run}", "model.hidden_dim=32"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60)
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stdout + proc.stderr
    assert lines[0].startswith("error: config key 'model.hidden_dim'") and "=24 (this run: 32)" in lines[0]
    assert not (tmp_path / "outputs").exists() and sorted(p.name for p in run.rglob("*")) == before


# -- the saved configuration's file -----------------------------------------------------------------
def test_a_missing_config_json_falls_back_to_the_checkpoints(run):
    saved = _saved(run)
    (run / "config.json").unlink()
    cfg = compose_config(CONFIG_DIR, [f"resume={run}", "train.total_env_steps=256"])
    assert config_to_dict(cfg) == _expected(saved, run, **{"train.total_env_steps": 256})


def test_an_unreadable_config_json_is_one_line_that_says_what_to_do(run):
    (run / "config.json").write_text('{"env": {"id": ')
    with pytest.raises(ConfigError, match=r"config key 'resume': the run's saved configuration .*config\.json' "
                                          r"cannot be read .*repair it, or delete it to resume with the "
                                          r"configuration saved in .*last\.pt") as info:
        compose_config(CONFIG_DIR, [f"resume={run}"])
    assert "\n" not in str(info.value)


# -- the list of frozen keys ----------------------------------------------------------------------
def _learner(cfg: dict):
    from torchrl_muzero.envs import env_spaces, make_env
    from torchrl_muzero.trainers.builders import build_buffer, build_model
    from torchrl_muzero.trainers.config import load_config
    from torchrl_muzero.trainers.learner import Learner

    cfg = load_config(cfg)
    probe = make_env(cfg.env, num_envs=1, seed=0)
    shape, actions = env_spaces(probe)
    probe.close()
    return Learner(build_model(cfg, shape, actions), build_buffer(cfg), cfg, torch.device("cpu"))


@pytest.mark.parametrize("algo", ["muzero", "efficientzero", "stochastic_muzero", "muzero_rnn_full_obs", "unizero"])
def test_every_key_whose_change_breaks_the_checkpoint_is_frozen(algo):
    """Change each model / loss / own algo key alone: if the checkpoint no longer loads, the key is frozen."""
    from torchrl_muzero.algorithms import get_algorithm

    base = {"algo": {"name": algo}, "model": {"latent_dim": 8, "hidden_dim": 8},
            "loss": {"projection_dim": 8, "projection_hidden_dim": 8, "prediction_hidden_dim": 8}}
    if algo == "unizero":  # the MuZero loss weights are an error with unizero; its heads are the algo's
        base = {"algo": {"name": algo, "latent_loss": "mse", "position": "absolute", "embed_dim": 16},
                "model": {"hidden_dim": 8}}
    state = _learner(base).state_dict()
    full = config_to_dict(load_run_config(base))
    alternatives = {"algo.position": "rope", "algo.latent_norm": "layernorm", "algo.policy_loss": "kl",
                    "algo.latent_loss": "cos_sim"}
    breaking = []
    for section in ("model", "loss", "algo"):
        for key, value in full[section].items():
            dotted = f"{section}.{key}"
            if key in ("name", "kind") or (section == "algo" and key not in get_algorithm(algo).config_keys):
                continue  # algo.name and model.kind build another model class: frozen by construction
            if algo == "unizero" and section == "loss":
                continue
            if isinstance(value, bool):
                new = not value
            elif isinstance(value, (int, float)):
                new = 0 if dotted == "loss.consistency_loss_weight" else type(value)(value * 2 or 1)
            else:
                new = alternatives.get(dotted)
            if new is None:
                continue
            changed = copy.deepcopy(base)
            changed.setdefault(section, {})[key] = new
            try:
                learner = _learner(changed)
            except ConfigError:  # a value out of range for this key: not a probe of the checkpoint
                continue
            try:
                learner.load_state_dict(state)
            except (RuntimeError, KeyError, ValueError):
                breaking.append(dotted)
    assert breaking, "the probe changes nothing that matters: it is broken"
    assert not set(breaking) - set(FROZEN_KEYS), sorted(set(breaking) - set(FROZEN_KEYS))
