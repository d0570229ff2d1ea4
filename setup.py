"""Install torchrl_muzero.

The search's tree bookkeeping has an optional C++ kernel (torchrl_muzero/csrc).
It is built when torch is importable at build time (``pip install
--no-build-isolation``); otherwise, or if the compiler fails, the package
installs without it and the search runs its plain-torch path.
"""
import importlib.util
import os
import sys

from setuptools import find_packages, setup

ext_modules = []
cmdclass = {}
if os.environ.get("TORCHRL_MUZERO_NO_EXT", "0") != "1":
    try:
        from torch.utils.cpp_extension import BuildExtension, CppExtension

        csrc = os.path.join("torchrl_muzero", "csrc")
        # The sources and flags, shared with the JIT build (torchrl_muzero/kernel/__init__.py).
        spec = importlib.util.spec_from_file_location(
            "_kernel_build", os.path.join("torchrl_muzero", "kernel", "build.py"))
        kernel_build = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(kernel_build)
        sources = [os.path.join(csrc, f) for f in kernel_build.SOURCES]
        headers = [os.path.join(csrc, f) for f in kernel_build.HEADERS]
        compile_args, link_args = kernel_build.compile_and_link_args()
        if all(os.path.exists(s) for s in sources):
            ext_modules.append(
                CppExtension(
                    "torchrl_muzero._C",
                    sources,
                    depends=headers,
                    extra_compile_args=compile_args,
                    extra_link_args=link_args,
                    optional=True,
                )
            )

            class OptionalBuildExtension(BuildExtension):
                """Never fail the install: a kernel that does not compile leaves the torch path."""

                def build_extension(self, ext):
                    try:
                        super().build_extension(ext)
                    except Exception as err:  # ninja raises RuntimeError, which `optional` misses
                        print(
                            f"torchrl_muzero: C++ tree kernel not built ({err}); the search will use its "
                            "plain-torch path.",
                            file=sys.stderr,
                        )

            cmdclass["build_ext"] = OptionalBuildExtension
    except Exception as err:  # torch not importable in an isolated build: plain-torch path only
        print(f"torchrl_muzero: building without the C++ tree kernel ({err})", file=sys.stderr)

setup(
    name="torchrl_muzero",
    version="0.1.0",
    description="MuZero family (MuZero, EfficientZero, Gumbel/Sampled/Stochastic MuZero, UniZero) as TorchRL pieces",
    packages=find_packages(include=["torchrl_muzero", "torchrl_muzero.*"]),
    python_requires=">=3.10",
    install_requires=[
        "torch>=2.9",
        "torchrl>=0.14.1",
        "tensordict>=0.14",
        "gymnasium>=1.0",
        "numpy",
        "tqdm",
        "hydra-core>=1.3",
        "matplotlib",
        # Atari (env=Pong, the product's headline command) needs nothing more: ale-py's wheels ship the ROMs
        "ale-py>=0.10",
    ],
    extras_require={
        "atari": [],  # kept so that `pip install 'torchrl_muzero[atari]'` still works: ale-py is a core dependency
        "dmc": ["dm-control"],
        "ray": ["ray>=2.40"],
        # ray: the Ray backend's tests (test/test_ray_backend.py, ~3.5 min on 2 cores) run in CI too
        # pytest-xdist: test/conftest.py runs the suite in two worker processes when it is installed
        # dm-control: the DeepMind Control tests (test/test_env_dmc.py) run in CI too (wheels, no native build)
        "dev": ["pytest", "pytest-benchmark", "pytest-timeout", "pytest-xdist>=3.5", "ray>=2.40", "dm-control"],
    },
    ext_modules=ext_modules,
    cmdclass=cmdclass,
)
