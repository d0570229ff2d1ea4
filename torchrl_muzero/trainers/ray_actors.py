"""What runs inside the Ray backend's actors: collector and evaluator actors, weights through the object store.

Plain classes: :mod:`~torchrl_muzero.trainers.ray_backend` wraps them with
``ray.remote`` and the run's resources; without Ray they run in-process (the
doctests, and the test that every registered algorithm collects in one).
"""
from __future__ import annotations

import os

import torch
from tensordict import TensorDictBase

from torchrl_muzero.trainers.builders import actor_generator, build_model, build_policy
from torchrl_muzero.trainers.config import load_config
from torchrl_muzero.trainers.cpu_budget import yield_to_learner
from torchrl_muzero.torchrl_guards import LockedPolicy
from torchrl_muzero.trainers.worker_env import make_worker_env

__all__ = ["CollectorActor", "EvaluatorActor", "WeightPacker", "unpack_weights"]


# -- weights through the object store --------------------------------------------------------------
class WeightPacker:
    """Weights as one flat numpy array per dtype: what Ray's object store holds without copies.

    A TensorDict or a dict of tensors goes through pickle, one byte copy per
    tensor on both sides (8.4M parameters to 2 actors: docs/performance_memory.md,
    "Ray: object store against the local scheme");
    numpy arrays are stored as one buffer that every reader on a node maps
    without a copy. :meth:`pack` fills reused flat staging tensors (``ray.put``
    copies them into the store at once, so reuse is safe); :func:`unpack_weights`
    gives the actor a TensorDict of views into the stored arrays, which
    :meth:`LockedPolicy.load_published_weights` copies into its parameters.

    Examples:
        >>> import torch
        >>> packer = WeightPacker(torch.nn.Linear(3, 2))
        >>> weights = unpack_weights(packer.pack(torch.nn.Linear(3, 2)))
        >>> sorted(weights.keys()), weights["weight"].shape
        (['bias', 'weight'], torch.Size([2, 3]))
    """

    def __init__(self, model: torch.nn.Module) -> None:
        from tensordict import TensorDict

        td = TensorDict.from_module(model).flatten_keys(".")
        self.layout: list[tuple] = []
        sizes: dict[torch.dtype, int] = {}
        for key, value in td.items():
            offset = sizes.get(value.dtype, 0)
            self.layout.append((key, value.dtype, tuple(value.shape), offset))
            sizes[value.dtype] = offset + value.numel()
        self.staging = {dtype: torch.empty(n, dtype=dtype) for dtype, n in sizes.items()}

    def pack(self, model: torch.nn.Module) -> dict:
        from tensordict import TensorDict

        td = TensorDict.from_module(model).flatten_keys(".")
        with torch.no_grad():
            for key, dtype, shape, offset in self.layout:
                value = td.get(key)
                self.staging[dtype][offset:offset + value.numel()].copy_(value.detach().reshape(-1))
        return {"layout": [(k, str(d).removeprefix("torch."), shape, off) for k, d, shape, off in self.layout],
                "arrays": {str(d).removeprefix("torch."): t.numpy() for d, t in self.staging.items()}}


def unpack_weights(packed: dict) -> TensorDictBase:
    """The TensorDict of weights :meth:`WeightPacker.pack` describes (views into its arrays)."""
    import warnings

    from tensordict import TensorDict

    with warnings.catch_warnings():  # the store's arrays are read-only; the views are only read
        warnings.simplefilter("ignore", UserWarning)
        flat = {name: torch.from_numpy(array) for name, array in packed["arrays"].items()}
    out = {}
    for key, dtype, shape, offset in packed["layout"]:
        n = 1
        for d in shape:
            n *= d
        out[key] = flat[dtype][offset:offset + n].view(shape)
    return TensorDict(out, batch_size=[]).unflatten_keys(".")


