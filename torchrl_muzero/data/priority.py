"""Sum / min trees over replay slots for proportional prioritized sampling.

torchrl ships these trees in C++ (``torchrl._torchrl.SumSegmentTreeFp32`` and
``MinSegmentTreeFp32``, the engine of :class:`~torchrl.data.PrioritizedSampler`).
:class:`PriorityTree` uses them when that extension loads. torchrl's wheel is
built against one torch release; with another one (torch 2.13 with torchrl
0.14.1 here) the extension fails to import with an undefined symbol and
``PrioritizedSampler`` cannot be built at all, so the same two trees are also
written as a handful of batched tensor operations (``backend="torch"``).

A leaf value of 0 means "never sample this slot": the sum tree gives it no
mass and the min tree ignores it (the importance weights are normalised by the
smallest *positive* priority).
"""
from __future__ import annotations

import torch

__all__ = ["PriorityTree"]

_BACKENDS = ("auto", "torch", "cpp")


def _cpp_trees():
    try:
        from torchrl._torchrl import MinSegmentTreeFp32, SumSegmentTreeFp32  # noqa: F401
    except ImportError:
        return None
    return SumSegmentTreeFp32, MinSegmentTreeFp32


class PriorityTree:
    """Leaf priorities with O(log C) update, total, minimum and inverse-CDF search.

    Args:
        capacity (int): number of leaves (replay slots).
        backend (str): ``"cpp"`` (torchrl's C++ segment trees), ``"torch"``
            (batched tensor ops, float64), or ``"auto"`` (C++ when torchrl's
            extension imports, else torch).

    Examples:
        >>> import torch
        >>> from torchrl_muzero.data import PriorityTree
        >>> tree = PriorityTree(5, backend="torch")
        >>> tree.update(torch.tensor([0, 1, 3]), torch.tensor([1.0, 2.0, 1.0]))
        >>> tree.total(), tree.min()
        (4.0, 1.0)
        >>> # leaf 0 covers [0, 1), leaf 1 [1, 3), leaf 2 nothing, leaf 3 [3, 4)
        >>> tree.find(torch.tensor([0.5, 1.0, 2.9, 3.5], dtype=torch.float64)).tolist()
        [0, 1, 1, 3]
    """

    def __init__(self, capacity: int, backend: str = "auto") -> None:
        if not isinstance(capacity, int) or capacity < 1:
            raise ValueError(f"PriorityTree capacity must be a positive integer, got {capacity!r}.")
        if backend not in _BACKENDS:
            raise ValueError(f"PriorityTree backend must be one of {_BACKENDS}, got {backend!r}.")
        self.capacity = capacity
        cpp = _cpp_trees() if backend in ("auto", "cpp") else None
        if backend == "cpp" and cpp is None:
            raise ImportError(
                "PriorityTree(backend='cpp') needs torchrl's C++ extension (torchrl._torchrl), which "
                "does not import with this torch build; use backend='torch' or 'auto'."
            )
        # the leaves, mirrored here so that reads, state_dict and rebuilds need no tree
        self._leaves = torch.zeros(capacity, dtype=torch.float64)
        if cpp is not None:
            self.backend = "cpp"
            self._sum_cpp = cpp[0](capacity)
            self._min_cpp = cpp[1](capacity)
            index = torch.arange(capacity)
            self._min_cpp[index] = torch.full((capacity,), float("inf"))
        else:
            self.backend = "torch"
            size = 1
            while size < capacity:
                size *= 2
            self._size = size
            self._depth = size.bit_length() - 1
            self._sum = torch.zeros(2 * size, dtype=torch.float64)
            self._min = torch.full((2 * size,), float("inf"), dtype=torch.float64)

    # -- writes -----------------------------------------------------------------
    def update(self, index: torch.Tensor, value: torch.Tensor) -> None:
        """Set leaves ``index`` to ``value`` (>= 0; 0 removes the slot from sampling)."""
        index = torch.as_tensor(index, dtype=torch.long).reshape(-1)
        if index.numel() == 0:
            return
        value = torch.as_tensor(value, dtype=torch.float64).reshape(-1).expand(index.shape)
        self._leaves[index] = value
        if self.backend == "cpp":
            v32 = value.float()
            self._sum_cpp[index] = v32
            self._min_cpp[index] = torch.where(v32 > 0, v32, torch.full_like(v32, float("inf")))
            return
        pos = index + self._size
        # read back the leaves: with duplicate indices the tree must agree with _leaves
        leaf = self._leaves[index]
        self._sum[pos] = leaf
        self._min[pos] = torch.where(leaf > 0, leaf, torch.full_like(leaf, float("inf")))
        for _ in range(self._depth):
            pos = pos // 2
            left, right = 2 * pos, 2 * pos + 1
            self._sum[pos] = self._sum[left] + self._sum[right]
            self._min[pos] = torch.minimum(self._min[left], self._min[right])

    def load(self, leaves: torch.Tensor) -> None:
        """Replace every leaf (``[capacity]``) and rebuild the trees."""
        leaves = torch.as_tensor(leaves, dtype=torch.float64)
        if leaves.shape != (self.capacity,):
            raise ValueError(f"expected {self.capacity} leaves, got shape {tuple(leaves.shape)}.")
        if self.backend == "cpp":
            self.update(torch.arange(self.capacity), leaves)
            return
        self._leaves.copy_(leaves)
        self._sum.zero_()
        self._min.fill_(float("inf"))
        self._sum[self._size : self._size + self.capacity] = leaves
        self._min[self._size : self._size + self.capacity] = torch.where(
            leaves > 0, leaves, torch.full_like(leaves, float("inf"))
        )
        width = self._size
        while width > 1:
            width //= 2
            lo = width
            self._sum[lo : 2 * lo] = self._sum[2 * lo : 4 * lo].view(-1, 2).sum(1)
            self._min[lo : 2 * lo] = self._min[2 * lo : 4 * lo].view(-1, 2).min(1).values

    # -- reads ------------------------------------------------------------------
    def __getitem__(self, index: torch.Tensor) -> torch.Tensor:
        return self._leaves[index]

    @property
    def leaves(self) -> torch.Tensor:
        """All leaf values ``[capacity]`` (float64, read-only by convention)."""
        return self._leaves

    def total(self) -> float:
        """Sum of every leaf."""
        if self.backend == "cpp":
            return float(self._sum_cpp.query(0, self.capacity))
        return float(self._sum[1])

    def min(self) -> float:
        """Smallest positive leaf (``inf`` when every leaf is 0)."""
        if self.backend == "cpp":
            return float(self._min_cpp.query(0, self.capacity))
        return float(self._min[1])

    def find(self, mass: torch.Tensor) -> torch.Tensor:
        """Leaf index whose cumulative interval ``[cum_i, cum_i + p_i)`` holds each ``mass``.

        ``mass`` must lie in ``[0, total())``. Rounding can, rarely, land on a
        zero leaf; callers check the leaf value (see :meth:`sample`).
        """
        mass = torch.as_tensor(mass, dtype=torch.float64).reshape(-1)
        if self.backend == "cpp":
            index = torch.as_tensor(self._sum_cpp.scan_lower_bound(mass.float())).long().reshape(-1)
            return index.clamp_(0, self.capacity - 1)
        node = torch.ones_like(mass, dtype=torch.long)
        for _ in range(self._depth):
            left = 2 * node
            left_sum = self._sum[left]
            go_right = mass >= left_sum
            mass = torch.where(go_right, mass - left_sum, mass)
            node = left + go_right.long()
        return (node - self._size).clamp_(0, self.capacity - 1)

    def sample(self, batch_size: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """Draw ``batch_size`` leaves with probability proportional to their value."""
        total = self.total()
        if not total > 0:
            raise RuntimeError("cannot sample: every priority is 0 (nothing sampleable).")
        index = self.find(torch.rand(batch_size, generator=generator, dtype=torch.float64) * total)
        bad = self._leaves[index] <= 0
        for _ in range(8):  # rounding at the right edge: redraw the few that hit an empty leaf
            if not bool(bad.any()):
                break
            redraw = self.find(torch.rand(int(bad.sum()), generator=generator, dtype=torch.float64) * total)
            index[bad] = redraw
            bad = self._leaves[index] <= 0
        if bool(bad.any()):
            # give up on rounding: the largest leaf is always valid
            index[bad] = int(self._leaves.argmax())
        return index

    def __repr__(self) -> str:
        return f"{type(self).__name__}(capacity={self.capacity}, backend={self.backend!r})"
