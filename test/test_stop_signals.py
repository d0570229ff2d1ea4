"""Ctrl-C / SIGTERM stop a run at a safe point (trainers/stop_signals.py), and a stuck shutdown is bounded."""
import os
import signal
import threading
import time

import pytest
import torch

from pipeline_utils import tiny_config
from torchrl_muzero.trainers import AsyncTrainer, SyncTrainer
from torchrl_muzero.bounded_call import call_within
from torchrl_muzero.trainers.checkpoint import load_checkpoint
from torchrl_muzero.trainers.stop_signals import StopSignals, Terminated

STOPS = {"ctrl-c": (signal.SIGINT, KeyboardInterrupt), "sigterm": (signal.SIGTERM, Terminated)}


@pytest.fixture(autouse=True)
def _sigint_as_in_a_terminal():
    """Python's own Ctrl-C handler for each test: a shell starts background jobs with SIGINT ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("stop", STOPS)
def test_a_signal_outside_a_wait_is_raised_at_the_next_check(stop):
    signum, exc = STOPS[stop]
    signals = StopSignals()
    with signals.installed():
        os.kill(os.getpid(), signum)
        went_on = True  # the handler ran (signals are handled before the next bytecode) and did not raise
        assert signals.received == signum
        with pytest.raises(exc):
            signals.check()
    assert went_on


@pytest.mark.parametrize("stop", STOPS)
def test_a_signal_during_a_wait_ends_the_wait_at_once(stop):
    signum, exc = STOPS[stop]
    signals = StopSignals()
    timer = threading.Timer(0.2, os.kill, (os.getpid(), signum))
    with signals.installed():
        t0 = time.monotonic()
        timer.start()
        with pytest.raises(exc):
            with signals.interruptible():
                time.sleep(30)
    timer.join()
    assert time.monotonic() - t0 < 20


def test_a_second_signal_stops_at_once_and_the_handlers_are_restored():
    before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    signals = StopSignals()
    with signals.installed():
        os.kill(os.getpid(), signal.SIGTERM)  # recorded
        with pytest.raises(KeyboardInterrupt):  # the second one, raised outside any wait
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before


def test_an_ignored_signal_stays_ignored():
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        signals = StopSignals()
        with signals.installed():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
            os.kill(os.getpid(), signal.SIGINT)
            signals.check()
        assert signals.received is None
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_recorded_signal_is_raised_on_entering_a_wait():
    signals = StopSignals()
    with signals.installed():
        os.kill(os.getpid(), signal.SIGINT)
        with pytest.raises(KeyboardInterrupt):
            with signals.interruptible():
                pytest.fail("the wait started although a stop was recorded")


def test_off_the_main_thread_it_changes_nothing():
    seen = {}

    def run():
        signals = StopSignals()
        with signals.installed():
            seen["handler"] = signal.getsignal(signal.SIGINT)
            signals.check()
            with signals.interruptible():
                seen["waited"] = True

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen == {"handler": signal.getsignal(signal.SIGINT), "waited": True}


@pytest.mark.parametrize("stop", STOPS)
def test_a_signal_in_the_middle_of_an_update_stops_after_it_untorn(tmp_path, monkeypatch, stop):
    # the signal arrives inside optimizer.step, before any parameter moved: with Python's default
    # handler the KeyboardInterrupt would leave the step half done (train_iter 3, Adam's moments and
    # step count of some parameters only) and the final checkpoint would save that
    signum, _ = STOPS[stop]
    trainer = SyncTrainer(tiny_config(tmp_path, **{"train.total_env_steps": 10**6,
                                                   "train.checkpoint_interval": 0}))
    optimizer = trainer.learner.optimizer
    real_step = optimizer.step

    def step_hit_by_a_signal(*args, **kwargs):
        if trainer.learner.train_iter == 3:
            os.kill(os.getpid(), signum)
        return real_step(*args, **kwargs)

    monkeypatch.setattr(optimizer, "step", step_hit_by_a_signal)
    summary = trainer.run()
    assert summary["status"] == ("interrupted" if stop == "ctrl-c" else "terminated"), summary
    state = load_checkpoint(tmp_path / "ckpt" / "last.pt")
    assert state["counters"]["train_iter"] == 4  # the update the signal hit was finished, no other began
    steps = {float(s["step"]) for s in state["optimizer"]["state"].values()}
    assert steps == {4.0}  # every parameter's optimizer state went through the same four steps
    # the weights saved are the ones the fourth update produced: the live model's
    for name, value in trainer.learner.model.state_dict().items():
        assert torch.equal(state["model"][name], value), name


def test_a_stuck_shutdown_is_reported_and_the_final_checkpoint_still_written(tmp_path, monkeypatch, capsys):
    import torchrl_muzero.trainers.local_backend as local_backend
    from torchrl_muzero.torchrl_guards import GuardedWeightSyncScheme

    monkeypatch.setattr(local_backend, "_SHUTDOWN_GRACE_S", 1.0)
    stuck = threading.Event()
    real_shutdown = GuardedWeightSyncScheme.shutdown

    def shutdown_that_blocks(self):
        real_shutdown(self)
        stuck.wait(60)  # a lock a killed worker held, a pipe nobody reads

    monkeypatch.setattr(GuardedWeightSyncScheme, "shutdown", shutdown_that_blocks)
    trainer = AsyncTrainer(tiny_config(tmp_path, **{"train.total_env_steps": 256,
                                                    "async_pipeline.num_evaluator_actors": 0,
                                                    # also the workers' ack window for each publish:
                                                    # 1 s failed a publish on a loaded machine
                                                    "async_pipeline.shutdown_timeout_s": 5.0}))
    t0 = time.monotonic()
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    try:
        summary = trainer.run()
    finally:
        stuck.set()
    assert summary["status"] == "ok", summary
    # and the driver hears Ctrl-C as before (nothing of the workers' start-up made it deaf)
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])
    assert time.monotonic() - t0 < 120
    out = capsys.readouterr().out
    assert "the scheme shutdown did not return within 6 s" in out and "shutdown_that_blocks" in out
    assert load_checkpoint(tmp_path / "ckpt" / "last.pt")["counters"]["train_iter"] == summary["train_iter"] > 0


def test_call_within_reports_where_a_call_is_stuck_and_reraises_errors():
    release = threading.Event()

    def waits_for_a_lock():
        release.wait(30)

    message = call_within(waits_for_a_lock, 0.2, "the test's shutdown")
    release.set()
    assert message.startswith("the test's shutdown did not return within 0.2 s")
    assert "waits_for_a_lock" in message  # the stuck frame is named
    with pytest.raises(ValueError, match="broken"):
        call_within(lambda: (_ for _ in ()).throw(ValueError("broken")), 5.0, "a failing shutdown")


def test_the_sync_trainer_too_writes_its_checkpoint_past_a_stuck_close(tmp_path, monkeypatch, capsys):
    import torchrl_muzero.trainers.sync as sync

    monkeypatch.setattr(sync, "_SHUTDOWN_TIMEOUT_S", 1.0)
    trainer = SyncTrainer(tiny_config(tmp_path, **{"train.total_env_steps": 256}))
    release = threading.Event()
    real_run = trainer._loop

    def loop_then_block_the_eval_envs_close():
        real_run()
        real_close = trainer.eval_env.close

        def close_that_blocks(*args, **kwargs):
            real_close(*args, **kwargs)
            release.wait(60)

        trainer.eval_env.close = close_that_blocks

    monkeypatch.setattr(trainer, "_loop", loop_then_block_the_eval_envs_close)
    try:
        summary = trainer.run()
    finally:
        release.set()
    assert summary["status"] == "ok", summary
    assert "the eval_env shutdown did not return within 1 s" in capsys.readouterr().out
    assert load_checkpoint(tmp_path / "ckpt" / "last.pt")["counters"]["train_iter"] == summary["train_iter"] > 0


def test_a_worker_fault_after_a_stop_signal_ends_the_run_as_the_signal_asks(tmp_path, monkeypatch):
    # a terminal's Ctrl-C reaches the workers too: one that stopped before the driver's next safe
    # point shows up as "died", and the run must still end as interrupted, with its final checkpoint
    from torchrl_muzero.trainers.evaluator import WorkerDied

    trainer = SyncTrainer(tiny_config(tmp_path, **{"train.total_env_steps": 10**6}))
    real_step = trainer.learner.step

    def step_then_a_dead_worker(*args, **kwargs):
        out = real_step(*args, **kwargs)
        if trainer.learner.train_iter == 3:
            os.kill(os.getpid(), signal.SIGINT)  # recorded: an update is no place to stop
            raise WorkerDied("collector worker 0 (pid 1, exit code 0) died")
        return out

    monkeypatch.setattr(trainer.learner, "step", step_then_a_dead_worker)
    summary = trainer.run()
    assert (summary["status"], summary["exit_code"]) == ("interrupted", 130), summary
    assert summary["reason"] == "interrupted by Ctrl-C (then: collector worker 0 (pid 1, exit code 0) died)"
    assert load_checkpoint(tmp_path / "ckpt" / "last.pt")["counters"]["train_iter"] == 3



def test_processes_started_inside_the_block_are_born_deaf_to_ctrl_c_and_the_driver_is_not():
    import subprocess
    import sys

    from torchrl_muzero.trainers.stop_signals import children_deaf_to_ctrl_c

    code = ("import os, signal, time\n"
            "os.kill(os.getpid(), signal.SIGINT)\n"
            "time.sleep(0.2)\n"
            "print('still here')\n")
    with children_deaf_to_ctrl_c():
        worker = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
    out, err = worker.communicate(timeout=120)
    assert (worker.returncode, out.strip()) == (0, "still here"), err
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])  # the driver hears it again
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_the_sync_trainer_starts_its_env_pools_deaf_to_ctrl_c(tmp_path, monkeypatch):
    # env.pool=parallel / async start game processes when the envs are built (a ParallelEnv's
    # set_seed starts its workers): both of the sync trainer's envs must be built inside the block
    import torchrl_muzero.trainers.sync as sync

    real_make_env = sync.make_env
    masks = []

    def make_env_noting_the_mask(*args, **kwargs):
        masks.append(signal.SIGINT in signal.pthread_sigmask(signal.SIG_BLOCK, []))
        return real_make_env(*args, **kwargs)

    monkeypatch.setattr(sync, "make_env", make_env_noting_the_mask)
    summary = SyncTrainer(tiny_config(tmp_path, **{"train.total_env_steps": 64})).run()
    assert summary["status"] == "ok", summary
    assert masks == [True, True]  # the training envs and the eval envs
    assert signal.SIGINT not in signal.pthread_sigmask(signal.SIG_BLOCK, [])  # the driver hears it again
