"""Files a run writes and reads: loaded without running code, durable once written (issue 37).

* Every checkpoint is read with ``torch.load(weights_only=True)``: a file
  holding a pickled object is refused in one line naming it, before any code
  of it runs; a checkpoint written by the format of before (a frozen run
  folder, test/fixtures/checkpoint_v1, made by test/make_checkpoint_fixture.py)
  keeps loading and resuming.
* ``last.pt``, ``best.pt``, ``buffer.pt``, ``config.json`` and
  ``summary.json`` are written through a temporary file that is fsynced,
  renamed, and whose folder is then fsynced.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from make_checkpoint_fixture import weights_digest
from torchrl_muzero import durable_files
from torchrl_muzero.trainers.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

FIXTURE = Path(__file__).parent / "fixtures" / "checkpoint_v1"


def _create_marker(path: Path) -> None:
    Path(path).touch()


class _RunsCode:
    """A pickled object that would create a file while being unpickled (what a hostile checkpoint does)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (_create_marker, (self.marker,))


def _hostile_file(path: Path, marker: Path, state: dict) -> Path:
    torch.save({**state, "extra": _RunsCode(marker)}, path)  # torch.save pickles anything
    return path


def _one_line(text: str) -> bool:
    return "\n" not in text.strip()


# -- today's files keep loading ---------------------------------------------------------------------

def test_a_checkpoint_of_the_earlier_format_loads_weights_only():
    expected = json.loads((FIXTURE / "expected.json").read_text())
    state = load_checkpoint(FIXTURE / "ckpt" / "last.pt")
    assert state["counters"]["env_steps"] == expected["env_steps"]
    assert state["train_iter"] == expected["train_iter"]
    got = weights_digest(state["model"])
    assert got.keys() == expected["model"].keys()
    for key, (shape, total) in expected["model"].items():
        assert got[key][0] == shape
        assert got[key][1] == pytest.approx(total, rel=1e-9, abs=1e-9), key
    best = load_checkpoint(FIXTURE / "ckpt" / "best.pt")
    assert best["counters"]["policy_version"] == best["counters"]["best_version"]


def test_a_run_of_the_earlier_format_resumes(tmp_path):
    from torchrl_muzero.trainers import SyncTrainer

    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    saved = json.loads((run / "config.json").read_text())
    start = json.loads((FIXTURE / "expected.json").read_text())["env_steps"]
    cfg = {k: v for k, v in saved.items() if k not in ("run_dir", "resume")}
    cfg["train"] = {**saved["train"], "total_env_steps": start + 128}
    trainer = SyncTrainer({**cfg, "resume": str(run)})
    assert trainer.env_steps == start  # the checkpoint's counters
    assert len(trainer.buffer) > 0  # and its buffer.pt
    summary = trainer.run()
    assert summary["status"] == "ok" and summary["env_steps"] >= start + 128
    assert load_checkpoint(run / "ckpt" / "last.pt")["counters"]["env_steps"] == summary["env_steps"]


# -- a file with a pickled object is refused, and none of it runs -------------------------------------

def test_a_checkpoint_holding_a_pickled_object_is_refused_in_one_line(tmp_path):
    marker = tmp_path / "code_ran"
    state = load_checkpoint(FIXTURE / "ckpt" / "last.pt")
    path = _hostile_file(tmp_path / "best.pt", marker, state)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert str(path) in message and _one_line(message), message
    assert "pickled objects" in message and "_create_marker" in message and "refused" in message
    assert not marker.exists()  # refused before the object was built
    # the unsafe load would have run it: the test can fail
    torch.load(path, weights_only=False)
    assert marker.exists()


def test_resume_from_a_hostile_checkpoint_stops_before_anything_runs(tmp_path):
    from torchrl_muzero.trainers import SyncTrainer
    from torchrl_muzero.trainers.config import ConfigError

    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    marker = tmp_path / "code_ran"
    _hostile_file(run / "ckpt" / "last.pt", marker, load_checkpoint(FIXTURE / "ckpt" / "last.pt"))
    saved = json.loads((run / "config.json").read_text())
    cfg = {k: v for k, v in saved.items() if k not in ("run_dir", "resume")}
    with pytest.raises((ConfigError, CheckpointError)) as info:
        SyncTrainer({**cfg, "resume": str(run)})
    assert str(run / "ckpt" / "last.pt") in str(info.value) and _one_line(str(info.value))
    assert not marker.exists()


