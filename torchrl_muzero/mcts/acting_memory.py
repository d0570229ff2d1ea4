"""What a policy remembers per env between steps: :class:`ActingMemory`.

Some of the family act from history, not from the current observation
alone: ``muzero_context`` rolls the root latent forward with the learned
dynamics, ``muzero_rnn_full_obs`` carries a GRU state, UniZero a window of
tokens. That state belongs to the env, not to the module: it lives in the
rollout TensorDict, declared by a torchrl
:class:`~torchrl.envs.transforms.TensorDictPrimer` (as torchrl's
``LSTMModule`` / ``GRUModule`` declare their recurrent states), so that

* a reset env gets the primer's zeros (the collector's own partial-reset
  handling: no per-env bookkeeping on the policy object, which LightZero keeps
  on the model with a fixed batch of 8 and a search that overwrites it);
* :class:`~torchrl_muzero.mcts.MCTSPolicy` reads the memory at ``key`` and
  writes the next one at ``("next", key)``, which the env carries into the
  next step (a primer key the policy set is not overwritten);
* any torchrl collector runs the policy: ``MultiAsyncCollector`` workers, a
  user's own loop. A collector built with
  ``auto_register_policy_transforms=True`` finds the primer itself (the memory
  is a submodule with ``make_tensordict_primer()``);
  :func:`with_acting_memory` adds it to an env by hand.

The search never writes the memory: the policy computes the next memory from
the root it searched and the action it took, after the search.
"""
from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn
from torchrl.data import Composite, Unbounded
from torchrl.envs import EnvBase, TransformedEnv
from torchrl.envs.transforms import TensorDictPrimer

from torchrl_muzero.modules.step import ModelStep

__all__ = ["ActingMemory", "ContextLatentMemory", "RecurrentHiddenMemory", "with_acting_memory"]


class ActingMemory(nn.Module):
    """Per-env state a policy carries between env steps (the base of every history-carrying policy).

    Subclasses define :meth:`spec` (the entries, per env, without batch
    dimensions), :meth:`root` (the search root from the observation and the
    memory) and :meth:`advance` (the memory of the next step). It holds no
    per-env data itself: everything per env is in the TensorDicts it is given.

    Examples:
        >>> from torchrl_muzero.mcts.acting_memory import ContextLatentMemory
        >>> from torchrl_muzero.modules import MuZeroMLPModel
        >>> model = MuZeroMLPModel((4,), 2, latent_dim=8, hidden_dim=8)
        >>> memory = ContextLatentMemory(4).bind(model)
        >>> fresh = memory.zeros(3)  # three envs that just reset
        >>> sorted(fresh.keys()), fresh["context_latent"].shape
        (['context_latent', 'context_logits', 'context_step', 'context_value'], torch.Size([3, 8]))
        >>> type(memory.make_tensordict_primer()).__name__
        'TensorDictPrimer'
    """

    def spec(self, model) -> Composite:
        """The memory's entries for one env (shapes without batch dimensions)."""
        raise NotImplementedError

    @property
    def keys(self) -> list[str]:
        raise NotImplementedError

    def root(self, model, observation: torch.Tensor, memory: TensorDictBase) -> ModelStep:
        """The search root for ``observation [B, *obs]`` given each env's ``memory [B]``."""
        raise NotImplementedError

    def root_value(self, model, observation: torch.Tensor, memory: TensorDictBase) -> torch.Tensor:
        """The value ``[B]`` of :meth:`root`'s root.

        A hook for the learner's value bootstrap (``data.reanalyze.bootstrap_values``),
        which reads only this value: a memory whose root is costly to build
        in full overrides it (:class:`~torchrl_muzero.mcts.history_memory.HistoryWindowMemory`
        skips the root's K/V cache). It must return what ``root(...).value`` does.
        """
        return self.root(model, observation, memory).value

    def advance(self, model, root: ModelStep, action: torch.Tensor, memory: TensorDictBase) -> TensorDictBase:
        """The memory of the next step, after ``action [B]`` was taken from ``root``."""
        raise NotImplementedError

    def make_tensordict_primer(self, model=None) -> TensorDictPrimer:
        """The primer that declares the memory's entries to an env (zeros at reset).

        torchrl's collectors call ``make_tensordict_primer()`` on every
        submodule of a policy when ``auto_register_policy_transforms=True``;
        the memory answers for the model it was bound to (:meth:`bind`).
        """
        model = model if model is not None else self._bound_model()
        return TensorDictPrimer(self.spec(model), default_value=0, expand_specs=True)

    def zeros(self, batch_size, model=None) -> TensorDictBase:
        """The memory of ``batch_size`` envs that just reset (what the primer writes), for a loop without an env."""
        model = model if model is not None else self._bound_model()
        batch_size = torch.Size([batch_size] if isinstance(batch_size, int) else batch_size)
        return self.spec(model).expand(*batch_size, *self.spec(model).shape).zero()

    def bind(self, model) -> "ActingMemory":
        """Remember ``model`` for :meth:`make_tensordict_primer` (kept out of the module tree)."""
        self._model = [model]  # a list: the policy registers the model, not the memory
        return self

    def _bound_model(self):
        bound = getattr(self, "_model", None)
        if not bound:
            raise RuntimeError(f"{type(self).__name__}.make_tensordict_primer needs a model: bind(model) first.")
        return bound[0]

    def check(self, tensordict: TensorDictBase) -> None:
        """A clear error when the env does not carry the memory's entries."""
        missing = [key for key in self.keys if key not in tensordict.keys()]
        if missing:
            raise KeyError(
                f"{type(self).__name__}: the policy's input has no {missing}: this policy acts from per-env "
                "memory, so its env needs the memory's primer. Wrap the env with "
                "torchrl_muzero.mcts.acting_memory.with_acting_memory(env, policy), or build the collector with "
                "auto_register_policy_transforms=True."
            )


