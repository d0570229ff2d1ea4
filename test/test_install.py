"""The install built the C++ tree kernel where CI says it must (the README's command does)."""
import os

import pytest

from torchrl_muzero.kernel import build as _kernel_build
from torchrl_muzero.mcts import _cpp


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


def test_only_the_module_file_includes_pybind11():
    """The kernel's build time: a file on torch/extension.h (or pybind11) parses ~25 s of headers
    (DEVELOPERS.md, "The C++ kernel build"), so the compute files include light ATen / c10 headers
    and only tree_ops.cpp, which binds every function, includes pybind11."""
    csrc = os.path.join(os.path.dirname(os.path.dirname(_cpp.__file__)), "csrc")
    heavy = ("#include <torch/extension.h>", "#include <torch/torch.h>", "#include <torch/all.h>",
             "#include <pybind11/", "#include <torch/csrc/utils/pybind.h>", "#include <torch/python.h>")
    for name in _kernel_build.SOURCES + _kernel_build.HEADERS:
        with open(os.path.join(csrc, name)) as f:
            text = f.read()
        found = [h for h in heavy if h in text]
        if name == "tree_ops.cpp":
            assert found == ["#include <torch/csrc/utils/pybind.h>"], found
        else:
            assert not found, (name, found)


def test_the_kernel_is_built_without_debug_information_unless_told(monkeypatch):
    monkeypatch.delenv("TORCHRL_MUZERO_KERNEL_DEBUG", raising=False)
    compile_args, _ = _kernel_build.compile_and_link_args()
    assert "-g0" in compile_args and "-g" not in compile_args
    monkeypatch.setenv("TORCHRL_MUZERO_KERNEL_DEBUG", "1")
    compile_args, _ = _kernel_build.compile_and_link_args()
    assert "-g" in compile_args and "-g0" not in compile_args
