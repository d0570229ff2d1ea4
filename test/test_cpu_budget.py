"""The async driver's learner threads: the cores the working actors leave free."""
from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from torchrl_muzero.trainers import AsyncTrainer, load_config
from torchrl_muzero.trainers.local_backend import LocalBackend
from torchrl_muzero.trainers.cpu_budget import LearnerThreads


@pytest.fixture(autouse=True)
def keep_torch_threads():
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def test_learner_takes_the_cores_the_actors_leave():
    threads = LearnerThreads(cores=4)
    assert threads.update(busy_cpus=1) == 3 and torch.get_num_threads() == 3
    assert threads.update(busy_cpus=3) == 1 and torch.get_num_threads() == 1
    assert threads.update(busy_cpus=6) == 1, "the learner always keeps one thread"
    assert threads.update(busy_cpus=0) == 4 and torch.get_num_threads() == 4


def test_fixed_thread_count_and_restore():
    torch.set_num_threads(2)
    threads = LearnerThreads(cores=8, fixed=3)
    assert threads.update(busy_cpus=7) == 3 and torch.get_num_threads() == 3
    threads.restore()
    assert torch.get_num_threads() == 2


def test_default_cores_follow_torch_threads():
    torch.set_num_threads(1)
    assert LearnerThreads().cores == 1


def test_bad_values_are_named():
    with pytest.raises(ValueError, match="learner_num_threads must be >= 0"):
        LearnerThreads(cores=2, fixed=-1)


class _Queue:
    def __init__(self, n: int, qsize: bool = True) -> None:
        self.n, self._qsize = n, qsize

    def qsize(self) -> int:
        if not self._qsize:
            raise NotImplementedError
        return self.n

    def empty(self) -> bool:
        return self.n == 0


@pytest.mark.parametrize("waiting,inflight,expected", [(0, 0, 2), (1, 0, 1), (2, 0, 0), (2, 1, 3), (0, 1, 5)])
def test_busy_actor_cpus_counts_collecting_workers_and_running_evaluations(waiting, inflight, expected):
    cfg = load_config({"async_pipeline": {"num_collector_actors": 2, "collector_num_cpus": 1,
                                          "evaluator_num_cpus": 3}})
    fake = SimpleNamespace(cfg=cfg, collector=SimpleNamespace(queue_out=_Queue(waiting)),
                           evaluators=SimpleNamespace(inflight=inflight))
    # a worker whose batch waits in the queue is idle until the driver takes the batch
    assert LocalBackend.busy_actor_cpus(fake) == expected


def test_busy_actor_cpus_without_qsize():
    cfg = load_config({"async_pipeline": {"num_collector_actors": 1}})
    for waiting, expected in ((0, 1), (1, 0)):
        fake = SimpleNamespace(cfg=cfg, collector=SimpleNamespace(queue_out=_Queue(waiting, qsize=False)),
                               evaluators=None)
        assert LocalBackend.busy_actor_cpus(fake) == expected


def test_trainers_keep_the_thread_count_they_were_started_with(tmp_path, monkeypatch):
    """torchrl's SerialEnv.close() caps the caller's threads at the count seen when torchrl was imported."""
    import torchrl

    from pipeline_utils import tiny_config
    from torchrl_muzero.trainers import SyncTrainer

    monkeypatch.setattr(torchrl, "_THREAD_POOL_INIT", 1)  # as if torchrl had been imported with 1 thread
    torch.set_num_threads(2)
    trainer = SyncTrainer(tiny_config(tmp_path, **{"train.total_env_steps": 192, "eval.interval": 10**6}))
    assert torch.get_num_threads() == 2, "building the trainer lowered the thread count"
    seen = []
    step = trainer.learner.step

    def spy(**kw):
        seen.append(torch.get_num_threads())
        return step(**kw)

    trainer.learner.step = spy
    assert trainer.run()["status"] == "ok"
    assert seen and set(seen) == {2}, f"the learner ran with {sorted(set(seen))} threads, not 2"


def _nice_in_child(niceness, out):
    from torchrl_muzero.trainers.cpu_budget import yield_to_learner

    out.put((os.nice(0), yield_to_learner(niceness)))


def test_yield_to_learner_lowers_only_the_actor_process():
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    p = ctx.Process(target=_nice_in_child, args=(5, out))
    p.start()
    before, after = out.get(timeout=60)
    p.join(30)
    assert after == min(before + 5, 19)
    assert os.nice(0) == os.nice(0)  # this (driver) process is untouched
    with pytest.raises(ValueError, match="actor_niceness must be >= 0"):
        from torchrl_muzero.trainers.cpu_budget import yield_to_learner

        yield_to_learner(-1)


def _nice_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[16])


@pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads nice values from /proc (Linux)")
def test_async_actors_run_nicer_than_the_driver(tmp_path):
    import threading
    import time

    from pipeline_utils import tiny_config

    driver_nice = os.nice(0)
    cfg = tiny_config(tmp_path, **{"train.total_env_steps": 10**6, "async_pipeline.actor_niceness": 7,
                                   "eval.interval": 5})
    trainer = AsyncTrainer(cfg)
    seen = {}

    def watch():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not seen.get("done"):
            collector, evaluators = trainer.backend.collector, trainer.backend.evaluators
            # an evaluation came back: the evaluator process is past its start-up
            if collector is not None and evaluators is not None and trainer.best_return > float("-inf"):
                try:
                    seen["collector"] = _nice_of(collector.procs[0].pid)
                    seen["evaluator"] = _nice_of(evaluators.procs[0].pid)
                except (OSError, AttributeError, IndexError):
                    pass
                break
            time.sleep(0.1)
        trainer.cfg.train.total_env_steps = 0  # stop the run (also if no evaluation came back in time)

    threading.Thread(target=watch, daemon=True).start()
    assert trainer.run()["status"] == "ok"
    seen["done"] = True
    assert seen.get("collector") == min(driver_nice + 7, 19), seen
    assert seen.get("evaluator") == min(driver_nice + 7, 19), seen
    assert os.nice(0) == driver_nice
