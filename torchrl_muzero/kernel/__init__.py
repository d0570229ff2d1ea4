"""The C++ kernel's loader (``torchrl_muzero._C``): a leaf every layer that runs the kernel may import.

The kernel (``torchrl_muzero/csrc/``) holds the searches' tree bookkeeping,
the fused searches and the fused network forwards; the searches
(:mod:`torchrl_muzero.mcts._cpp`, which re-exports :func:`load_tree_ops`)
and the networks (UniZero's fused root, :mod:`torchrl_muzero.modules.unizero.fused`)
call it. This package only loads it: it imports nothing of the library but the
compiled module and :mod:`.build` (its sources and compiler flags, shared with
``setup.py``).

The extension is optional: it is built by ``pip install --no-build-isolation
-e .`` when a compiler is present. Without it :func:`load_tree_ops` returns
``None`` (never raises) and :func:`tree_ops_unavailable_reason` says why, so
the callers fall back to their torch path. Setting ``TORCHRL_MUZERO_JIT=1``
allows compiling the kernel on first use with ``torch.utils.cpp_extension.load``
(cached by torch under ``$TORCH_EXTENSIONS_DIR``, or under
``$TORCHRL_MUZERO_JIT_DIR`` when set); it is opt-in because a first compile
takes about a minute and needs a toolchain.

Example:
    >>> from torchrl_muzero.kernel import load_tree_ops, tree_ops_unavailable_reason
    >>> ops = load_tree_ops()
    >>> (ops is None) == (tree_ops_unavailable_reason() is not None)
    True
"""
from __future__ import annotations

import os
import threading
from types import ModuleType

from torchrl_muzero.kernel import build

__all__ = ["EXPECTED_VERSION", "load_tree_ops", "tree_ops_unavailable_reason"]

# Must equal kTreeOpsVersion in csrc/tree_common.h: an in-place build left over
# from an older checkout would otherwise be called with the wrong arguments.
EXPECTED_VERSION = 3

_lock = threading.Lock()
_loaded = False  # the load is attempted once per process; failures are sticky
_module: ModuleType | None = None
_reason: str | None = "not loaded yet"


def _source_paths() -> list[str]:
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # torchrl_muzero/
    return [os.path.join(package, "csrc", name) for name in build.SOURCES]


def _check_version(mod: ModuleType, origin: str) -> ModuleType:
    version = getattr(mod, "TREE_OPS_VERSION", None)
    if version != EXPECTED_VERSION:
        raise ImportError(
            f"{origin} has TREE_OPS_VERSION={version}, expected {EXPECTED_VERSION}: "
            "stale build, rebuild with `pip install --no-build-isolation -e .`"
        )
    return mod


def _jit_compile() -> ModuleType:
    from torch.utils.cpp_extension import load

    sources = _source_paths()
    missing = [s for s in sources if not os.path.exists(s)]
    if missing:
        raise FileNotFoundError(f"kernel sources not found: {missing}")
    compile_args, link_args = build.compile_and_link_args()
    build_dir = os.environ.get("TORCHRL_MUZERO_JIT_DIR")
    if build_dir:
        os.makedirs(build_dir, exist_ok=True)
    mod = load(
        name="torchrl_muzero_tree_ops",
        sources=sources,
        # Same flags as setup.py (torch's own OpenMP runtime where it ships one).
        extra_cflags=compile_args,
        extra_ldflags=link_args,
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
