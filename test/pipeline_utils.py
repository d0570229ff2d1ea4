"""Helpers for pipeline tests: tiny configs and process accounting."""
from __future__ import annotations

import os
import signal
import threading
import time
from typing import Callable


def tiny_config(run_dir, **overrides) -> dict:
    cfg = {
        "run_dir": str(run_dir),
        "env": {"num_envs": 4},
        "model": {"latent_dim": 16, "hidden_dim": 16},
        "mcts": {"num_simulations": 4, "discount": 0.97},
        "optim": {"batch_size": 32},
        "buffer": {"capacity": 5000, "num_unroll_steps": 3, "td_steps": 5},
        "train": {"total_env_steps": 512, "train_start_after_envsteps": 128, "frames_per_batch": 64,
                  "replay_ratio": 0.25, "checkpoint_interval": 10},
        "eval": {"num_episodes": 2, "interval": 20},
        "logger": {"progress_bar": False, "log_interval": 5},
        "async_pipeline": {"shutdown_timeout_s": 20.0},
    }
    for dotted, value in overrides.items():
        node = cfg
        *parents, leaf = dotted.split(".")
        for p in parents:
            node = node.setdefault(p, {})
        node[leaf] = value
    return cfg


def tiny_pong_overrides(run_dir, total_env_steps: int = 192) -> list[str]:
    """Hydra overrides of a Pong run small enough for a test (2 games of 40 steps, a ResNet of 8
    channels, 3 simulations): the end-to-end tests add the algorithm's and the pool's keys."""
    return [
        "env=Pong", f"run_dir={run_dir}", "logger.progress_bar=false",
        "env.num_envs=2", "env.max_episode_steps=40", "env.noop_max=4",
        "model.channels=8", "mcts.num_simulations=3",
        "loss.projection_dim=16", "loss.projection_hidden_dim=16", "loss.prediction_hidden_dim=8",
        "optim.batch_size=8", "buffer.capacity=2000", "buffer.num_unroll_steps=2", "buffer.td_steps=3",
        f"train.total_env_steps={total_env_steps}", "train.train_start_after_envsteps=64",
        "train.frames_per_batch=32", "train.replay_ratio=0.1", "train.checkpoint_interval=5",
        "eval.num_episodes=1", "eval.interval=4",
    ]


