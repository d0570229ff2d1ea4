"""Sampled MuZero's search policy: MuZero's, over ``K`` actions drawn at each node.

A composition over the shared loop, as mctx composes its policies over one
``search()``: the root's ``K`` candidates are drawn here (with the search's
generator and the env's legal mask), the interior nodes draw their own in the
model's step (:class:`~torchrl_muzero.modules.sampled.SampledModel`), the
prior over a node's slots is the proposal's (the paper's
``(beta_hat / beta) * pi`` or uniform), and the rest is
:func:`~torchrl_muzero.mcts.search.muzero_search`: Dirichlet noise mixed into
the root's slot prior (the prior the pUCT score reads), pUCT, visit counts
over the slots. With a :class:`~torchrl_muzero.mcts.gumbel.GumbelMCTSConfig`
the rest is Gumbel MuZero's policy instead (EfficientZero V2's search of its
sampled candidates: Gumbel noise, Sequential Halving, the improved policy). The result's ``action`` is a root *slot*;
:class:`~torchrl_muzero.mcts.MCTSPolicy` hands the env that slot's action and
stores the root's candidates and visits.

:class:`SampledReanalysis` is the replay buffer's side: a reanalyze search
draws new root candidates, so the stored candidates of the reanalysed
positions are replaced with the ones the new policy target is over.
"""
from __future__ import annotations

from functools import partial
from typing import Any

import torch
from tensordict import TensorDict

from torchrl_muzero.mcts.config import MCTSConfig
from torchrl_muzero.mcts.gumbel import GumbelMCTSConfig, gumbel_muzero_search
from torchrl_muzero.mcts.loop import slot_candidates
from torchrl_muzero.mcts.search import SearchResult, muzero_search, search_observations
from torchrl_muzero.modules.step import ModelStep

__all__ = ["CANDIDATES_KEY", "VISITS_KEY", "SampledReanalysis", "sampled_root_search", "sampled_search"]

#: where :class:`~torchrl_muzero.mcts.MCTSPolicy` writes a root's candidates ``[K, *action]`` and their visits ``[K]``
CANDIDATES_KEY = ("root", "candidates")
VISITS_KEY = ("root", "candidate_visits")


def sampled_root_search(
    model,
    root: ModelStep,
    config: MCTSConfig,
    action_mask: torch.Tensor | None = None,
    two_player: bool = False,
    add_noise: bool = True,
    generator: torch.Generator | None = None,
    root_candidates: torch.Tensor | None = None,
) -> SearchResult:
    """Draw the root's ``K`` candidates (legal ones only, from ``action_mask [B, A]`` over the env's
    actions), then MuZero's policy over the slots (a :class:`~torchrl_muzero.mcts.gumbel.GumbelMCTSConfig`:
    Gumbel MuZero's, as EfficientZero V2 searches its sampled candidates); ``action`` is the chosen slot.
    Given ``root_candidates [B, K, *action]`` the root searches those instead of drawing (the interior
    nodes still draw).

    The slots a discrete root pads (fewer legal actions than ``K``) are masked
    for the noise and never selected (their logit is ``-inf``)."""
    node = model.sample_node(root, generator=generator, legal=action_mask, candidates=root_candidates)
    slot_legal = node.policy_logits > -torch.inf
    if isinstance(config, GumbelMCTSConfig):
        # EfficientZero V2's search: Gumbel noise and Sequential Halving over the K sampled root candidates,
        # the improved policy over the slots as the target
        return gumbel_muzero_search(model, node, config, slot_legal, two_player, add_noise, generator)
    return muzero_search(model, node, config, slot_legal, two_player, add_noise, generator)


@torch.no_grad()
def sampled_search(
    model,
    observation: torch.Tensor,
    config: MCTSConfig,
    action_mask: torch.Tensor | None = None,
    to_play: torch.Tensor | None = None,
    add_noise: bool = True,
    generator: torch.Generator | None = None,
    root: ModelStep | None = None,
    root_candidates: torch.Tensor | None = None,
) -> SearchResult:
    """Sampled MuZero's search for ``B`` observations (:func:`~torchrl_muzero.mcts.search`'s signature).

    ``model`` is a :class:`~torchrl_muzero.modules.sampled.SampledModel`;
    ``visit_counts`` / ``search_policy`` are over its ``K`` root slots, whose
    env actions are ``slot_candidates(model.slot_actions, result.tree.embeddings[:, 0], K)``
    (:func:`root_candidates`). ``root_candidates [B, K, *action]``: search these at the root instead
    of drawing new ones (a reanalyze that keeps the stored candidates).

    Examples:
        >>> import torch
        >>> from torchrl_muzero.envs.action_spaces import BoxActionSpace
        >>> from torchrl_muzero.mcts import MCTSConfig
        >>> from torchrl_muzero.mcts.sampled import root_candidates, sampled_search
        >>> from torchrl_muzero.modules import MuZeroMLPModel
        >>> from torchrl_muzero.modules.sampled import SampledModel
        >>> from torchrl_muzero.modules.sampled_proposal import SampledProposal
        >>> base = MuZeroMLPModel((3,), 2, latent_dim=8, hidden_dim=8, action_dim=1)
        >>> model = SampledModel(base, BoxActionSpace(-2.0, 2.0, (1,)), SampledProposal(num_samples=4))
        >>> g = torch.Generator().manual_seed(0)
        >>> out = sampled_search(model, torch.zeros(2, 3), MCTSConfig(num_simulations=8), generator=g)
        >>> out.visit_counts.sum(-1), root_candidates(model, out).shape
        (tensor([8, 8]), torch.Size([2, 4, 1]))
    """
    policy = sampled_root_search if root_candidates is None else partial(sampled_root_search,
                                                                         root_candidates=root_candidates)
    return search_observations(policy, "sampled_search", model, observation, config, action_mask,
                               to_play, add_noise, generator, root=root)


