"""Just-in-time collection: keep the async collectors a bounded number of env steps ahead of the learner.

Why. Left alone, a collector worker starts its next batch the moment the
driver takes the last one, finishes it in a fraction of the time the learner
needs for that batch's updates, and the batch then waits in the queue. The
learner therefore always trains on data one collect older than the sync
pipeline's (CartPole UniZero's figures: docs/performance_pipeline.md, "Design
figures quoted from the code"; the newest data age: docs/architecture.md). With
``async_pipeline.collect_ahead_frames = N`` a worker runs a step only while
the frames it would then have collected stay within ``N`` env steps of what the
learner has trained on, so the next batch is collected while the learner works
through the current one and is complete about when the learner needs it.

The rule (:func:`collect_gate_open`). The learner, after ``u`` updates at a
replay ratio ``rr`` and a warm-up of ``w`` env steps, has used the data up to
env step ``w + u / rr``. A worker that has collected ``f`` frames of its own
(``n`` more in the step it is about to run), one of ``W`` workers that run
alike, stands at about env step ``offset + W * (f + n)`` of the run. The step
runs when ``rr * (offset + W * (f + n) - N - w) <= u + 1`` (the ``+ 1`` absorbs
the floor of the driver's whole updates), or whenever the driver waits for a
batch with nothing left to train on (its idle flag): the learner never waits
on a worker held back by an estimate. With ``N >= W * frames_per_batch`` the
slowest worker's whole batch fits under the bound by the time the learner has
used what it holds, so the learner waits only for a worker's last step; a
smaller ``N`` holds the collectors longer and the learner waits for whole
batches (``N = 0`` is the sync pipeline's order: collect, then train).

Where it runs. Local backend: :class:`PacedPolicy` wraps the worker's
:class:`~torchrl_muzero.torchrl_guards.LockedPolicy` from the
outside, so it waits *before* taking the lock that weight updates take (a
worker waiting under that lock would block the publish the learner waits for).
Ray backend: the driver applies the same rule before it starts a collect
(``ray_backend.py``), at batch granularity.
"""
from __future__ import annotations

import os
import time
from typing import Any

from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase

__all__ = ["PacedPolicy", "collect_gate_open"]


def collect_gate_open(*, frames_after: float, learner_iter: int, ahead: int, replay_ratio: float,
                      warmup: int) -> bool:
    """Whether collection may reach env step ``frames_after`` with the learner at ``learner_iter`` updates.

    ``ahead < 0`` turns the bound off (collect as fast as the workers can).

    Examples:
        >>> from torchrl_muzero.trainers.collect_pacing import collect_gate_open
        >>> # warm-up 1000, replay ratio 0.25, 256 ahead: the first 1256 env steps need no update
        >>> collect_gate_open(frames_after=1256, learner_iter=0, ahead=256, replay_ratio=0.25, warmup=1000)
        True
        >>> collect_gate_open(frames_after=1512, learner_iter=0, ahead=256, replay_ratio=0.25, warmup=1000)
        False
        >>> collect_gate_open(frames_after=1512, learner_iter=63, ahead=256, replay_ratio=0.25, warmup=1000)
        True
        >>> collect_gate_open(frames_after=10**9, learner_iter=0, ahead=-1, replay_ratio=0.25, warmup=0)
        True
    """
    if ahead < 0:
        return True
    return replay_ratio * (frames_after - ahead - warmup) <= learner_iter + 1


class PacedPolicy(TensorDictModuleBase):
    """Worker-side gate: wait, before the policy call, until :func:`collect_gate_open` holds.

    It reads the learner's update count and the run's env steps at the actors'
    start from a shared control block the driver writes (``control[i]`` floats;
    the async trainer's ``SharedControl``), counts its own frames, and polls
    every ``poll_s`` seconds while the gate is shut. It gives up waiting (and
    runs the step) once the driver writes a non-zero release flag, which the
    trainer does before it shuts the collectors down; it also runs the step
    while the driver's idle flag is set (the driver waits for a batch with
    nothing to train on); and it raises
    ``RuntimeError`` when its parent process is gone, so a worker never
    outlives its driver in this loop.

    Args:
        policy: the worker's policy (a ``LockedPolicy``); called unchanged once the gate opens.
        control: an indexable block of floats the driver writes.
        learner_iter_index, offset_index, release_index, idle_index: where ``control``
            keeps the learner's ``train_iter``, the env steps at the actors' start, the
            release flag and the driver's idle flag.
        num_workers, ahead, replay_ratio, warmup: the rule's ``W``, ``N``, ``rr`` and ``w``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from tensordict.nn import TensorDictModule
        >>> from torchrl_muzero.trainers.collect_pacing import PacedPolicy
        >>> control = [0.0, 0.0, 0.0, 0.0]  # learner_iter, offset, release, idle
        >>> policy = TensorDictModule(lambda obs: obs.sum(-1), in_keys=["observation"], out_keys=["action"])
        >>> paced = PacedPolicy(policy, control, learner_iter_index=0, offset_index=1, release_index=2,
        ...                     idle_index=3, num_workers=1, ahead=8, replay_ratio=1.0, warmup=0)
        >>> paced(TensorDict({"observation": torch.ones(4, 2)}, [4]))["action"]  # 4 frames: within 8 ahead
        tensor([2., 2., 2., 2.])
        >>> paced.frames, paced.waited_s
        (4, 0.0)
    """

    def __init__(self, policy: TensorDictModuleBase, control: Any, *, learner_iter_index: int, offset_index: int,
                 release_index: int, idle_index: int, num_workers: int, ahead: int, replay_ratio: float, warmup: int,
                 poll_s: float = 0.002) -> None:
        super().__init__()
        self.policy = policy
        self.control = control
        self.in_keys = list(policy.in_keys)
        self.out_keys = list(policy.out_keys)
        self._iter_i, self._offset_i = learner_iter_index, offset_index
        self._release_i, self._idle_i = release_index, idle_index
        self.num_workers, self.ahead = int(num_workers), int(ahead)
        self.replay_ratio, self.warmup, self.poll_s = float(replay_ratio), int(warmup), float(poll_s)
        self.frames = 0  # this worker's frames since it started
        self.waited_s = 0.0
        self._parent = os.getppid()

    def _open(self, n: int) -> bool:
        frames_after = float(self.control[self._offset_i]) + self.num_workers * (self.frames + n)
        return collect_gate_open(frames_after=frames_after, learner_iter=int(self.control[self._iter_i]),
                                 ahead=self.ahead, replay_ratio=self.replay_ratio, warmup=self.warmup)

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        n = max(1, tensordict.numel())
        if not self._open(n):
            t0 = time.monotonic()
            while not (self._open(n) or float(self.control[self._release_i]) or float(self.control[self._idle_i])):
                if os.getppid() != self._parent:
                    raise RuntimeError("collector worker: its driver process is gone; stopping.")
                time.sleep(self.poll_s)
            self.waited_s += time.monotonic() - t0
        self.frames += n
        return self.policy(tensordict)
