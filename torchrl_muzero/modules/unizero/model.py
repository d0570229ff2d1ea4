"""UniZero's world model (arXiv 2406.10667): encoder + causal transformer + heads, with an exact KV cache.

Sequence. An episode is the interleaved token sequence
``[z_0, a_0, z_1, a_1, ...]``: ``z_t`` is the encoder's latent of observation
``t`` (one token), ``a_t`` the action's embedding. Slot ``2t`` holds ``z_t``,
slot ``2t + 1`` holds ``a_t``; the slot is the token's position. Heads read
the transformer output

* at an action token ``a_t``: the reward of that step and the next latent
  ``z_{t+1}`` (projected, then normalised like the encoder's output);
* at a latent token ``z_t``: the policy logits and the value.

There is no separate dynamics network: the dynamics is the next-token
prediction at action tokens.

Search state. Each tree node's state (the search stores it without looking
inside) is a TensorDict of batch ``[B]``:

* ``latents [B, max_blocks, E]`` and ``actions [B, max_blocks]`` (``-1`` where
  unused): the raw tokens of the whole context of that node, i.e. the root's
  history window followed by the path from the root;
* ``length [B]``: tokens in use (a node always ends with its own latent, so
  ``length`` is odd and the node's latent is ``latents[(length - 1) // 2]``);
* ``kv [B, max_tokens, num_layers, 2, H, Dh]`` (``kv_cache=True`` only): keys
  and values of those tokens at slots ``0 .. length - 1``, right-padded.

Why the cache is exact. :meth:`UniZeroModel.search_step` copies its parent's
buffers and appends two tokens at slots ``length`` and ``length + 1``: the
action token (-> reward, next latent) and the predicted latent token (->
policy, value). Every slot below ``length`` holds a token of this node's own
context, written by its ancestors (each node owns its copy, so siblings and
other roots never share or overwrite one), and the attention reads exactly
the slots ``<=`` the query's slot: that is the computation of a full causal
forward over the same tokens, only with different matrix shapes (float
rounding). The cache is located by construction (it *is* the node state, per
env row and per tree node); there is no lookup, so there is no miss, and no
hash of a float latent anywhere.

Cost of the design. Every node owns its context: ``max_tokens * num_layers *
2 * embed_dim`` floats of keys/values plus ``max_blocks * embed_dim`` of raw
latents (CartPole sizes: ~23 KB per node, ~9 MB for 8 roots of 50
simulations; embed 768: ~280 KB per node, ~2.2 GB for 160 roots), and each
expansion copies its parent's context once. The alternative (each node stores
only its two new tokens and the step gathers its ancestors' tokens through
parent pointers) needs the tree's node indices, which the search does not hand
to the model; this design stays inside the ``search_step(state, action)``
contract with nothing kept on the module between calls.

Context limit. A node's context holds at most ``max_blocks`` latents
(``max_tokens = 2 * max_blocks`` slots). A step from a node that already
holds ``max_blocks`` latents either raises (``on_overflow="error"``) or, by
default (``"rebuild"``), first slides that node's context to its last
``context_length + 1`` latents (a root-sized window: the last
``context_length`` transitions and the node's latent), recomputes its keys and
values from those raw tokens at positions ``0 ..`` (a full forward, so exact),
then appends. The outputs equal a full forward over the slid window plus the
two new tokens; history beyond ``max_blocks`` is dropped explicitly by this
documented rule, never by a cache miss.

``kv_cache=False`` computes the same outputs without a cache: every step runs
a full forward over the node's whole context (twice: for the action token,
then for the new latent token). It exists as the reference and the baseline
of benchmarks/test_unizero_search_bench.py.

Fused search. With the C++ kernel on CPU the search runs every simulation in
one call (:mod:`.fused`, ``csrc/unizero_net.h``), this step's arithmetic in
either mode; there each node computes only its own two tokens' keys/values
and reads its ancestors' through the tree's parent links (the same cache,
keyed by tree node, without the per-expansion copy); a node's buffer there holds
its own slots only, and :func:`~.node_states.complete_node_states` rebuilds this
layout on demand (the search itself never needs it). The root's window forward runs in the
same kernel (:meth:`root_from_latents`); the encoder stays in torch.
"""
from __future__ import annotations