# -- the actors (plain classes; ray.remote wraps them with the run's resources) --------------------
class CollectorActor:
    """One collector: the run's env and search policy behind a single-process torchrl ``Collector``.

    :meth:`collect` loads the given weights first (at the collect boundary)
    when they are a new version, then returns one batch of
    ``train.frames_per_batch`` frames, each tagged with that version. Without
    Ray it is a plain object (what the doctest shows).

    Examples:
        >>> import torch
        >>> from torchrl_muzero.trainers.config import config_to_dict, load_config
        >>> from torchrl_muzero.trainers.worker_env import action_spec_of
        >>> # built in this process, not a Ray worker: keep this process's priority and thread count
        >>> # (an actor lowers its own priority by async_pipeline.actor_niceness and takes collector_num_cpus)
        >>> cfg = load_config({"env": {"num_envs": 2}, "train": {"frames_per_batch": 8},
        ...                    "model": {"latent_dim": 8, "hidden_dim": 8}, "mcts": {"num_simulations": 2},
        ...                    "async_pipeline": {"actor_niceness": 0, "collector_num_cpus": torch.get_num_threads()}})
        >>> actor = CollectorActor(config_to_dict(cfg), 0, 1, (4,), 2, action_spec_of(cfg))
        >>> batch = actor.collect(None, 0, 1.0)
        >>> batch.batch_size, batch["policy_version"].unique().tolist()
        (torch.Size([2, 4]), [0])
        >>> actor.close()
    """

    def __init__(self, cfg_dict: dict, index: int, seed: int, observation_shape, action_space, action_spec,
                 device: str = "cpu") -> None:
        from torchrl.collectors import Collector

        cfg = load_config(cfg_dict)
        self.index = index
        yield_to_learner(cfg.async_pipeline.actor_niceness)
        torch.set_num_threads(max(1, cfg.async_pipeline.collector_num_cpus))
        model = build_model(cfg, observation_shape, action_space).to(device).eval()
        # seeded like the actor's envs (a restarted actor gets a new seed, so a new stream too)
        self.search = build_policy(cfg, model, action_spec, generator=actor_generator(seed, device))
        self.policy = LockedPolicy(self.search, weights_module=model)
        env = make_worker_env(cfg_dict, seed, observation_shape, action_space)
        self.collector = Collector(env, self.policy, frames_per_batch=cfg.train.frames_per_batch, total_frames=-1,
                                   device=device, auto_register_policy_transforms=False)
        self._batches = iter(self.collector)

    def where(self) -> dict:
        """This actor's process and node, for fault messages and the placement test."""
        import socket

        node = ""
        try:
            import ray

            node = ray.get_runtime_context().get_node_id()
        except Exception:
            pass
        return {"pid": os.getpid(), "host": socket.gethostname(), "node_id": node}

    def collect(self, weights: TensorDictBase | None, version: int, temperature: float) -> TensorDictBase:
        if weights is not None and version != self.policy.weights_version:
            self.policy.load_published_weights(unpack_weights(weights), version)
        self.search.config.temperature = float(temperature)
        with torch.no_grad():
            return next(self._batches)

    def close(self) -> None:
        self.collector.shutdown()


class EvaluatorActor:
    """One evaluator: greedy episodes on the immutable snapshot it is handed (see ``evaluator.py``).

    Examples:
        >>> import torch
        >>> from torchrl_muzero.trainers.config import config_to_dict, load_config
        >>> # built in this process, not a Ray worker: keep this process's priority and thread count
        >>> cfg = load_config({"eval": {"num_episodes": 1}, "env": {"max_episode_steps": 5},
        ...                    "model": {"latent_dim": 8, "hidden_dim": 8}, "mcts": {"num_simulations": 2},
        ...                    "async_pipeline": {"actor_niceness": 0, "evaluator_num_cpus": torch.get_num_threads()}})
        >>> actor = EvaluatorActor(config_to_dict(cfg), 0, (4,), 2)
        >>> returns, stats = actor.evaluate(actor.model.state_dict())
        >>> len(returns), returns[0] <= 5
        (1, True)
    """

    def __init__(self, cfg_dict: dict, index: int, observation_shape, action_space) -> None:
        from torchrl_muzero.envs import make_env
        from torchrl_muzero.trainers.builders import algorithm, mcts_config

        cfg = load_config(cfg_dict)
        yield_to_learner(cfg.async_pipeline.actor_niceness)
        torch.set_num_threads(max(1, cfg.async_pipeline.evaluator_num_cpus))
        device = "cuda" if cfg.async_pipeline.evaluator_num_gpus > 0 else "cpu"
        self.cfg = cfg
        self.model = build_model(cfg, observation_shape, action_space).to(device).eval()
        self.env = make_env(cfg.env, num_envs=cfg.eval.num_episodes, seed=cfg.seed + 10_000 + index, training=False)
        self.mcts = mcts_config(cfg, temperature=0.0, num_simulations=cfg.eval.num_simulations or
                                cfg.mcts.num_simulations)
        self.algo = algorithm(cfg)

    def where(self) -> dict:
        return {"pid": os.getpid()}

    def evaluate(self, weights: dict) -> tuple:
        from torchrl_muzero.trainers.evaluation import evaluate_with_stats

        self.model.load_state_dict(weights)
        return evaluate_with_stats(self.model, self.env, self.mcts, self.cfg.env, search_fn=self.algo.search_fn,
                                   memory=self.algo.acting_memory(self.cfg))