def test_resume_with_a_hostile_buffer_file_stops_in_one_line(tmp_path):
    from torchrl_muzero.trainers import SyncTrainer

    run = tmp_path / "run"
    shutil.copytree(FIXTURE, run)
    marker = tmp_path / "code_ran"
    _hostile_file(run / "ckpt" / "buffer.pt", marker, torch.load(FIXTURE / "ckpt" / "buffer.pt", weights_only=True))
    with pytest.raises(CheckpointError) as info:
        SyncTrainer({"resume": str(run)})
    message = str(info.value)
    assert str(run / "ckpt" / "buffer.pt") in message and _one_line(message) and "pickled objects" in message
    assert not marker.exists()


def test_a_buffer_file_holding_a_pickled_object_is_refused_in_one_line(tmp_path):
    from torchrl_muzero.data.buffer_state import load_buffer_file

    marker = tmp_path / "code_ran"
    state = torch.load(FIXTURE / "ckpt" / "buffer.pt", weights_only=True)
    path = _hostile_file(tmp_path / "buffer.pt", marker, state)
    with pytest.raises(ValueError) as info:
        load_buffer_file(object(), path)  # refused before the buffer is touched
    assert str(path) in str(info.value) and _one_line(str(info.value)), str(info.value)
    assert not marker.exists()


# -- durable writes ---------------------------------------------------------------------------------

@pytest.fixture
def fsyncs(monkeypatch):
    """The paths ``os.fsync`` was called on, in order (through durable_files only)."""
    seen: list[str] = []
    real = os.fsync

    def recording_fsync(fd):
        seen.append(os.readlink(f"/proc/self/fd/{fd}") if os.path.exists("/proc/self/fd") else str(fd))
        return real(fd)

    monkeypatch.setattr(durable_files.os, "fsync", recording_fsync)
    return seen


@pytest.mark.skipif(not os.path.exists("/proc/self/fd"), reason="reads an fd's path from /proc")
def test_save_checkpoint_fsyncs_the_file_then_its_folder_and_reads_back(tmp_path, fsyncs):
    path = tmp_path / "ckpt" / "last.pt"
    state = {"model": {"w": torch.arange(6.0).view(2, 3)}, "counters": {"env_steps": 3}, "config": {"seed": 1}}
    assert save_checkpoint(path, state) == path
    assert fsyncs == [str(path) + ".tmp", str(path.parent)]  # data first, then the rename
    back = load_checkpoint(path)
    assert torch.equal(back["model"]["w"], state["model"]["w"]) and back["counters"] == state["counters"]
    assert sorted(p.name for p in path.parent.iterdir()) == ["last.pt"]  # no temporary left


def test_a_failed_write_leaves_the_previous_checkpoint_whole(tmp_path):
    path = tmp_path / "last.pt"
    save_checkpoint(path, {"model": {"w": torch.ones(3)}, "counters": {"env_steps": 1}, "config": {}})
    with pytest.raises(Exception):  # torch.save cannot pickle a lambda: the write fails half way
        save_checkpoint(path, {"model": {"w": torch.zeros(3)}, "counters": {}, "config": {"f": lambda: 0}})
    assert torch.equal(load_checkpoint(path)["model"]["w"], torch.ones(3))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt"]


@pytest.mark.skipif(not os.path.exists("/proc/self/fd"), reason="reads an fd's path from /proc")
def test_a_run_writes_each_of_its_files_durably(tmp_path, fsyncs):
    from make_checkpoint_fixture import CONFIG

    from torchrl_muzero.trainers import SyncTrainer

    run = tmp_path / "run"
    summary = SyncTrainer({**CONFIG, "train": {**CONFIG["train"], "total_env_steps": 128}, "run_dir": str(run)}).run()
    assert summary["status"] == "ok"
    for name in ("config.json", "summary.json", "ckpt/last.pt", "ckpt/buffer.pt", "ckpt/best.pt"):
        target = run / name
        assert target.is_file(), name
        # the temporary file's data, then the folder after the rename
        i = fsyncs.index(str(target) + ".tmp")
        assert str(target.parent) in fsyncs[i + 1:], name
    assert json.loads((run / "summary.json").read_text())["env_steps"] == summary["env_steps"]
    assert not list(run.rglob("*.tmp"))


def test_board_eval_refuses_a_hostile_checkpoint_in_one_line(tmp_path, capsys):
    import importlib.util

    script = Path(__file__).resolve().parents[1] / "sota-implementations" / "muzero" / "board_eval.py"
    spec = importlib.util.spec_from_file_location("board_eval", script)
    board_eval = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(board_eval)

    marker = tmp_path / "code_ran"
    (tmp_path / "ckpt").mkdir()
    _hostile_file(tmp_path / "ckpt" / "best.pt", marker, load_checkpoint(FIXTURE / "ckpt" / "best.pt"))
    with pytest.raises(SystemExit) as info:
        board_eval.main([str(tmp_path), "--checkpoint", "best.pt"])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("error: checkpoint ") and _one_line(err) and "best.pt" in err, err
    assert not marker.exists()