from typing import Sequence

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule
from torch import nn

from torchrl_muzero.modules.fused_spec import FusedSpec
from torchrl_muzero.modules.model import MuZeroModel
from torchrl_muzero.modules.step import ModelStep
from torchrl_muzero.modules.support import CategoricalSupport
from torchrl_muzero.modules.unizero.actions import (action_embedding, action_shape, check_action_dim,
                                                    check_actions, no_actions, pack_actions)
from torchrl_muzero.modules.unizero.encoder import MLPEncoder
from torchrl_muzero.modules.unizero.fused import (UZ_NODE_STATE, fused_root_from_leaves, fused_root_window,
                                                  fused_unizero_weights)
from torchrl_muzero.modules.unizero.norm import make_latent_norm
from torchrl_muzero.modules.unizero.transformer import CausalTransformer, head_mlp

__all__ = ["UniZeroModel"]

_OVERFLOW = ("rebuild", "error")
_VALID_MESSAGE = (
    "valid must be [B, K + 1] = [{B}, {K1}] bool, False only as a prefix of each row "
    "and True at the current (last) step."
)


class _Unroll(nn.Module):
    def __init__(self, model: "UniZeroModel") -> None:
        super().__init__()
        self._model = [model]  # a list so the model is not registered inside itself

    def forward(self, observation, action):
        out = self._model[0].unroll(observation, action)
        return out["latent"], out["policy_logits"], out["value_logits"], out["reward_logits"], out["next_latent"]


