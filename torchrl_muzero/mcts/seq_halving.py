"""Sequential Halving with Gumbel at the root (Danihelka et al., ICLR 2022, section 3.2).

Sequential Halving (Karnin et al., 2013) splits the root's simulation budget
into ``ceil(log2 m)`` phases over ``m`` considered actions; each phase visits
the surviving actions equally often and keeps the better half. Over a batched
tree it is expressed, as in mctx, by a *sequence of considered visit counts*:
simulation ``i`` may only visit an action whose visit count equals
``sequence[i]``, and among those takes the best ``g + logits + sigma(q)``.

The number of considered actions differs per root (``m = min(max_m, #legal)``),
so a search keeps the table of sequences ``[max_m + 1, n]`` of
:func:`considered_visit_table` and gathers the row of each root's ``m``. The
table depends only on ``(max_m, n)``: a search reads the cached copy of
:func:`cached_considered_visit_table` (building it in Python took as long as a
whole B=1 fused search's bookkeeping: docs/performance_search.md, "Design
figures quoted from the code").
"""
from __future__ import annotations

import functools
import math

import torch

__all__ = ["considered_visit_sequence", "considered_visit_table", "cached_considered_visit_table",
           "score_considered"]


def considered_visit_sequence(num_considered: int, num_simulations: int) -> tuple[int, ...]:
    """The visit count that Sequential Halving considers at each of ``num_simulations`` simulations.

    For ``num_considered <= 1`` it is ``0, 1, ..., n - 1`` (one action takes
    every visit). Otherwise, with ``L = ceil(log2 m)``, phases repeat until
    the sequence holds ``n`` entries: a phase over ``k`` surviving actions
    (``k = m`` first) gives each of them ``max(1, n // (L * k))`` more visits,
    one round at a time (a round appends the current visit count of each of
    the ``k`` actions), then keeps ``k = max(2, k // 2)``. The result is cut
    to ``n`` entries.

    Examples:
        >>> from torchrl_muzero.mcts.seq_halving import considered_visit_sequence
        >>> considered_visit_sequence(4, 10)
        (0, 0, 0, 0, 1, 1, 2, 2, 3, 3)
        >>> considered_visit_sequence(1, 3)
        (0, 1, 2)
    """
    m, n = int(num_considered), int(num_simulations)
    if m <= 1:
        return tuple(range(n))
    log2max = int(math.ceil(math.log2(m)))
    visits = [0] * m
    sequence: list[int] = []
    k = m
    while len(sequence) < n:
        rounds = max(1, n // (log2max * k))
        for _ in range(rounds):
            sequence.extend(visits[:k])
            for j in range(k):
                visits[j] += 1
        k = max(2, k // 2)
    return tuple(sequence[:n])


def considered_visit_table(max_num_considered: int, num_simulations: int) -> torch.Tensor:
    """``[max_num_considered + 1, num_simulations]`` long: row ``m`` is :func:`considered_visit_sequence` ``(m, n)``.

    Examples:
        >>> from torchrl_muzero.mcts.seq_halving import considered_visit_table
        >>> considered_visit_table(2, 5)
        tensor([[0, 1, 2, 3, 4],
                [0, 1, 2, 3, 4],
                [0, 0, 1, 1, 2]])
    """
    rows = [considered_visit_sequence(m, num_simulations) for m in range(int(max_num_considered) + 1)]
    return torch.tensor(rows, dtype=torch.long).reshape(len(rows), int(num_simulations))


def cached_considered_visit_table(
    max_num_considered: int, num_simulations: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """:func:`considered_visit_table` ``(max_num_considered, num_simulations)`` on ``device``, built once.

    The same tensor is returned on every call with these arguments: treat it
    as read-only (index it, as the search does, rather than writing to it).

    Examples:
        >>> import torch
        >>> from torchrl_muzero.mcts.seq_halving import cached_considered_visit_table, considered_visit_table
        >>> table = cached_considered_visit_table(4, 10)
        >>> torch.equal(table, considered_visit_table(4, 10)), table is cached_considered_visit_table(4, 10)
        (True, True)
    """
    return _cached_table(int(max_num_considered), int(num_simulations), str(torch.device(device)))


@functools.lru_cache(maxsize=128)
def _cached_table(max_num_considered: int, num_simulations: int, device: str) -> torch.Tensor:
    return considered_visit_table(max_num_considered, num_simulations).to(device)


def score_considered(
    considered_visit: torch.Tensor,
    gumbel: torch.Tensor,
    logits: torch.Tensor,
    sigma_q: torch.Tensor,
    visit_counts: torch.Tensor,
    legal: torch.Tensor,
) -> torch.Tensor:
    """Sequential Halving's score ``[B, A]``; the root takes its argmax (ties: lowest index).

    float32 order, per action ``a`` of a row::

        z  = logits[a] - max_b logits[b]           # max over the row (illegal logits are -inf)
        s  = max(-1e9, (gumbel[a] + z) + sigma_q[a])
        s  = s if visits[a] == considered_visit else -inf
        s  = s if legal[a] else -inf

    ``considered_visit`` is ``[B]`` (or ``[B, 1]``); ``visit_counts`` the
    root's child visits ``[B, A]``; ``legal`` ``[B, A]`` bool.

    Examples:
        >>> import torch
        >>> from torchrl_muzero.mcts.seq_halving import score_considered
        >>> z = torch.zeros(1, 3)
        >>> score_considered(torch.tensor([1]), z, torch.tensor([[0.0, 1.0, 2.0]]), z,
        ...                  torch.tensor([[1, 1, 0]]), torch.ones(1, 3, dtype=torch.bool))
        tensor([[-2., -1., -inf]])
    """
    considered = considered_visit.reshape(-1, 1)
    z = logits - logits.max(-1, keepdim=True).values
    score = torch.clamp_min((gumbel + z) + sigma_q, -1e9)
    keep = (visit_counts == considered) & legal
    return score.masked_fill(~keep, -math.inf)
