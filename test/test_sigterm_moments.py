"""SIGTERM at each moment of an async run's life ends it cleanly, and nothing is left behind.

A scheduler's stop, ``kill``, ``timeout`` can come at any time. Whenever it comes after the trainer
started its run (``TrainerBase.run`` installed its handlers), the contract is: exit status 143, no
traceback, no process of the run left, no control file left in /dev/shm, and a final ``ckpt/last.pt``
that loads and holds the run's counters. (Before ``run`` -- while torch is imported, the trainer
built -- SIGTERM's default action ends the process, status 143 to a shell: no process of the run
exists yet, no checkpoint has been written, and there is none to write.)

Each moment is hit exactly, not after a guessed sleep: the script runs under a small wrapper that
patches one function of the driver to print ``PAUSED AT <moment>`` and wait there until the
SIGTERM has arrived (or, inside a wait the signal interrupts, until it raises there), then go on.

Also: a driver killed by SIGKILL cannot remove its control file; the next run removes it.
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from pipeline_utils import stop_script_after_checkpoint
from torchrl_muzero.trainers.shared_control import (
    _CONTROL_PREFIX, SharedControl, _pid_namespace, _process_alive, remove_stale_control_files,
)
from torchrl_muzero.trainers.checkpoint import load_checkpoint

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "sota-implementations/muzero/muzero_async.py"

# Runs the script as its own __main__ (runpy: spawned workers import it as __mp_main__, as when it is
# run directly), with one driver function patched to pause at the moment named by argv[1].
_WRAPPER = r'''
import os, runpy, sys, threading, time

moment, script = sys.argv[1], sys.argv[2]
sys.argv = sys.argv[2:]
heard = threading.Event()

from torchrl_muzero.trainers import stop_signals

_handle = stop_signals.StopSignals._handle


def handle(self, signum, frame):
    heard.set()
    return _handle(self, signum, frame)  # records it, or raises it inside an interruptible wait


stop_signals.StopSignals._handle = handle


def pause():
    print(f"PAUSED AT {moment}", flush=True)
    deadline = time.monotonic() + 120
    while not heard.is_set() and time.monotonic() < deadline:
        time.sleep(0.02)


def pause_once(real):
    done = []

    def wrapper(*args, **kwargs):
        if not done:
            done.append(True)
            pause()
        return real(*args, **kwargs)
    return wrapper


if moment == "before-workers":  # the run began (its handlers are installed); no worker exists yet
    from torchrl_muzero.trainers.async_pipeline import AsyncTrainer
    AsyncTrainer._init_driver_state = pause_once(AsyncTrainer._init_driver_state)
elif moment == "workers-starting":  # torchrl started the worker processes; they import torch
    from torchrl_muzero.torchrl_guards import GuardedWeightSyncScheme
    GuardedWeightSyncScheme.connect = pause_once(GuardedWeightSyncScheme.connect)
elif moment == "first-collect":  # the driver waits in torchrl's iterator for its first batch
    from torchrl.collectors import MultiAsyncCollector
    MultiAsyncCollector._get_from_queue = pause_once(MultiAsyncCollector._get_from_queue)
elif moment == "checkpoint":  # last.pt's temporary file is written, not yet renamed into place
    from torchrl_muzero import durable_files
    _atomic_write = durable_files.atomic_write
    paused = []

    def atomic_write(path, write):
        if os.path.basename(path) != "last.pt" or paused:
            return _atomic_write(path, write)
        paused.append(True)
        return _atomic_write(path, lambda f: (write(f), f.flush(), pause()))
    durable_files.atomic_write = atomic_write
else:
    raise SystemExit(f"unknown moment {moment!r}")
runpy.run_path(script, run_name="__main__")
'''

# case -> (the moment, who gets the SIGTERM): the driver alone (`kill PID`), or the whole job (systemd's
# default stop, Slurm, `kill -TERM -PGID`: the workers get it too, and die of it, while starting or collecting)
CASES = {
    "before-workers": ("before-workers", "driver"),
    "workers-starting": ("workers-starting", "driver"),
    "workers-starting-job": ("workers-starting", "job"),
    "first-collect": ("first-collect", "driver"),
    "first-collect-job": ("first-collect", "job"),
    "checkpoint": ("checkpoint", "driver"),
}


def _control_files(pid: int) -> list[str]:
    """The control files (``SharedControl``) named after process ``pid``."""
    folder = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    return [name for name in os.listdir(folder) if name.startswith(f"{_CONTROL_PREFIX}{pid}_")]


@pytest.mark.parametrize("case", CASES)
def test_sigterm_at_each_moment_stops_cleanly_and_leaves_nothing(tmp_path, case):
    moment, target = CASES[case]
    run_dir = tmp_path / "run"
    # no evaluator at the checkpoint: its own checkpoints and start-up add time, not a moment
    interval = 2 if moment == "checkpoint" else 10
    cmd = [sys.executable, "-c", _WRAPPER, moment, str(SCRIPT),
           f"run_dir={run_dir}", "env.num_envs=4", "model.latent_dim=16", "model.hidden_dim=16",
           "mcts.num_simulations=4", "optim.batch_size=32", "train.total_env_steps=1000000",
           "train.train_start_after_envsteps=128", "train.frames_per_batch=64", "logger.progress_bar=false",
           "eval.num_episodes=2", f"train.checkpoint_interval={interval}",
           f"async_pipeline.num_evaluator_actors={int(moment != 'checkpoint')}"]
    drivers = []

    def sigterm(proc, marker):
        drivers.append(proc.pid)
        if target == "job":
            os.killpg(proc.pid, signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGTERM)

    returncode, out, leftovers = stop_script_after_checkpoint(cmd, run_dir, sigterm, cwd=tmp_path,
                                                              own_process_group=target == "job",
                                                              ready_line=f"PAUSED AT {moment}")
    assert returncode == 143, out[-4000:]
    assert "Traceback" not in out, out[-8000:]
    assert "terminated (SIGTERM), writing a final checkpoint" in out, out[-4000:]
    assert leftovers == [], leftovers
    assert _control_files(drivers[0]) == []
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["status"], summary["exit_code"]) == ("terminated", 143), summary
    # the final checkpoint, whole, of the state the run stopped in (update 0 when no worker had started)
    assert load_checkpoint(run_dir / "ckpt" / "last.pt")["counters"]["train_iter"] == summary["train_iter"]
    if moment == "checkpoint":
        assert summary["train_iter"] >= interval  # the paused write was a periodic one, not the final one


# -- a SIGKILLed driver's control file ----------------------------------------------------------------
_CREATE_AND_WAIT = ("from torchrl_muzero.trainers.shared_control import SharedControl\n"
                    "print(SharedControl(5).path, flush=True)\n"
                    "import time; time.sleep(120)\n")


def test_the_control_file_of_a_killed_driver_is_removed_by_the_next_run():
    driver = subprocess.Popen([sys.executable, "-c", _CREATE_AND_WAIT], stdout=subprocess.PIPE, text=True)
    try:
        stale = driver.stdout.readline().strip()
    finally:
        driver.kill()  # SIGKILL: close() never runs
        driver.wait()
    assert stale and os.path.exists(stale)
    live = SharedControl(5)  # this process is alive: its file must survive the next run's cleanup
    try:
        after = SharedControl(5)
        after.close()
        assert not os.path.exists(stale)
        assert os.path.exists(live.path)
    finally:
        live.close()
        if os.path.exists(stale):
            os.unlink(stale)


def test_only_files_of_dead_processes_of_this_pid_namespace_are_removed(tmp_path):
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: its pid names no process (until the system hands it out again)
    namespace = _pid_namespace()
    names = {
        "dead": f"{_CONTROL_PREFIX}{gone.pid}_{namespace}_abc",
        "alive": f"{_CONTROL_PREFIX}{os.getpid()}_{namespace}_abc",
        # another container's (docker --ipc=host shares /dev/shm, not pids): its pid means nothing here
        "other namespace": f"{_CONTROL_PREFIX}{gone.pid}_{namespace + 1}_abc",
        "no pid (older versions)": f"{_CONTROL_PREFIX}k2j3_9ab",
        "not ours": f"other_{gone.pid}_{namespace}_abc",
    }
    for name in names.values():
        (tmp_path / name).write_bytes(b"\0" * 40)
    removed = remove_stale_control_files(str(tmp_path))
    if _process_alive(gone.pid):
        pytest.skip("the exited process's pid was handed out again meanwhile")
    assert removed == [str(tmp_path / names["dead"])]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(n for k, n in names.items() if k != "dead")
    assert remove_stale_control_files(str(tmp_path / "missing")) == []  # a cleanup never stops a run