class UniZeroModel(nn.Module):
    """UniZero's world model over ``[z_0, a_0, z_1, ...]`` with the search interface of :class:`ModelStep`.

    Args:
        observation_shape: shape of one observation.
        num_actions: discrete actions (the policy head's width; with ``action_dim``, its ``2 * D``).
        embed_dim / num_layers / num_heads: the transformer (LightZero's
            CartPole: 64 / 2 / 2).
        context_length: history steps ``[z, a]`` a root sees before its own
            latent (4 -> 9 tokens), and the window a rebuild keeps.
        max_blocks: latents a context may hold (``max_tokens = 2 * max_blocks``).
        position: ``"rope"`` (LightZero's CartPole) or ``"absolute"``.
        latent_norm / simnorm_dim: ``"simnorm"`` or ``"layernorm"`` at the
            encoder's output and at the predicted next latent.
        value_support_size / reward_support_size: half-widths of the
            categorical supports (50 -> 101 bins, LightZero's default).
        encoder: a module ``[N, *observation_shape] -> [N, embed_dim]``
            (e.g. :class:`~torchrl_muzero.modules.unizero.ResNetEncoder`);
            default an :class:`~torchrl_muzero.modules.unizero.MLPEncoder`
            with ``encoder_hidden_dim``.
        kv_cache: search with the KV cache (``False``: full recompute per
            step, same outputs).
        on_overflow: ``"rebuild"`` or ``"error"`` (module docstring).
        mlp_ratio: the blocks' MLP width over ``embed_dim``.
        action_dim: ``None`` (default): discrete actions, indices embedded by
            a table (``nn.Embedding(num_actions, embed_dim)``); ``D``: float
            actions ``[D]`` (a box), their token a linear map
            ``nn.Linear(D, embed_dim)`` (LightZero's sampled UniZero), and
            ``num_actions`` is only the policy head's width (``2 * D`` for
            :class:`~torchrl_muzero.modules.sampled.SampledModel`'s
            tanh-normal). Node states then hold ``actions [B, max_blocks, D]``
            (zeros where unused) and the fused C++ search is off (it looks
            actions up in the table).
        zero_init_heads: start the value, reward and policy heads' last
            layer at zero (``False``, the default: GPT-initialised like the
            rest of the world model). Zeroed heads give an untrained model
            equal Q for every action (with GPT-initialised heads the search's
            min-max normalisation turns their +-0.02 into a full-range Q gap:
            ~13 of 16 root visits on one action), but they learned CartPole
            2-4x slower in the async and sync pipelines, and zeroing only
            value and reward (LightZero's ``_initialize_last_layer``) did not
            solve it by 20k env steps (docs/variants.md, "CartPole-v1 per
            algorithm").

    Training: :meth:`forward` ``(latents [B, T, E], actions [B, T])`` and
    :meth:`unroll` ``(observations [B, T, ...], actions [B, T])`` give a
    TensorDict ``[B, T]`` of ``policy_logits``, ``value_logits`` (at ``z_t``),
    ``reward_logits`` and ``next_latent`` (at ``a_t``). ``model.sequence`` is
    the same as a ``TensorDictModule`` reading ``"observation"`` and
    ``"action"`` of a ``[B, T]`` TensorDict.

    Search: :meth:`search_root` / :meth:`root_from_latents` and
    :meth:`search_step`, for :func:`~torchrl_muzero.mcts.search.muzero_search`.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.mcts import MCTSConfig
        >>> from torchrl_muzero.mcts.search import muzero_search
        >>> from torchrl_muzero.modules.unizero import UniZeroModel
        >>> model = UniZeroModel((4,), 2, embed_dim=16, num_heads=2, context_length=2, max_blocks=5,
        ...                      value_support_size=5, reward_support_size=5)
        >>> out = model(torch.softmax(torch.randn(3, 4, 16), -1), torch.randint(2, (3, 4)))
        >>> out["policy_logits"].shape, out["next_latent"].shape
        (torch.Size([3, 4, 2]), torch.Size([3, 4, 16]))
        >>> from tensordict import TensorDict
        >>> td = model.sequence(TensorDict({"observation": torch.randn(3, 4, 4),
        ...                                 "action": torch.randint(2, (3, 4))}, [3, 4]))
        >>> td["latent"].shape, td["reward_logits"].shape
        (torch.Size([3, 4, 16]), torch.Size([3, 4, 11]))
        >>> obs = torch.randn(3, 3, 4)                   # [B, context_length + 1, *obs]: history + now
        >>> past_actions = torch.randint(2, (3, 2))
        >>> valid = torch.tensor([[True, True, True], [False, True, True], [False, False, True]])
        >>> root = model.search_root(obs, past_actions, valid)
        >>> root.state["length"]                         # tokens per row: ragged history
        tensor([5, 3, 1])
        >>> child = model.search_step(root.state, torch.tensor([0, 1, 1]))
        >>> child.state["length"], child.reward.shape
        (tensor([7, 5, 3]), torch.Size([3]))
        >>> result = muzero_search(model, root, MCTSConfig(num_simulations=8, backend="torch"))
        >>> result.visit_counts.sum(-1)
        tensor([8, 8, 8])
    """

    check_observation = MuZeroModel.check_observation  # the same shape check and message as every model
    policy_distribution = MuZeroModel.policy_distribution  # the categorical policy of every model

    def __init__(
        self,
        observation_shape: Sequence[int],
        num_actions: int,
        embed_dim: int = 64,
        num_layers: int = 2,
        num_heads: int = 2,
        context_length: int = 4,
        max_blocks: int = 10,
        position: str = "rope",
        latent_norm: str = "simnorm",
        simnorm_dim: int = 8,
        value_support_size: int = 50,
        reward_support_size: int = 50,
        encoder: nn.Module | None = None,
        encoder_hidden_dim: int = 128,
        kv_cache: bool = True,
        on_overflow: str = "rebuild",
        mlp_ratio: int = 4,
        zero_init_heads: bool = False,
        action_dim: int | None = None,
    ) -> None:
        super().__init__()
        if int(num_actions) < 1:
            raise ValueError(f"num_actions must be >= 1, got {num_actions}.")
        check_action_dim(action_dim)
        if context_length < 0 or context_length + 2 > max_blocks:
            raise ValueError(
                f"need 0 <= context_length and context_length + 2 <= max_blocks (a root window plus one "
                f"step must fit), got context_length={context_length}, max_blocks={max_blocks}."
            )
        if on_overflow not in _OVERFLOW:
            raise ValueError(f"on_overflow must be one of {_OVERFLOW}, got {on_overflow!r}.")
        self.observation_shape = torch.Size(observation_shape)
        self.num_actions = int(num_actions)
        self.action_dim = action_dim
        self.embed_dim = int(embed_dim)
        self.context_length = int(context_length)
        self.max_blocks = int(max_blocks)
        self.max_tokens = 2 * self.max_blocks
        self.kv_cache = bool(kv_cache)
        self.on_overflow = on_overflow
        self.value_support = CategoricalSupport(value_support_size)
        self.reward_support = CategoricalSupport(reward_support_size)

        self.transformer = CausalTransformer(embed_dim, num_layers, num_heads, self.max_tokens, position, mlp_ratio)
        self.action_embedding = action_embedding(self.num_actions, action_dim, embed_dim)
        self.latent_head = head_mlp(embed_dim, embed_dim)
        self.reward_head = head_mlp(embed_dim, self.reward_support.num_bins)
        self.policy_head = head_mlp(embed_dim, self.num_actions)
        self.value_head = head_mlp(embed_dim, self.value_support.num_bins)
        self.apply(self._init_weights)  # GPT initialisation for the world model, before the encoder exists
        if zero_init_heads:  # an untrained model values every action alike (docstring: why it is off)
            for head in (self.value_head, self.reward_head, self.policy_head):
                nn.init.zeros_(head[-1].weight)
                nn.init.zeros_(head[-1].bias)
        self.latent_norm = make_latent_norm(latent_norm, embed_dim, simnorm_dim)
        self.encoder = encoder if encoder is not None else MLPEncoder(
            observation_shape, embed_dim, encoder_hidden_dim, latent_norm=latent_norm, simnorm_dim=simnorm_dim
        )
        self.sequence = TensorDictModule(
            _Unroll(self), in_keys=["observation", "action"],
            out_keys=["latent", "policy_logits", "value_logits", "reward_logits", "next_latent"],
        )

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    # -- tokens and heads --------------------------------------------------------------
    def encode(self, observation: torch.Tensor) -> torch.Tensor:
        """``[*batch, *observation_shape]`` -> latent tokens ``[*batch, embed_dim]``."""
        batch = self.check_observation(observation)
        flat = observation.reshape(-1, *self.observation_shape)
        return self.encoder(flat).reshape(*batch, self.embed_dim)

    def _tokens(self, latents: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
        """``[B, n, E]``, ``[B, n(, D)]`` -> the interleaved ``[B, 2n, E]`` (unused actions ``-1`` embed as 0's)."""
        if self.action_dim is None:
            act = self.action_embedding(actions.clamp_min(0))
        else:  # float actions (unused ones zeros): only causality keeps an unused token from mattering
            act = self.action_embedding(actions.to(latents.dtype))
        return torch.stack([latents, act.to(latents.dtype)], dim=2).flatten(1, 2)

    def _full(self, latents: torch.Tensor, actions: torch.Tensor, num_tokens: int):
        """A causal forward over the first ``num_tokens`` slots of every row: ``(h [B, T, E], kv)``."""
        x = self._tokens(latents, actions)[:, :num_tokens]
        slots = torch.arange(num_tokens, device=x.device).expand(x.shape[0], -1)
        return self.transformer(x, slots)

    def _action_heads(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """At an action token: ``(reward_logits, next_latent)``."""
        return self.reward_head(h), self.latent_norm(self.latent_head(h))

    def _latent_heads(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """At a latent token: ``(policy_logits, value_logits)``."""
        return self.policy_head(h), self.value_head(h)

    # -- training ----------------------------------------------------------------------
    def forward(self, latents: torch.Tensor, actions: torch.Tensor) -> TensorDict:
        """Full causal forward over ``[z_0, a_0, ..., z_{T-1}, a_{T-1}]`` (``T <= max_blocks``).

        Returns a TensorDict ``[B, T]``: ``policy_logits`` and ``value_logits``
        read at ``z_t``; ``reward_logits`` and ``next_latent`` (the prediction
        of ``z_{t+1}``) read at ``a_t``.
        """
        B, T = actions.shape[:2]
        check_actions(self, actions, (B, T), "actions")
        if latents.shape != (B, T, self.embed_dim):
            raise ValueError(
                f"latents must be [B, T, {self.embed_dim}] with actions [B, T] = {tuple(actions.shape)}, "
                f"got {tuple(latents.shape)}."
            )
        if T > self.max_blocks:
            raise ValueError(f"T={T} steps is more than max_blocks={self.max_blocks}.")
        h, _ = self._full(latents, actions.long() if self.action_dim is None else actions, 2 * T)
        policy_logits, value_logits = self._latent_heads(h[:, 0::2])
        reward_logits, next_latent = self._action_heads(h[:, 1::2])
        return TensorDict(
            {"policy_logits": policy_logits, "value_logits": value_logits,
             "reward_logits": reward_logits, "next_latent": next_latent},
            batch_size=[B, T],
        )

    def unroll(self, observations: torch.Tensor, actions: torch.Tensor) -> TensorDict:
        """:meth:`forward` on encoded ``observations [B, T, *observation_shape]``; adds ``latent``."""
        latents = self.encode(observations)
        out = self.forward(latents, actions)
        out["latent"] = latents
        return out

    # -- search ------------------------------------------------------------------------
    def _decode(self, reward_logits, value_logits):
        return self.reward_support.decode_fast(reward_logits), self.value_support.decode_fast(value_logits)

    @torch.no_grad()
    def initial_inference(self, observation: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``observation [B, *obs]`` (no history) -> ``(latent, policy_logits, value_logits)``."""
        latent = self.encode(observation)
        no_action = no_actions(self, (latent.shape[0], 1), latent.device)
        h, _ = self._full(latent[:, None], no_action, 1)
        policy_logits, value_logits = self._latent_heads(h[:, 0])
        return latent, policy_logits, value_logits

    @torch.no_grad()
    def search_root(
        self,
        observation: torch.Tensor,
        actions: torch.Tensor | None = None,
        valid: torch.Tensor | None = None,
        *,
        _keep_cache: bool = True,
    ) -> ModelStep:
        """Root of a search from ``observation [B, *obs]`` alone or a window ``[B, K + 1, *obs]``.

        A window holds the last ``K <= context_length`` observations before
        the current one and the current one last; ``actions [B, K]`` the
        actions taken after each of the first ``K``; ``valid [B, K + 1]``
        (default all True) marks real steps, False only as a prefix (rows
        near an episode start). See :meth:`root_from_latents`.
        """
        batch = self.check_observation(observation)
        if len(batch) == 1:
            if actions is not None and actions.numel():
                raise ValueError("search_root got actions without a history window of observations.")
            latents = self.encode(observation)[:, None]
            actions = no_actions(self, (latents.shape[0], 0), latents.device)
        elif len(batch) == 2:
            latents = self.encode(observation)
            if actions is None:
                raise ValueError("search_root with an observation window [B, K + 1, ...] needs actions [B, K].")
        else:
            raise ValueError(
                f"search_root expects observations [B, *obs] or [B, K + 1, *obs] with obs = "
                f"{tuple(self.observation_shape)}, got {tuple(observation.shape)}."
            )
        return self.root_from_latents(latents, actions, valid, _keep_cache=_keep_cache)

    @torch.no_grad()
    def root_value(
        self,
        observation: torch.Tensor,
        actions: torch.Tensor | None = None,
        valid: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The value ``[B]`` :meth:`search_root` gives its root, without building the root's node state.

        Why it exists: the learner's value bootstrap asks for the values of
        hundreds of history-window roots per update and reads nothing else;
        with ``kv_cache=True`` the node state would hold every window's
        keys/values (~13 MB at batch 64 on CartPole), allocated, zeroed and
        written for nothing. The forward is the same, so the value is
        :meth:`search_root`'s bit for bit.

        Examples:
            >>> import torch
            >>> from torchrl_muzero.modules.unizero import UniZeroModel
            >>> model = UniZeroModel((4,), 2, embed_dim=16, num_heads=2, context_length=2, max_blocks=5)
            >>> window, actions = torch.randn(3, 3, 4), torch.randint(2, (3, 2))
            >>> value = model.root_value(window, actions)
            >>> torch.equal(value, model.search_root(window, actions).value)
            True
        """
        return self.search_root(observation, actions, valid, _keep_cache=False).value

    @torch.no_grad()
    def root_from_latents(
        self, latents: torch.Tensor, actions: torch.Tensor, valid: torch.Tensor | None = None, *,
        _keep_cache: bool = True,
    ) -> ModelStep:
        """Root from a latent window ``[B, K + 1, E]``, ``actions [B, K]`` and ``valid [B, K + 1]``.

        Each row's valid steps are packed to slots ``0 ..`` (so positions start
        at 0 for every row, whatever its history length), one full forward
        gives the keys/values of the window and the root's policy and value
        at its last latent. (``_keep_cache=False``: the state gets no keys /
        values, for :meth:`root_value`, which returns only the value.) The
        forward runs in the C++ kernel when it runs this model, except inside
        :func:`~torchrl_muzero.modules.unizero.fused.use_kernel` ``(False)``
        (what a ``backend="torch"`` search sets): then in torch.
        """
        keep_cache = self.kv_cache and _keep_cache
        B, K1, E = latents.shape
        K = K1 - 1
        if E != self.embed_dim or K < 0 or actions.shape != (B, K, *action_shape(self)):
            raise ValueError(
                f"root_from_latents expects latents [B, K + 1, {self.embed_dim}] and actions "
                f"{[B, K, *action_shape(self)]}, got "
                f"{tuple(latents.shape)} and {tuple(actions.shape)}."
            )
        if K > self.context_length:
            raise ValueError(
                f"the history window has K={K} steps, more than context_length={self.context_length}; "
                "pass only the last context_length steps."
            )
        if actions.numel() and self.action_dim is None:
            low, high = torch.aminmax(actions)  # one op for both bounds: this runs before every search
            if int(low) < 0 or int(high) >= self.num_actions:
                raise ValueError(f"history actions must lie in [0, {self.num_actions}).")
        device = latents.device
        if valid is not None:
            valid = valid.to(device=device, dtype=torch.bool)
            if valid.shape != (B, K1):
                raise ValueError(_VALID_MESSAGE.format(B=B, K1=K1))
            if bool(valid.all()):  # every row holds a full window: nothing to pack
                valid = None
        if valid is None:  # the state and the root's forward in one C++ call when the kernel runs this model
            fused = fused_root_window(self, latents, actions, keep_cache)
            if fused is not None:
                state_latents, state_actions, length, kv, policy_logits, value = fused
                leaves = {"latents": state_latents, "actions": state_actions, "length": length}
                if kv is not None:
                    leaves["kv"] = kv
                return ModelStep(TensorDict(leaves, [B]), torch.zeros_like(value), policy_logits, value)
        state_latents = latents.new_zeros(B, self.max_blocks, E)
        state_actions = no_actions(self, (B, self.max_blocks), device)
        if valid is None:
            # Full windows (the common case, and every row of a B = 1 search past an episode's
            # first steps): the packing below is the identity, so copy without its ~15 small ops.
            state_latents[:, :K1] = latents
            state_actions[:, :K] = actions
            length = torch.full((B,), 2 * K1 - 1, dtype=torch.long, device=device)
        else:
            steps = torch.arange(K1, device=device)
            missing = (~valid).sum(1)
            if not bool((valid == (steps[None] >= missing[:, None])).all()):
                raise ValueError(_VALID_MESSAGE.format(B=B, K1=K1))
            n = K1 - missing  # latents per row
            src = (steps[None] + missing[:, None]).clamp(max=K)
            packed = latents.gather(1, src[..., None].expand(B, K1, E)) * (steps[None] < n[:, None])[..., None]
            state_latents[:, :K1] = packed
            if K:
                state_actions[:, :K] = pack_actions(self, actions, src[:, :K].clamp(max=K - 1),
                                                    steps[None, :K] < (n - 1)[:, None])
            length = 2 * n - 1
        leaves = {"latents": state_latents, "actions": state_actions, "length": length}
        kv = self.transformer.empty_cache(B) if keep_cache else None
        if kv is not None:
            leaves["kv"] = kv
        state = TensorDict(leaves, [B])
        # the same forward in one C++ call when the kernel runs this model
        fused = fused_root_from_leaves(self, state_latents, state_actions, length, kv)
        if fused is not None:
            policy_logits, value = fused
            return ModelStep(state, torch.zeros_like(value), policy_logits, value)
        h, kv = self._full(state_latents, state_actions, 2 * K + 1)
        if keep_cache:
            in_use = torch.arange(2 * K + 1, device=device)[None] < length[:, None]
            state["kv"][:, : 2 * K + 1] = kv * in_use[:, :, None, None, None, None]
        rows = torch.arange(B, device=device)
        policy_logits, value_logits = self._latent_heads(h[rows, length - 1])
        value = self.value_support.decode_fast(value_logits)
        return ModelStep(state, torch.zeros_like(value), policy_logits, value)

    def _slide(self, over, latents, actions, kv, length):
        """Rows ``over`` hold ``max_blocks`` latents: keep their last ``context_length + 1``, rebuild exactly."""
        if self.on_overflow == "error":
            raise RuntimeError(
                f"UniZeroModel: a search path reached max_blocks={self.max_blocks} latents "
                f"(max_tokens={self.max_tokens}) and on_overflow='error'; raise max_blocks, search "
                "shallower, or use on_overflow='rebuild' (slide to the last context_length steps)."
            )
        idx = over.nonzero().squeeze(1)
        keep = self.context_length + 1
        drop = self.max_blocks - keep  # every overflowing row holds exactly max_blocks latents
        new_latents = torch.zeros_like(latents[idx])
        new_latents[:, :keep] = latents[idx, drop:]
        new_actions = torch.full_like(actions[idx], -1 if self.action_dim is None else 0)
        new_actions[:, : keep - 1] = actions[idx, drop : self.max_blocks - 1]
        latents[idx], actions[idx] = new_latents, new_actions
        length[idx] = 2 * keep - 1
        if kv is not None:
            _, window_kv = self._full(new_latents, new_actions, 2 * keep - 1)
            rebuilt = self.transformer.empty_cache(len(idx))
            rebuilt[:, : 2 * keep - 1] = window_kv
            kv[idx] = rebuilt

    @torch.no_grad()
    def search_step(self, state: TensorDictBase, action: torch.Tensor) -> ModelStep:
        """Expand ``B`` nodes: append ``action`` and the predicted latent to each parent's context.

        Two one-token passes per step: the action token (reward, next latent),
        then the predicted latent token (policy, value). Rows may sit at
        different depths: each writes at its own slots.
        """
        if not isinstance(state, TensorDictBase) or "length" not in state.keys():
            raise TypeError(
                f"UniZeroModel.search_step expects the TensorDict state of search_root / search_step, "
                f"got {type(state).__name__}."
            )
        latents, actions = state["latents"].clone(), state["actions"].clone()
        length = state["length"].clone()
        kv = state["kv"].clone() if self.kv_cache else None
        n = (length + 1) // 2
        over = n >= self.max_blocks
        if bool(over.any()):
            self._slide(over, latents, actions, kv, length)
            n = (length + 1) // 2
        B = length.shape[0]
        rows = torch.arange(B, device=length.device)
        action = action.long() if self.action_dim is None else action.to(latents.dtype).reshape(B, self.action_dim)
        actions[rows, n - 1] = action
        if kv is not None:
            h_action, _ = self.transformer(self.action_embedding(action)[:, None], length[:, None], kv)
            h_action = h_action[:, 0]
        else:
            h_action = self._full(latents, actions, int(length.max()) + 1)[0][rows, length]
        reward_logits, next_latent = self._action_heads(h_action)
        latents[rows, n] = next_latent
        if kv is not None:
            h_latent = self.transformer(next_latent[:, None], (length + 1)[:, None], kv)[0][:, 0]
        else:
            h_latent = self._full(latents, actions, int(length.max()) + 2)[0][rows, length + 1]
        policy_logits, value_logits = self._latent_heads(h_latent)
        reward, value = self._decode(reward_logits, value_logits)
        child = TensorDict({"latents": latents, "actions": actions, "length": length + 2}, [B])
        if kv is not None:
            child["kv"] = kv
        return ModelStep(child, reward, policy_logits, value)

    def fused_unizero_weights(self) -> tuple[list[torch.Tensor], list[int], list[float]] | None:
        """The C++ fused search's tensors for this model, or ``None`` when it cannot run it (:mod:`.fused`)."""
        return fused_unizero_weights(self)

    def fused_kernel_spec(self) -> FusedSpec | None:
        """The fused UniZero search (kernel entry ``"unizero"``) on :meth:`fused_unizero_weights`, or ``None``.

        The node state is :meth:`search_root`'s: ``latents``, ``actions``,
        ``length`` and, with ``kv_cache``, ``kv`` (:data:`.fused.UZ_NODE_STATE`).
        The tensors are :func:`.fused.fused_unizero_weights`'s cached ones.

        Examples:
            >>> from torchrl_muzero.modules.unizero import UniZeroModel
            >>> model = UniZeroModel((4,), 2, embed_dim=16, num_heads=2, context_length=2, max_blocks=5,
            ...                      kv_cache=False)
            >>> spec = model.fused_kernel_spec()
            >>> spec.kernel, [leaf.key for leaf in spec.node_state]
            ('unizero', ['latents', 'actions', 'length'])
        """
        fused = self.fused_unizero_weights()
        if fused is None:
            return None
        tensors, ints, floats = fused
        return FusedSpec("unizero", tensors, ints, floats, UZ_NODE_STATE if self.kv_cache else UZ_NODE_STATE[:3])

    @staticmethod
    def node_latent(state: TensorDictBase) -> torch.Tensor:
        """The latent token ``[B, E]`` of the nodes whose states are ``state``."""
        rows = torch.arange(state.batch_size[0], device=state["length"].device)
        return state["latents"][rows, (state["length"] - 1) // 2]

    def extra_repr(self) -> str:
        dim = f"action_dim={self.action_dim}, " if self.action_dim is not None else ""
        return (f"observation_shape={tuple(self.observation_shape)}, num_actions={self.num_actions}, {dim}"
                f"context_length={self.context_length}, max_blocks={self.max_blocks}, "
                f"kv_cache={self.kv_cache}, on_overflow={self.on_overflow!r}")