class ContextLatentMemory(ActingMemory):
    """``muzero_context``'s acting rule: the root latent rolled forward with the learned dynamics.

    At step ``t`` of an episode the root is ``h(o_t)`` (re-grounded from the
    observation) when ``t % context_length_init == 0``, and otherwise the
    model's step from the previous root along the action taken,
    ``g(root_{t-1}, a_{t-1})`` with its prior and value: so the root at ``t``
    is ``g^j(h(o_{t-j}), a_{t-j..t-1})`` with ``j = t mod context_length_init``.
    ``context_length_init = 1`` re-grounds every step: MuZero exactly.
    Training is MuZero's; only acting differs (UniZero paper, the
    "MuZero w/ Context" baseline; LightZero's ``muzero_context`` model).

    Entries: ``"context_latent"`` (the next root's latent), ``"context_logits"``
    ``[A]``, ``"context_value"`` and ``"context_step"`` (``(t + 1) mod
    context_length_init``; 0 after a reset, so the first step re-grounds).

    Examples:
        >>> import torch
        >>> from torchrl.envs import GymEnv
        >>> from torchrl_muzero.mcts import MCTSConfig, MCTSPolicy
        >>> from torchrl_muzero.mcts.acting_memory import ContextLatentMemory, with_acting_memory
        >>> from torchrl_muzero.modules import MuZeroMLPModel
        >>> model = MuZeroMLPModel((4,), 2, latent_dim=8, hidden_dim=8)
        >>> policy = MCTSPolicy(model, MCTSConfig(num_simulations=4), memory=ContextLatentMemory(3))
        >>> env = with_acting_memory(GymEnv("CartPole-v1"), policy)
        >>> td = policy(env.reset())
        >>> int(td["context_step"]), int(td["next", "context_step"])  # step 0 re-grounded; next is step 1
        (0, 1)
    """

    def __init__(self, context_length_init: int) -> None:
        super().__init__()
        if not isinstance(context_length_init, int) or isinstance(context_length_init, bool) or context_length_init < 1:
            raise ValueError(f"context_length_init must be an integer >= 1, got {context_length_init!r}.")
        self.context_length_init = context_length_init

    @property
    def keys(self) -> list[str]:
        return ["context_latent", "context_logits", "context_value", "context_step"]

    def spec(self, model) -> Composite:
        probe = model.search_root(torch.zeros(1, *model.observation_shape, device=_device(model)))
        if not isinstance(probe.state, torch.Tensor):
            raise TypeError(f"ContextLatentMemory rolls a latent tensor forward; {type(model).__name__}'s search "
                            f"state is a {type(probe.state).__name__}.")
        return Composite(
            context_latent=Unbounded(shape=probe.state.shape[1:], dtype=probe.state.dtype),
            context_logits=Unbounded(shape=(model.num_actions,), dtype=probe.policy_logits.dtype),
            context_value=Unbounded(shape=(), dtype=probe.value.dtype),
            context_step=Unbounded(shape=(), dtype=torch.int64),
        )

    def root(self, model, observation: torch.Tensor, memory: TensorDictBase) -> ModelStep:
        ground = memory["context_step"] == 0
        if bool(ground.all()):
            return model.search_root(observation)
        latent = memory["context_latent"].clone()
        logits = memory["context_logits"].clone()
        value = memory["context_value"].clone()
        if bool(ground.any()):
            fresh = model.search_root(observation[ground])
            latent[ground], logits[ground], value[ground] = fresh.state, fresh.policy_logits, fresh.value
        return ModelStep(latent, torch.zeros_like(value), logits, value)

    def advance(self, model, root: ModelStep, action: torch.Tensor, memory: TensorDictBase) -> TensorDictBase:
        B = action.shape[0]
        step = (memory["context_step"] + 1) % self.context_length_init
        if self.context_length_init == 1:  # every step re-grounds: the rolled latent is never read
            nxt = ModelStep(torch.zeros_like(root.state), root.reward, torch.zeros_like(root.policy_logits),
                            torch.zeros_like(root.value))
        else:
            nxt = model.search_step(root.state, action)
        return TensorDict({"context_latent": nxt.state, "context_logits": nxt.policy_logits,
                           "context_value": nxt.value, "context_step": step}, batch_size=[B])


