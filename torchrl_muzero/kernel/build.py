"""How the C++ kernel is compiled: its sources and flags, for setup.py and the JIT build alike.

setup.py loads this file by path (it must not import the package), so it imports nothing of
torchrl_muzero and nothing but the standard library and torch.
"""
from __future__ import annotations

import os

SOURCES = ("tree_ops.cpp", "mlp_net.cpp", "mlp_search.cpp", "stochastic_net.cpp", "stochastic_search.cpp",
           "ez_net.cpp", "ez_search.cpp", "sampled_search.cpp", "unizero_net.cpp", "unizero_search.cpp",
           "root_ops.cpp")
HEADERS = ("tree_common.h", "rules.h", "gumbel_rules.h", "dispatch.h", "mlp_net.h", "mlp_kernels.h",
           "stochastic_net.h", "ez_net.h", "gumbel_readout.h", "fused_loop.h", "unizero_net.h",
           "pack_cache.h", "entry_points.h", "unizero_kernels.h")

# fp-contract=off: no fused multiply-adds (the kernel's float32 contract); the sources force it
# with a pragma too. -g0: no debug information (Python's CFLAGS bring -g), which took a third of
# each file's compile time and made a 71 MB module; it changes no generated code.
# TORCHRL_MUZERO_KERNEL_DEBUG=1 at build time keeps -g (for gdb).
BASE_COMPILE_ARGS = ["-O3", "-ffp-contract=off", "-g0"]


def torch_openmp_library() -> str | None:
    """The OpenMP runtime torch's own wheel ships and runs its intra-op threads on, or ``None``.

    The fused searches split their trees with ``at::parallel_for``, on torch's OpenMP thread team.
    They must use that team and no second one: after every parallel torch op, torch's idle OpenMP
    workers spin for milliseconds, so a thread of our own started during that time shares its core
    with a spinning worker and runs at about half speed: a 2-thread search was no faster than a
    1-thread one (docs/performance_search.md, "One OpenMP team (why the kernel links torch's
    `libgomp`)"). Linking the extension against this very file (its soname,
    already loaded by torch) makes ``#pragma omp parallel`` reuse torch's team. Only GNU libgomp
    bundled in torch's ``lib`` folder is used; anything else (macOS, Intel's runtime, a conda
    build) gets ``None`` and the kernel's plain std::thread split.
    """
    try:
        import torch
    except Exception:  # noqa: BLE001 - no torch, no kernel anyway
        return None
    if not getattr(torch.backends.openmp, "is_available", lambda: False)():
        return None
    lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    try:
        names = sorted(os.listdir(lib))
    except OSError:
        return None
    for name in names:
        if name.startswith("libgomp") and ".so" in name:
            return os.path.join(lib, name)
    return None


def compile_and_link_args() -> tuple[list[str], list[str]]:
    """(extra compile args, extra link args) for the kernel on this torch.

    ``TORCHRL_MUZERO_KERNEL_OPENMP=0`` at build time keeps the kernel off OpenMP (its own
    std::threads), for a build whose OpenMP linking fails or to compare the two.
    ``TORCHRL_MUZERO_KERNEL_DEBUG=1`` compiles with debug information (-g instead of -g0).
    """
    base = list(BASE_COMPILE_ARGS)
    if os.environ.get("TORCHRL_MUZERO_KERNEL_DEBUG", "0") == "1":
        base[base.index("-g0")] = "-g"
    gomp = torch_openmp_library() if os.environ.get("TORCHRL_MUZERO_KERNEL_OPENMP", "1") != "0" else None
    if gomp is None:
        return base, []
    # -fopenmp at compile time only: at link time it would add the compiler's own -lgomp.
    return base + ["-fopenmp", "-DMZ_TORCH_OPENMP"], [gomp]
