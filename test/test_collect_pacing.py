"""Just-in-time collection (async_pipeline.collect_ahead_frames, trainers/collect_pacing.py)."""
from __future__ import annotations

import threading
import time

import pytest
import torch
from pipeline_utils import tiny_config
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

from torchrl_muzero.trainers import AsyncTrainer
from torchrl_muzero.trainers.collect_pacing import PacedPolicy, collect_gate_open
from torchrl_muzero.trainers.config import ConfigError

# control block of the tests: learner_iter, offset, release, idle
_ITER, _OFFSET, _RELEASE, _IDLE = range(4)


@pytest.mark.parametrize("frames_after,learner_iter,expected", [
    (1256, 0, True),    # warm-up 1000 + 256 ahead: no update needed yet
    (1260, 0, True),    # 4 frames past: 1 update owed, within the slack of one whole update
    (1264, 0, False),   # 8 past: 2 updates owed > 0 + 1
    (1268, 2, True),    # 3 owed <= 2 + 1
    (2000, 185, True), (2000, 184, False),  # 0.25 * (2000 - 256 - 1000) = 186 <= 185 + 1
])
def test_gate_rule(frames_after, learner_iter, expected):
    assert collect_gate_open(frames_after=frames_after, learner_iter=learner_iter, ahead=256, replay_ratio=0.25,
                             warmup=1000) is expected


def _paced(control, **kw):
    calls = []

    def act(obs):
        calls.append(time.monotonic())
        return obs.sum(-1)

    policy = TensorDictModule(act, in_keys=["observation"], out_keys=["action"])
    args = dict(learner_iter_index=_ITER, offset_index=_OFFSET, release_index=_RELEASE, idle_index=_IDLE,
                num_workers=1, ahead=4, replay_ratio=1.0, warmup=0, poll_s=0.001)
    args.update(kw)
    return PacedPolicy(policy, control, **args), calls


def _step(paced):
    return paced(TensorDict({"observation": torch.ones(4, 2)}, [4]))


class _CountedReads(list):
    """A control block that counts its reads: the test opens the gate only once the policy is polling."""

    reads = 0

    def __getitem__(self, index):
        self.reads += 1
        return super().__getitem__(index)


def _set_once_polling(control: _CountedReads, index: int, value: float, delay_s: float) -> tuple:
    """Start a thread that sets ``control[index] = value`` ``delay_s`` after the paced step began polling.

    The delay starts only once the step polls (the gate check before the wait reads 2 entries, each
    poll 4): on a loaded machine the step may start late, and a flag set by a timer started before
    it could be set before the step began, so the step would (rightly) not wait at all, which says
    nothing about the accounting. Returns ``(thread, opened_at)``; ``opened_at`` gets the time the
    flag was set.
    """
    reads_before, opened_at = control.reads, []

    def run():
        deadline = time.monotonic() + 10  # a policy that never waits fails its test instead of hanging here
        while control.reads < reads_before + 20 and time.monotonic() < deadline:
            time.sleep(0.001)
        time.sleep(delay_s)
        opened_at.append(time.monotonic())
        control[index] = value

    thread = threading.Thread(target=run)
    thread.start()
    return thread, opened_at


@pytest.mark.parametrize("opener", [_ITER, _RELEASE, _IDLE])
def test_paced_policy_waits_until_the_learner_catches_up_or_the_driver_lets_it_go(opener):
    control = _CountedReads([0.0, 0.0, 0.0, 0.0])
    paced, calls = _paced(control)
    _step(paced)  # frames 0..3: within 4 ahead, runs at once
    assert paced.waited_s == 0.0 and len(calls) == 1
    # frames 4..7 need 0 + 4 updates owed ... > 0 + 1: it waits for the learner (or a flag)
    thread, opened_at = _set_once_polling(control, opener, 3.0 if opener == _ITER else 1.0, 0.3)
    t_before = time.monotonic()
    out = _step(paced)
    t_after = time.monotonic()
    thread.join()
    assert len(calls) == 2 and calls[1] >= opened_at[0], "the policy ran before the gate opened"
    assert 0.3 <= paced.waited_s <= t_after - t_before  # the whole wait is counted, and only the wait
    assert torch.equal(out["action"], torch.full((4,), 2.0))
    assert paced.frames == 8


def test_offset_counts_a_resumed_runs_env_steps():
    control = _CountedReads([0.0, 1000.0, 0.0, 0.0])  # resumed at 1000 env steps, learner at 0 updates past warm-up 1000
    paced, _ = _paced(control, warmup=1000)
    _step(paced)
    assert paced.waited_s == 0.0
    control[_OFFSET] = 2000.0  # the same worker with 1000 env steps more behind it: far ahead of the learner
    thread, _ = _set_once_polling(control, _RELEASE, 1.0, 0.2)
    _step(paced)
    thread.join()
    assert paced.waited_s >= 0.2


def test_collect_ahead_frames_fails_at_start_where_it_has_no_meaning(tmp_path):
    with pytest.raises(ConfigError, match=r"'async_pipeline.collect_ahead_frames' is 64, which bounds "
                                          r"collector=multi_async"):
        AsyncTrainer(tiny_config(tmp_path, **{"async_pipeline.collector": "multi_sync",
                                              "async_pipeline.collect_ahead_frames": 64}))
    with pytest.raises(ConfigError, match=r"'async_pipeline.collect_ahead_frames' must be >= 0 \(or -1: no bound\)"):
        AsyncTrainer(tiny_config(tmp_path, **{"async_pipeline.collect_ahead_frames": -2}))


def test_paced_collection_trains_on_fresher_data_with_every_update(tmp_path):
    """The learner is the slow side (1 update per env step): unpaced, each batch waits a whole budget
    in the queue; with one batch ahead it is collected while the learner works through the last one."""
    summaries = {}
    for name, ahead in (("free", -1), ("paced", 64)):
        cfg = tiny_config(tmp_path / name, **{"train.total_env_steps": 512, "train.replay_ratio": 1.0,
                                              "async_pipeline.num_evaluator_actors": 0,
                                              "async_pipeline.collect_ahead_frames": ahead})
        summaries[name] = AsyncTrainer(cfg).run()
        assert summaries[name]["status"] == "ok", summaries[name]
    free, paced = summaries["free"], summaries["paced"]
    # every batch still buys its updates: 8 batches of 64, the first one (< 128 env steps) none
    assert free["train_iter"] == paced["train_iter"] == 7 * 64
    # sync would give ages 0..63 (mean 31.5); unpaced adds about one budget (64) on top
    assert paced["newest_data_age_mean"] < 0.75 * free["newest_data_age_mean"], summaries
