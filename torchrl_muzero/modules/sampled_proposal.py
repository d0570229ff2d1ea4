"""What the sampled MuZero family draws at an expanded node, and the search's prior over the drawn slots.

Sampled MuZero (Hubert et al. 2021, "Learning and Planning in Complex Action
Spaces") draws ``K`` actions from a proposal ``beta`` at each expanded node;
the node's edges are those ``K`` slots, and the pUCT prior over them is
``(beta_hat / beta) * pi`` normalised over the slots, ``beta_hat`` the
empirical distribution of the draws (each draw carrying mass ``1/K``).
:class:`SampledProposal` holds those choices and :meth:`SampledProposal.draw`
returns a node's candidates and the log of its unnormalised slot prior.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from torchrl_muzero.modules.policy_distribution import CategoricalPolicy, PolicyDistribution
from torchrl_muzero.modules.tanh_normal import TanhNormalPolicy

__all__ = ["SampledProposal"]

_PRIORS = ("paper", "uniform")


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


@dataclass(frozen=True)
class SampledProposal:
    """The proposal ``beta`` of the sampled family and the prior over the ``K`` drawn slots.

    Args:
        num_samples: ``K``, the slots drawn per expanded node.
        prior: ``"paper"``: the slot prior is ``(beta_hat / beta) * pi``
            normalised over the slots (Hubert et al.); ``"uniform"``: ``1/K``
            per slot (LightZero's choice: both of its C++ trees end up there).
        temperature: ``beta`` is ``pi`` at this temperature (categorical
            logits ``/ t``, tanh-normal scale ``* t``).
        replacement: discrete policies only: ``K`` i.i.d. draws (duplicates
            allowed) instead of ``K`` distinct actions. Continuous draws are
            always i.i.d.
        widened_fraction, widen_factor: continuous policies only
            (EfficientZero V2's proposal): ``m = round(widened_fraction * K)``
            of the draws come from ``pi`` with its scale times
            ``widen_factor``, the other ``K - m`` from ``beta``; ``beta`` is
            then the mixture ``((K-m)/K) beta + (m/K) pi_widened``.

    With ``beta = pi`` and continuous i.i.d. draws the paper's prior is
    exactly uniform (``beta_hat / beta * pi = 1/K`` per draw), so the two
    options differ only for a temperature other than 1, the widened mixture
    and discrete draws. LightZero uses uniform in both of its C++ trees.

    Discrete draws without replacement (Gumbel-top-k on ``beta``'s logits)
    are distinct legal actions. A row whose draw covers every action
    ``beta`` can draw (fewer such actions than ``K``, or exactly ``K``) gets
    ``pi`` itself over them (no importance correction: the set is not random);
    its remaining slots are padding (a legal action, slot logit ``-inf``,
    never selected). Otherwise each draw gets the per-draw ratio ``pi / beta``
    as if the draws were i.i.d.: an approximation, since the inclusion
    probabilities of a draw without replacement have no closed form.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.modules.sampled_proposal import SampledProposal
        >>> from torchrl_muzero.modules import CategoricalPolicy, TanhNormalPolicy
        >>> proposal = SampledProposal(num_samples=3)
        >>> proposal.describe()
        'sampled proposal: K=3, prior=paper, temperature=1.0, without replacement'
        >>> pi = CategoricalPolicy.from_logits(torch.log(torch.tensor([[0.5, 0.3, 0.2, 0.0]])))
        >>> g = torch.Generator().manual_seed(0)
        >>> candidates, slot_logits = proposal.draw(pi, generator=g)   # covers pi's 3 actions: prior = pi
        >>> candidates.sort(-1).values
        tensor([[0, 1, 2]])
        >>> torch.softmax(slot_logits, -1).sort(-1).values
        tensor([[0.2000, 0.3000, 0.5000]])
        >>> box = TanhNormalPolicy(torch.zeros(2, 1), torch.ones(2, 1), -2.0, 2.0)
        >>> candidates, slot_logits = SampledProposal(num_samples=5).draw(box, generator=g)
        >>> candidates.shape, slot_logits                               # beta = pi: uniform
        (torch.Size([2, 5, 1]), tensor([[0., 0., 0., 0., 0.],
                [0., 0., 0., 0., 0.]]))
    """

    num_samples: int = 20
    prior: str = "paper"
    temperature: float = 1.0
    replacement: bool = False
    widened_fraction: float = 0.0
    widen_factor: float = 3.0

    def __post_init__(self) -> None:
        def bad(field: str, value: object, allowed: str) -> ValueError:
            return ValueError(f"SampledProposal: {field} must be {allowed}, got {value!r}.")

        k = self.num_samples
        if not (isinstance(k, int) and not isinstance(k, bool) and k >= 1):
            raise bad("num_samples", k, "an integer >= 1")
        if self.prior not in _PRIORS:
            raise bad("prior", self.prior, 'one of "paper", "uniform"')
        if not (_is_number(self.temperature) and self.temperature > 0):
            raise bad("temperature", self.temperature, "a finite number > 0")
        if not isinstance(self.replacement, bool):
            raise bad("replacement", self.replacement, "True or False")
        if not (_is_number(self.widened_fraction) and 0.0 <= self.widened_fraction <= 1.0):
            raise bad("widened_fraction", self.widened_fraction, "a number in [0, 1]")
        if not (_is_number(self.widen_factor) and self.widen_factor > 0):
            raise bad("widen_factor", self.widen_factor, "a finite number > 0")

    @property
    def num_widened(self) -> int:
        """``m = round(widened_fraction * K)``: the draws from the widened policy (continuous only)."""
        return int(round(self.widened_fraction * self.num_samples))

    def describe(self) -> str:
        """One short line for logs.

        Examples:
            >>> from torchrl_muzero.modules.sampled_proposal import SampledProposal
            >>> SampledProposal(16, prior="uniform", widened_fraction=0.75).describe()
            'sampled proposal: K=16, prior=uniform, temperature=1.0, without replacement, widened 12/16 x3.0'
        """
        line = (
            f"sampled proposal: K={self.num_samples}, prior={self.prior}, temperature={self.temperature}, "
            f"{'with' if self.replacement else 'without'} replacement"
        )
        if self.num_widened:
            line += f", widened {self.num_widened}/{self.num_samples} x{self.widen_factor}"
        return line

    def draw(
        self,
        policy: PolicyDistribution,
        generator: torch.Generator | None = None,
        legal: torch.Tensor | None = None,
        proposal_policy: PolicyDistribution | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """A node's ``K`` candidates and the log of its unnormalised prior over them.

        Args:
            policy: ``pi``, the model's policy at the nodes, batch ``[...]``
                (``[B]`` in the search).
            generator: the search's generator (every draw goes through it).
            legal: discrete only, bool ``[..., A]`` (``None``: all legal).
            proposal_policy: overrides ``beta`` (then ``temperature`` is not
                used); same type and batch as ``policy``. A uniform
                categorical with ``K = A`` enumerates the actions.

        Returns:
            ``candidates``: ``[..., K]`` long action indices (categorical) or
            ``[..., K, D]`` env actions (tanh-normal); ``slot_logits [..., K]``:
            the search applies a softmax over them; ``-inf`` marks a slot the
            search must never select.

        Examples:
            >>> import torch
            >>> from torchrl_muzero.modules.sampled_proposal import SampledProposal
            >>> from torchrl_muzero.modules import CategoricalPolicy
            >>> pi = CategoricalPolicy.from_logits(torch.zeros(1, 4))
            >>> legal = torch.tensor([[True, False, True, False]])
            >>> g = torch.Generator().manual_seed(0)
            >>> candidates, slot_logits = SampledProposal(num_samples=3, prior="uniform").draw(pi, g, legal)
            >>> candidates[0, :2].sort().values, slot_logits          # 2 legal actions, 1 padding slot
            (tensor([0, 2]), tensor([[0., 0., -inf]]))
        """
        if proposal_policy is not None and type(proposal_policy) is not type(policy):
            raise TypeError(
                f"SampledProposal.draw: proposal_policy is a {type(proposal_policy).__name__}, "
                f"policy a {type(policy).__name__}."
            )
        if proposal_policy is not None and proposal_policy.batch_shape != policy.batch_shape:
            raise ValueError(
                f"SampledProposal.draw: proposal_policy batch {tuple(proposal_policy.batch_shape)} "
                f"differs from the policy's {tuple(policy.batch_shape)}."
            )
        if isinstance(policy, TanhNormalPolicy):
            if legal is not None:
                raise ValueError("SampledProposal.draw: legal masks apply to categorical policies only.")
            return self._draw_box(policy, generator, proposal_policy)
        if isinstance(policy, CategoricalPolicy):
            if self.num_widened:
                raise ValueError(
                    f"SampledProposal.draw: widened_fraction={self.widened_fraction} applies to "
                    "continuous (TanhNormalPolicy) policies only."
                )
            return self._draw_discrete(policy, generator, legal, proposal_policy)
        raise TypeError(f"SampledProposal.draw: no sampling rule for a {type(policy).__name__}.")

    def prior_at(self, policy: PolicyDistribution, candidates: torch.Tensor,
                 legal: torch.Tensor | None = None) -> torch.Tensor:
        """The slot logits ``[..., K]`` of *given* candidates (drawn earlier, by another policy): a reanalyze
        search that keeps a position's stored candidates (``algo.reanalyze_candidates=keep``).

        The proposal those candidates came from is not known any more, so the
        paper's correction ``beta_hat / beta`` cannot be formed: the stored set
        is searched as a fixed action set, whose prior is ``pi`` itself over it
        (``prior="paper"``: ``log pi(a_k)``, which the search's softmax
        normalises over the slots; for a discrete set, ``pi``'s logits, as for a
        drawn set that covers its node's actions); ``prior="uniform"``: ``1/K``.
        A discrete slot the search must never select gets ``-inf``: an action
        ``legal [..., A]`` forbids, and, without replacement, a repeat of an
        earlier slot's action (the padding :meth:`draw` writes).

        Examples:
            >>> import torch
            >>> from torchrl_muzero.modules.sampled_proposal import SampledProposal
            >>> from torchrl_muzero.modules import CategoricalPolicy
            >>> pi = CategoricalPolicy.from_logits(torch.log(torch.tensor([[0.5, 0.3, 0.2]])))
            >>> logits = SampledProposal(num_samples=3).prior_at(pi, torch.tensor([[2, 0, 2]]))  # slot 2: padding
            >>> torch.softmax(logits, -1)
            tensor([[0.2857, 0.7143, 0.0000]])
        """
        if candidates.shape[-1 if isinstance(policy, CategoricalPolicy) else -2] != self.num_samples:
            raise ValueError(f"SampledProposal.prior_at: {tuple(candidates.shape)} candidates, expected "
                             f"{self.num_samples} per node.")
        if isinstance(policy, TanhNormalPolicy):
            if legal is not None:
                raise ValueError("SampledProposal.prior_at: legal masks apply to categorical policies only.")
            if self.prior == "uniform":
                return torch.zeros(candidates.shape[:-1], dtype=torch.float32, device=candidates.device)
            return policy.log_prob(candidates)
        if not isinstance(policy, CategoricalPolicy):
            raise TypeError(f"SampledProposal.prior_at: no prior rule for a {type(policy).__name__}.")
        candidates = candidates.long()
        logits = policy.logits
        allowed = logits > -math.inf
        if legal is not None:
            allowed = allowed & legal.bool()
        valid = allowed.gather(-1, candidates)
        if not self.replacement:  # a repeated action is padding: only its first slot is searched
            earlier = candidates.unsqueeze(-1) == candidates.unsqueeze(-2)  # [..., K, K]: slot i == slot j
            valid = valid & ~torch.tril(earlier, diagonal=-1).any(-1)
        slot_logits = torch.zeros(candidates.shape, dtype=logits.dtype, device=logits.device) \
            if self.prior == "uniform" else logits.gather(-1, candidates)
        return slot_logits.masked_fill(~valid, -math.inf)

    # -- continuous --------------------------------------------------------------------------------
    def _draw_box(
        self, policy: TanhNormalPolicy, generator: torch.Generator | None, proposal: TanhNormalPolicy | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        k, m = self.num_samples, self.num_widened
        if proposal is None:
            # temperature 1: beta is pi itself, so log pi - log beta is exactly 0 (not rounding noise)
            proposal = policy if self.temperature == 1.0 else policy.with_scale(self.temperature)
        widened = policy.with_scale(self.widen_factor)
        parts = []
        if k - m:
            parts.append(proposal.sample(k - m, generator=generator))
        if m:
            parts.append(widened.sample(m, generator=generator))
        candidates = torch.cat(parts, dim=-2)
        if self.prior == "uniform" or (proposal is policy and m == 0):
            # uniform; or beta = pi: log pi - log beta is exactly 0 per draw, no log-prob to compute
            return candidates, torch.zeros(candidates.shape[:-1], dtype=candidates.dtype, device=candidates.device)
        log_pi = policy.log_prob(candidates)
        if m == 0:
            log_beta = proposal.log_prob(candidates)
        elif m == k:
            log_beta = widened.log_prob(candidates)
        else:
            # the density of the mixture the K draws came from, in log space
            log_beta = torch.logsumexp(
                torch.stack(
                    [
                        proposal.log_prob(candidates) + math.log((k - m) / k),
                        widened.log_prob(candidates) + math.log(m / k),
                    ]
                ),
                dim=0,
            )
        # beta_hat = 1/K per draw: a constant the search's softmax cancels
        return candidates, log_pi - log_beta

    # -- discrete ----------------------------------------------------------------------------------
    def _draw_discrete(
        self,
        policy: CategoricalPolicy,
        generator: torch.Generator | None,
        legal: torch.Tensor | None,
        proposal: CategoricalPolicy | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        k, num_actions = self.num_samples, policy.num_actions
        logits = policy.logits
        if legal is None:
            legal = torch.ones_like(logits, dtype=torch.bool)
        elif legal.shape != logits.shape:
            raise ValueError(
                f"SampledProposal.draw: legal {tuple(legal.shape)} does not match the policy's logits "
                f"{tuple(logits.shape)}."
            )
        # an action the policy itself masked (-inf logit) is illegal too
        legal = legal.bool() & (logits > -math.inf)
        beta_logits = proposal.logits if proposal is not None else logits / self.temperature
        beta_log = torch.log_softmax(beta_logits.masked_fill(~legal, -math.inf), -1)
        drawable = beta_log > -math.inf  # legal, and beta can draw it
        flat_log = beta_log.reshape(-1, num_actions)
        num_drawable = drawable.reshape(-1, num_actions).sum(-1)
        if bool((num_drawable == 0).any()):
            raise ValueError("SampledProposal.draw: a row has no legal action that the proposal can draw.")
        rows = flat_log.shape[0]
        if self.replacement:
            index = torch.multinomial(flat_log.exp(), k, replacement=True, generator=generator)
            valid = torch.ones_like(index, dtype=torch.bool)
            covered = torch.zeros(rows, dtype=torch.bool, device=index.device)
        else:
            # Gumbel-top-k: the top k of log beta + Gumbel noise are k draws without replacement from beta
            uniform = torch.rand(flat_log.shape, generator=generator, dtype=flat_log.dtype, device=flat_log.device)
            uniform = uniform.clamp_min(torch.finfo(flat_log.dtype).tiny)  # a finite key for every drawable action
            keys = flat_log - torch.log(-torch.log(uniform))
            index = keys.topk(min(k, num_actions), dim=-1).indices
            if k > num_actions:
                index = torch.cat([index, index[:, :1].expand(rows, k - num_actions)], dim=-1)
            valid = torch.arange(k, device=index.device) < num_drawable.unsqueeze(-1)
            covered = num_drawable <= k
            if bool(covered.any()):
                # a row that draws its whole drawable set gets it in action order: the set is not random, and
                # then its slots are its actions (K = A, all legal: MuZero's tree, bit for bit)
                ids = torch.arange(num_actions, device=index.device).expand(rows, num_actions)
                in_order = torch.where(drawable.reshape(rows, num_actions), ids, num_actions).sort(-1).values
                in_order = in_order[:, :k] if k <= num_actions else torch.cat(
                    [in_order, in_order[:, :1].expand(rows, k - num_actions)], dim=-1)
                index = torch.where(covered.unsqueeze(-1), in_order, index)
            # padding slots repeat the first draw: a legal action, never selected (slot logit -inf)
            index = torch.where(valid, index, index[:, :1])
        candidates = index.view(*policy.batch_shape, k)
        valid = valid.view(*policy.batch_shape, k)
        covered = covered.view(*policy.batch_shape, 1)
        if self.prior == "uniform":
            slot_logits = torch.zeros(candidates.shape, dtype=flat_log.dtype, device=flat_log.device)
        else:
            log_pi = policy.log_prob(candidates)
            log_beta = beta_log.gather(-1, candidates)
            # the whole drawable set was drawn: not random, so pi itself: the policy's own logits, whose softmax
            # over the slots is pi renormalised, with MuZero's rounding
            slot_logits = torch.where(covered, logits.gather(-1, candidates), log_pi - log_beta)
        return candidates, slot_logits.masked_fill(~valid, -math.inf)
