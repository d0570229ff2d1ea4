"""The learner: model, target model, loss and optimizer, stepped on replay samples.

Only the driver process holds a learner; it is the single owner of the
trainable weights and of the replay buffer it samples from.
"""
from __future__ import annotations

import copy
import math
from typing import Callable

import torch

from torchrl_muzero.mcts.search import backend_scope
from torchrl_muzero.trainers.builders import build_loss
from torchrl_muzero.trainers.config import TrainConfig

__all__ = ["Learner", "NonFiniteLossError"]


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite: the run stops and keeps its last good checkpoint."""


class Learner:
    """One MuZero update per :meth:`step`: sample, loss, clipped Adam step, priorities back.

    The loss hears the update count through the hooks of
    :class:`~torchrl_muzero.objectives.unrolled.UnrolledModelLoss`:
    ``set_train_iter(train_iter)`` before every forward (the count of updates
    done so far) and ``after_update(train_iter)`` with the new count right
    after the optimizer step (UniZero's EMA target encoder); the base's are no-ops.

    Args:
        model: the trainable :class:`~torchrl_muzero.modules.MuZeroModel`.
        buffer: a :class:`~torchrl_muzero.data.GameBuffer` (or anything with
            ``sample(batch_size, model=..., target_model=...)`` and
            ``update_priority(index, priority, stamp)``).
        cfg: the run's :class:`~torchrl_muzero.trainers.config.TrainConfig`.
        device: where the updates run.

    Examples:
        >>> from torchrl_muzero.trainers.learner import Learner   # doctest: +SKIP
        >>> learner = Learner(model, buffer, cfg, torch.device("cpu"))  # doctest: +SKIP
        >>> metrics = learner.step()  # doctest: +SKIP
    """

    def __init__(self, model, buffer, cfg: TrainConfig, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        self.model = model.to(device)
        self.target_model = copy.deepcopy(self.model).eval()
        for p in self.target_model.parameters():
            p.requires_grad_(False)
        self.buffer = buffer
        self.loss_module = build_loss(cfg, self.model).to(device)  # the algorithm's (algo.name)
        self.optimizer = torch.optim.AdamW(
            self.loss_module.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay
        )
        self.train_iter = 0

    def step(self, before_optimizer_step: Callable[[], None] | None = None) -> dict[str, float]:
        """One update; returns its scalar metrics.

        ``before_optimizer_step`` runs after the backward pass, right before
        the weights change (the async driver waits there for the workers to
        apply the previous publish, so the policy lag bound holds while the
        wait overlaps the sampling, forward and backward passes).
        """
        self.model.train()
        # policy_version: the data's age, for EfficientZero's off-policy correction (collectors stamp train_iter)
        # mcts.backend=torch: the targets' roots and reanalyze searches stay out of the C++ kernel too
        with backend_scope(self.cfg.mcts):
            batch = self.buffer.sample(self.cfg.optim.batch_size, model=self.model, target_model=self.target_model,
                                       policy_version=self.train_iter)
        stamp = batch.get("stamp", None) if "stamp" in batch.keys() else None
        # train_iter to the loss (UniZero's label-smoothing schedule; a no-op for the others)
        self.loss_module.set_train_iter(self.train_iter)
        out = self.loss_module(batch.to(self.device))
        loss = sum(v for k, v in out.items() if k.startswith("loss_"))
        if not math.isfinite(float(loss.detach())):
            parts = {k: float(v.detach()) for k, v in out.items() if k.startswith("loss_")}
            raise NonFiniteLossError(f"the loss became non-finite at train step {self.train_iter}: {parts}")
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        # optim.max_grad_norm=0 turns clipping off (the norm is still measured and logged)
        grad_norm = torch.nn.utils.clip_grad_norm_(self.loss_module.parameters(),
                                                   self.cfg.optim.max_grad_norm or float("inf"))
        if before_optimizer_step is not None:
            before_optimizer_step()
        self.optimizer.step()
        self.buffer.update_priority(batch["index"], out["priority"].detach().cpu(), stamp)
        self.train_iter += 1
        # after the weights changed: UniZero's EMA target encoder steps here, with the new count
        self.loss_module.after_update(self.train_iter)
        if self.train_iter % self.cfg.train.target_update_interval == 0:
            self.target_model.load_state_dict(self.model.state_dict())
        metrics = {k: float(v.detach()) for k, v in out.items() if v.numel() == 1}
        metrics["loss"] = float(loss.detach())
        metrics["grad_norm"] = float(grad_norm)
        return metrics

    def state_dict(self) -> dict:
        return {
            "model": self.model.state_dict(),
            "target_model": self.target_model.state_dict(),
            "loss_module": self.loss_module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "train_iter": self.train_iter,
        }

    def load_state_dict(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.target_model.load_state_dict(state.get("target_model", state["model"]))
        if "loss_module" in state:
            self.loss_module.load_state_dict(state["loss_module"])
        if "optimizer" in state:
            self.optimizer.load_state_dict(state["optimizer"])
            # the saved param groups carry the old run's lr and weight decay; a resume that sets
            # optim.lr / optim.weight_decay means this run's values (Adam's moments stay)
            for group in self.optimizer.param_groups:
                group["lr"], group["weight_decay"] = self.cfg.optim.lr, self.cfg.optim.weight_decay
        self.train_iter = int(state.get("train_iter", 0))