def _ppid(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def _is_resource_tracker(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"resource_tracker" in f.read()
    except OSError:
        return False


def live_descendants(root: int | None = None) -> list[int]:
    """PIDs (not zombies) whose parent chain leads to ``root`` (default: this process).

    multiprocessing's resource tracker is left out: it is one per Python
    process, started by the first spawn and meant to live as long as its parent.
    """
    root = os.getpid() if root is None else root
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    parent = {p: _ppid(p) for p in pids}
    out = []
    for p in pids:
        q = parent.get(p)
        while q is not None and q > 1:
            if q == root:
                if not _is_zombie(p) and not _is_resource_tracker(p):
                    out.append(p)
                break
            q = parent.get(q) if q in parent else _ppid(q)
    return out


def processes_with_marker(marker: str) -> list[int]:
    """Live processes whose environment holds ``TORCHRL_MUZERO_TEST_MARKER=marker``."""
    out = []
    needle = f"TORCHRL_MUZERO_TEST_MARKER={marker}".encode()
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) == os.getpid():
            continue
        try:
            with open(f"/proc/{p}/environ", "rb") as f:
                if needle in f.read() and not _is_zombie(int(p)):
                    out.append(int(p))
        except OSError:
            pass
    return out


def kill_when_training(trainer, min_train_iter: int, pid: Callable[[], int | None],
                       timeout_s: float = 120.0) -> list[tuple[float, int | None]]:
    """SIGKILL a worker of a running ``trainer`` once it has made ``min_train_iter`` updates (fault tests).

    A daemon thread polls ``trainer.learner.train_iter`` and calls ``pid()``, which names the victim
    (a collector or evaluator process or Ray actor; ``None`` while it is not up yet). The returned
    list receives ``(time of the kill, trainer's env steps then)`` just before the signal, so a test
    measures the time to stop from no later than the kill; it stays empty if the run never got there.
    """
    killed: list[tuple[float, int | None]] = []

    def killer() -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            victim = pid() if trainer.learner.train_iter >= min_train_iter else None
            if victim is not None:
                killed.append((time.monotonic(), getattr(trainer, "env_steps", None)))
                os.kill(victim, signal.SIGKILL)
                return
            time.sleep(0.1)

    threading.Thread(target=killer, daemon=True).start()
    return killed


def record_batch_sizes(trainer) -> list[int]:
    """Wrap ``trainer._take_batch`` so that the frame count of every batch the driver takes is recorded.

    The collector-mode tests (multi_sync vs multi_async, local and Ray) read from it how many workers'
    frames one batch holds. Returns the list the counts are appended to."""
    sizes: list[int] = []
    take = trainer._take_batch
    trainer._take_batch = lambda batch, budgets: (sizes.append(batch.numel()), take(batch, budgets))
    return sizes


def _describe(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        with open(f"/proc/{pid}/wchan") as f:
            wchan = f.read().strip()
    except OSError:
        return f"pid {pid} (gone)"
    return f"pid {pid} ppid {_ppid(pid)} waiting in {wchan or '?'}: {cmd[:200]}"


def stop_script_after_checkpoint(cmd: list[str], run_dir, stop: Callable[["subprocess.Popen", str], None],
                                 cwd, exit_timeout_s: float = 60.0,
                                 own_process_group: bool = False,
                                 ready_line: str | None = None) -> tuple[int, str, list[str]]:
    """Start a training script, wait for its first checkpoint, call ``stop(proc, marker)``, wait for it to exit.

    ``ready_line``: wait for the script to print this text instead of for its first checkpoint.

    Returns ``(exit status, everything it printed, leftovers)``: ``leftovers`` describes the processes
    of the run (the script and everything it started, found by an environment marker) still alive a
    few seconds after the script exited, so a test can assert there are no orphans.
    ``own_process_group=True`` starts it as the leader of a new process group (``proc.pid`` is the
    group's id), as a terminal runs a command: ``os.killpg(proc.pid, SIGINT)`` is a terminal's Ctrl-C. Output goes to a
    file, not a pipe: a pipe's end of file waits for every process holding it, so an orphan
    would show up as a hang of the script itself and hide which process was left.

    If the script does not exit within ``exit_timeout_s`` the test fails with its output and what
    each of its processes is waiting in. If the script's exit watchdog had to end the process
    (``trainers/exit_watchdog.py``), its report is turned into a warning (the run still ended
    cleanly, but the blocked exit is worth a look).
    """
    import subprocess
    import tempfile
    import uuid
    import warnings
    from pathlib import Path

    import pytest

    run_dir = Path(run_dir)
    marker = uuid.uuid4().hex
    env = {**os.environ, "TORCHRL_MUZERO_TEST_MARKER": marker, "PYTHONUNBUFFERED": "1"}
    fd, name = tempfile.mkstemp(prefix="torchrl_muzero-script-", suffix=".log")
    os.close(fd)
    log_path = Path(name)
    with open(log_path, "w") as log:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True,
                                start_new_session=own_process_group)
    try:
        deadline = time.monotonic() + 180
        awaited = repr(ready_line) if ready_line else "its first checkpoint"
        ready = ((lambda: ready_line in log_path.read_text()) if ready_line
                 else (lambda: (run_dir / "ckpt" / "last.pt").exists()))
        while time.monotonic() < deadline and not ready():
            if proc.poll() is not None:
                break
            time.sleep(0.1 if ready_line else 0.5)
        assert proc.poll() is None, f"the script ended before {awaited}:\n{log_path.read_text()[-4000:]}"
        assert ready(), f"no {awaited} within 180 s:\n{log_path.read_text()[-4000:]}"
        stop(proc, marker)
        try:
            proc.wait(timeout=exit_timeout_s)
        except subprocess.TimeoutExpired:
            stuck = "\n".join(_describe(p) for p in [proc.pid, *processes_with_marker(marker)])
            # the scripts print every thread's stack on SIGUSR1 (hydra_entry.run_script): where it waits
            proc.send_signal(signal.SIGUSR1)
            time.sleep(2.0)
            pytest.fail(f"the script did not exit within {exit_timeout_s:.0f} s of being stopped; its processes:\n"
                        f"{stuck}\nits output ends:\n{log_path.read_text()[-12000:]}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    deadline = time.monotonic() + 5.0  # a killed worker or the resource tracker takes a moment to go
    while processes_with_marker(marker) and time.monotonic() < deadline:
        time.sleep(0.2)
    leftovers = [_describe(p) for p in processes_with_marker(marker)]
    report = run_dir / "exit_watchdog.txt"
    if report.exists():
        warnings.warn(f"the exit watchdog ended {cmd[1]}: {report.read_text()[:3000]}")
    out = log_path.read_text()
    log_path.unlink()
    return proc.returncode, out, leftovers