def root_candidates(model, result: SearchResult) -> torch.Tensor:
    """The env actions ``[B, K, *action]`` of a finished sampled search's root slots."""
    return slot_candidates(model.slot_actions, result.tree.embeddings[:, 0], result.visit_counts.shape[-1])


class SampledReanalysis:
    """The reanalyze search and the replay-entries hook of a sampled algorithm, sharing the new candidates.

    A reanalyze search draws new root candidates, and its policy target is over
    those. :meth:`search` is :func:`sampled_search` that keeps the candidates it
    drew (the buffer's ``reanalyze_search`` is
    ``muzero_reanalyze(config, search=reanalysis.search)``); :meth:`hook` (the
    buffer's ``reanalyze_entries``) writes them into the sampled batch at the
    reanalysed positions (the buffer calls the hook right after the search of
    the same sample, in the order of ``reanalyzed.nonzero()``), together with
    their new visit counts, so that each target and its candidates always come
    from the same search (LightZero's ``reanalyze_outdated``).

    ``keep_candidates=True`` (``algo.reanalyze_candidates=keep``) searches each
    position's *stored* candidates again instead of drawing new ones (the
    buffer hands them to :meth:`search` as ``stored=``: build the buffer's
    search with ``muzero_reanalyze(config, search=reanalysis.search,
    reads_stored=reanalysis.reads_stored)``); the new visits replace the
    stored ones, the candidates stay. Their prior is the current policy over
    that fixed set (:meth:`~torchrl_muzero.modules.sampled_proposal.SampledProposal.prior_at`):
    the proposal they were drawn from is not known any more.

    Examples:
        >>> from torchrl_muzero.data import muzero_reanalyze
        >>> from torchrl_muzero.mcts import MCTSConfig
        >>> from torchrl_muzero.mcts.sampled import SampledReanalysis
        >>> reanalysis = SampledReanalysis()
        >>> reanalyze_search = muzero_reanalyze(MCTSConfig(num_simulations=4), search=reanalysis.search)
        >>> callable(reanalyze_search), callable(reanalysis.hook)
        (True, True)
    """

    def __init__(self, keep_candidates: bool = False) -> None:
        if not isinstance(keep_candidates, bool):
            raise TypeError(f"SampledReanalysis: keep_candidates must be True or False, got {keep_candidates!r}.")
        self.keep_candidates = keep_candidates
        self._last: tuple[torch.Tensor, torch.Tensor] | None = None

    @property
    def reads_stored(self) -> bool:
        """Whether :meth:`search` needs the stored entries (``stored=``): with ``keep_candidates``."""
        return self.keep_candidates

    def search(self, model, observation: torch.Tensor, config: MCTSConfig, stored: TensorDict | None = None,
               **kwargs) -> SearchResult:
        """:func:`sampled_search` (same arguments), keeping the roots' candidates and visits for :meth:`hook`;
        with ``keep_candidates`` the root searches ``stored``'s candidates ``[n, K, *action]``."""
        if self.keep_candidates:
            if stored is None:
                raise ValueError("SampledReanalysis(keep_candidates=True).search needs stored= (the positions' "
                                 "stored entries): build the reanalyze search with reads_stored=True.")
            kwargs["root_candidates"] = stored.get(CANDIDATES_KEY)
        result = sampled_search(model, observation, config, **kwargs)
        self._last = (root_candidates(model, result).detach().cpu(), result.visit_counts.float().cpu())
        return result

    def hook(self, entries: TensorDict, info: Any) -> dict | None:
        """``reanalyze_entries``: the reanalysed positions' candidates and visits from the search just run."""
        reanalyzed = info.reanalyzed
        if not bool(reanalyzed.any()):
            return None
        if self._last is None:
            raise RuntimeError("SampledReanalysis: positions were reanalysed but its search did not run; the "
                               "buffer's reanalyze_search must be this object's .search.")
        candidates, visits = self._last
        self._last = None
        if candidates.shape[0] != int(reanalyzed.sum()):
            raise RuntimeError(f"SampledReanalysis: the search ran on {candidates.shape[0]} positions, the batch "
                               f"reanalysed {int(reanalyzed.sum())}.")
        new_candidates = entries.get(CANDIDATES_KEY).clone()
        new_visits = entries.get(VISITS_KEY).clone()
        new_candidates[reanalyzed] = candidates.to(new_candidates.dtype)
        new_visits[reanalyzed] = visits.to(new_visits.dtype)
        return {CANDIDATES_KEY: new_candidates, VISITS_KEY: new_visits}
