"""The install built the C++ tree kernel where CI says it must (the README's command does)."""
import os

import pytest

from torchrl_muzero.mcts import _cpp, _kernel_build


@pytest.mark.skipif(os.environ.get("TORCHRL_MUZERO_REQUIRE_EXT") != "1",
                    reason="set TORCHRL_MUZERO_REQUIRE_EXT=1 to require the compiled kernel (CI does)")
def test_cpp_tree_kernel_was_built():
    ops = _cpp.load_tree_ops()
    assert ops is not None, _cpp.tree_ops_unavailable_reason()
    assert hasattr(ops, "mlp_search"), "the kernel lacks the fused MLP search"


def test_the_build_lists_every_kernel_source():
    """setup.py and the JIT build compile _kernel_build.SOURCES and depend on its HEADERS: a new
    file in csrc/ that is not listed would be left out of one build (or not rebuilt on a change)."""
    csrc = os.path.join(os.path.dirname(os.path.dirname(_cpp.__file__)), "csrc")
    files = set(os.listdir(csrc))
    assert set(_kernel_build.SOURCES) == {f for f in files if f.endswith(".cpp")}
    assert set(_kernel_build.HEADERS) == {f for f in files if f.endswith(".h")}


def test_the_kernel_is_built_on_torchs_openmp_runtime_unless_told_not_to(monkeypatch):
    gomp = _kernel_build.torch_openmp_library()
    compile_args, link_args = _kernel_build.compile_and_link_args()
    if gomp is None:  # no libgomp in torch's wheel: the kernel's own threads
        assert (compile_args, link_args) == (_kernel_build.BASE_COMPILE_ARGS, [])
    else:
        assert "-fopenmp" in compile_args and "-DMZ_TORCH_OPENMP" in compile_args
        assert link_args == [gomp] and os.path.dirname(gomp).endswith(os.path.join("torch", "lib"))
    monkeypatch.setenv("TORCHRL_MUZERO_KERNEL_OPENMP", "0")
    assert _kernel_build.compile_and_link_args() == (_kernel_build.BASE_COMPILE_ARGS, [])
