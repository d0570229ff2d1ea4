"""The learner hands train_iter to the loss on every update, in the sync and the async trainer."""
from __future__ import annotations

import pytest

from pipeline_utils import tiny_config
from torchrl_muzero.trainers import AsyncTrainer, SyncTrainer


@pytest.mark.parametrize("trainer_cls", [SyncTrainer, AsyncTrainer])
def test_every_update_gives_the_loss_its_train_iter(tmp_path, trainer_cls):
    trainer = trainer_cls(tiny_config(tmp_path, **{"eval.interval": 10**6, "async_pipeline.num_evaluator_actors": 0}
                                      if trainer_cls is AsyncTrainer else {"eval.interval": 10**6}))
    before, after = [], []
    loss = trainer.learner.loss_module
    # instance attributes: the learner looks the hooks up on the loss, MuZeroLoss has none of its own
    object.__setattr__(loss, "set_train_iter", before.append)
    object.__setattr__(loss, "after_update", after.append)
    summary = trainer.run()
    n = summary["train_iter"]
    assert summary["status"] == "ok" and n > 0
    assert before == list(range(n))         # before each forward: the updates done so far
    assert after == list(range(1, n + 1))   # after each optimizer step: the new count
