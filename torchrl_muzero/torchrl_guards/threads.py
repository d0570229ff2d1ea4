"""torch thread-count guard (not a PR 4701 bug: torchrl's batched envs change the caller's thread count)."""
from __future__ import annotations

import torch

__all__ = ["reclaim_torch_threads"]


# --------------------------------------------------------------------------- #
# torch thread count (7, not a PR 4701 bug)
# --------------------------------------------------------------------------- #
# Remove when: torchrl's batched envs and collectors leave the calling
# process's torch.get_num_threads() as they found it (check
# BatchedEnvBase.close and ParallelEnv._start_workers in torchrl/envs/batched_envs.py).
def reclaim_torch_threads(count: int) -> int:
    """Set this process's torch thread count back to ``count`` if torchrl changed it; return it.

    Examples:
        >>> import torch
        >>> before = torch.get_num_threads()
        >>> torch.set_num_threads(1)   # e.g. a batched env's close() did this
        >>> reclaim_torch_threads(before) == before == torch.get_num_threads()
        True
    """
    if torch.get_num_threads() != count:
        torch.set_num_threads(count)
    return count