class RecurrentHiddenMemory(ActingMemory):
    """``muzero_rnn_full_obs``'s acting rule: a GRU state per env, advanced along the real observations.

    At step ``t`` of an episode the root is ``(h(o_t), hidden_t)`` with its
    prediction ``f(h(o_t), hidden_t)``; after the action ``a_t`` the next state
    is the dynamics' ``hidden' = g(h(o_t), hidden_t, a_t)``: the GRU reads the
    encoded observation, not the latent it predicted (as the loss's teacher
    forcing trains it). ``hidden_t`` is zeros at the episode start (the
    primer's zeros) and whenever ``t % context_length_init == 0`` (LightZero's
    ``H_infer``), so the state never summarises more than
    ``context_length_init - 1`` steps. The search reads the root's state and
    never writes this memory. Needs a model with a GRU state
    (:class:`~torchrl_muzero.modules.rnn_full_obs.RNNFullObsModel`).

    Entries: ``"rnn_hidden"`` ``[rnn_hidden_size]`` (the next step's GRU state)
    and ``"rnn_step"`` (``(t + 1) mod context_length_init``; 0 after a reset).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from torchrl_muzero.mcts import MCTSConfig, MCTSPolicy
        >>> from torchrl_muzero.mcts.acting_memory import RecurrentHiddenMemory
        >>> from torchrl_muzero.modules.rnn_full_obs import RNNFullObsMLPModel
        >>> model = RNNFullObsMLPModel((4,), 2, latent_dim=8, hidden_dim=8, rnn_hidden_size=6)
        >>> policy = MCTSPolicy(model, MCTSConfig(num_simulations=4), memory=RecurrentHiddenMemory(2))
        >>> td = TensorDict({"observation": torch.randn(3, 4)}, [3]).update(policy.memory.zeros(3))
        >>> td = policy(td)
        >>> td["next", "rnn_hidden"].shape, td["next", "rnn_step"].tolist()
        (torch.Size([3, 6]), [1, 1, 1])
    """

    def __init__(self, context_length_init: int) -> None:
        super().__init__()
        if not isinstance(context_length_init, int) or isinstance(context_length_init, bool) or context_length_init < 1:
            raise ValueError(f"context_length_init must be an integer >= 1, got {context_length_init!r}.")
        self.context_length_init = context_length_init

    @property
    def keys(self) -> list[str]:
        return ["rnn_hidden", "rnn_step"]

    def spec(self, model) -> Composite:
        size = getattr(model, "rnn_hidden_size", None)
        if size is None or not getattr(model, "carries_hidden", False):
            raise TypeError(f"RecurrentHiddenMemory carries a GRU state; {type(model).__name__} has none "
                            "(use an RNNFullObsModel, algo=muzero_rnn_full_obs).")
        dtype = next(model.parameters()).dtype
        return Composite(rnn_hidden=Unbounded(shape=(int(size),), dtype=dtype),
                         rnn_step=Unbounded(shape=(), dtype=torch.int64))

    def root(self, model, observation: torch.Tensor, memory: TensorDictBase) -> ModelStep:
        # a window's first step starts from zeros whatever was carried (the primer gives zeros after a reset)
        ground = (memory["rnn_step"] == 0).unsqueeze(-1)
        hidden = torch.where(ground, 0.0, memory["rnn_hidden"])
        return model.search_root(observation, hidden=hidden)

    def advance(self, model, root: ModelStep, action: torch.Tensor, memory: TensorDictBase) -> TensorDictBase:
        B = action.shape[0]
        step = (memory["rnn_step"] + 1) % self.context_length_init
        if self.context_length_init == 1:  # every step starts from zeros: the GRU step is never read
            hidden = torch.zeros_like(root.state["hidden"])
        else:
            hidden = torch.where((step == 0).unsqueeze(-1), 0.0, model.next_hidden(root.state, action))
        return TensorDict({"rnn_hidden": hidden, "rnn_step": step}, batch_size=[B])


def _device(model) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


def with_acting_memory(env: EnvBase, policy) -> EnvBase:
    """``env`` with the primer of ``policy``'s acting memory, if it has one and the env lacks it.

    Idempotent: an env whose specs already hold the memory's entries (or a
    policy without memory) is returned as it is; otherwise a new
    :class:`~torchrl.envs.TransformedEnv` wraps it (the caller's env is not
    changed).
    """
    memory = getattr(policy, "memory", None)
    if memory is None:
        return env
    have = set(env.full_observation_spec.keys(True, True)) | set(env.full_state_spec.keys(True, True))
    if set(memory.keys) <= have:
        return env
    return TransformedEnv(env, memory.make_tensordict_primer(policy.model), auto_unwrap=False)
