"""Loader and thin wrappers for the optional C++ tree kernel (``torchrl_muzero._C``).

The kernel (``torchrl_muzero/csrc/tree_ops.cpp``) does the search's select and
expand/backup bookkeeping as one loop over the ``B`` trees per call; see that
file for the exact float32 contract the plain-torch path mirrors.

The extension is optional: it is built by ``pip install --no-build-isolation
-e .`` when a compiler is present. Without it :func:`load_tree_ops` returns
``None`` (never raises) and :func:`tree_ops_unavailable_reason` says why, so the
search can fall back to its torch path. Setting ``TORCHRL_MUZERO_JIT=1``
allows compiling the kernel on first use with ``torch.utils.cpp_extension.load``
(cached by torch under ``$TORCH_EXTENSIONS_DIR``, or under
``$TORCHRL_MUZERO_JIT_DIR`` when set); it is opt-in because a first compile
takes about a minute and needs a toolchain.
"""
from __future__ import annotations

import os
import threading
from types import ModuleType

import torch

from .tree import Tree

__all__ = [
    "load_tree_ops",
    "tree_ops_unavailable_reason",
    "cpp_select",
    "cpp_expand_and_backup",
]

# Must equal kTreeOpsVersion in tree_ops.cpp: an in-place build left over from
# an older checkout would otherwise be called with the wrong arguments.
_EXPECTED_VERSION = 1

_lock = threading.Lock()
_loaded = False  # the load is attempted once per process; failures are sticky
_module: ModuleType | None = None
_reason: str | None = "not loaded yet"


def _source_path() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.join(os.path.dirname(here), "csrc", "tree_ops.cpp")


def _check_version(mod: ModuleType, origin: str) -> ModuleType:
    version = getattr(mod, "TREE_OPS_VERSION", None)
    if version != _EXPECTED_VERSION:
        raise ImportError(
            f"{origin} has TREE_OPS_VERSION={version}, expected {_EXPECTED_VERSION}: "
            "stale build, rebuild with `pip install --no-build-isolation -e .`"
        )
    return mod


def _jit_compile() -> ModuleType:
    from torch.utils.cpp_extension import load

    source = _source_path()
    if not os.path.exists(source):
        raise FileNotFoundError(f"kernel source not found at {source}")
    build_dir = os.environ.get("TORCHRL_MUZERO_JIT_DIR")
    if build_dir:
        os.makedirs(build_dir, exist_ok=True)
    mod = load(
        name="torchrl_muzero_tree_ops",
        sources=[source],
        # Same flags as setup.py; fp-contract=off is also forced in the source.
        extra_cflags=["-O3", "-ffp-contract=off"],
        build_directory=build_dir,
        verbose=False,
    )
    return _check_version(mod, "JIT-compiled tree_ops")


def load_tree_ops() -> ModuleType | None:
    """The compiled kernel module, or ``None`` if it is unavailable (never raises)."""
    global _loaded, _module, _reason
    if _loaded:
        return _module
    with _lock:
        if _loaded:
            return _module
        reasons = []
        try:
            from torchrl_muzero import _C  # built by setup.py

            _module = _check_version(_C, "torchrl_muzero._C")
        except Exception as err:  # ImportError, undefined symbols from another torch, ...
            reasons.append(f"torchrl_muzero._C: {type(err).__name__}: {err}")
        if _module is None:
            if os.environ.get("TORCHRL_MUZERO_JIT", "0") == "1":
                try:
                    _module = _jit_compile()
                except Exception as err:
                    reasons.append(f"JIT compile failed: {type(err).__name__}: {err}")
            else:
                reasons.append("JIT compile not attempted (set TORCHRL_MUZERO_JIT=1 to allow it)")
        _reason = None if _module is not None else "; ".join(reasons)
        _loaded = True
        return _module


def tree_ops_unavailable_reason() -> str | None:
    """Why :func:`load_tree_ops` returned ``None`` (``None`` if the kernel is loaded)."""
    load_tree_ops()
    return _reason


def _require() -> ModuleType:
    mod = load_tree_ops()
    if mod is None:
        raise RuntimeError(f"the C++ tree kernel is unavailable: {_reason}")
    return mod


def cpp_select(
    tree: Tree, pb_c_base: float, pb_c_init: float, discount: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """pUCT descent in every tree: ``(leaf_node [B], leaf_action [B])``, both int64.

    ``leaf_action`` of ``leaf_node`` is the first unexpanded edge the descent
    chose. Reads the tree only. Tensors must be CPU, contiguous, of the dtypes
    of :func:`~torchrl_muzero.mcts.tree.allocate_tree`.
    """
    return _require().select(
        tree.visit_count,
        tree.value_sum,
        tree.children_index,
        tree.children_prior,
        tree.children_reward,
        tree.min_q,
        tree.max_q,
        tree.root_legal,
        float(pb_c_base),
        float(pb_c_init),
        float(discount),
    )


def cpp_expand_and_backup(
    tree: Tree,
    node_index: int,
    leaf_node: torch.Tensor,
    leaf_action: torch.Tensor,
    reward: torch.Tensor,
    value: torch.Tensor,
    prior: torch.Tensor,
    discount: float,
) -> None:
    """Attach node ``node_index`` under ``(leaf_node, leaf_action)`` and back ``value`` up, in place.

    ``leaf_node`` / ``leaf_action``: ``[B]`` int64 (as :func:`cpp_select` returns);
    ``reward`` / ``value``: ``[B]`` float32; ``prior``: ``[B, A]`` float32 (the
    new node's children priors). Updates visit counts, value sums and
    ``min_q`` / ``max_q``; the new node's embedding is the caller's to write.
    """
    _require().expand_and_backup(
        tree.visit_count,
        tree.value_sum,
        tree.parent,
        tree.action_from_parent,
        tree.children_index,
        tree.children_prior,
        tree.children_reward,
        tree.min_q,
        tree.max_q,
        int(node_index),
        leaf_node,
        leaf_action,
        reward,
        value,
        prior,
        float(discount),
    )
