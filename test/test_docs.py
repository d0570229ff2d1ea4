"""The docs' compose-your-own script runs and learns; every docstring example runs."""
import doctest
import importlib
import pkgutil
import runpy
import sys
from pathlib import Path

import pytest

import torchrl_muzero

REPO = Path(__file__).resolve().parents[1]


def _modules():
    for info in pkgutil.walk_packages(torchrl_muzero.__path__, "torchrl_muzero."):
        if info.name.endswith("._C"):
            continue
        yield info.name


@pytest.mark.parametrize("name", sorted(_modules()))
def test_docstring_examples(name):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, verbose=False)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"


def test_every_public_class_has_an_example():
    missing = []
    for name in _modules():
        module = importlib.import_module(name)
        for attr in getattr(module, "__all__", []):
            obj = getattr(module, attr)
            if isinstance(obj, type) and obj.__module__ == name and not issubclass(obj, BaseException):
                if ">>>" not in (obj.__doc__ or ""):
                    missing.append(f"{name}.{attr}")
    assert not missing, f"public classes without a docstring example: {missing}"


@pytest.mark.slow
def test_compose_your_own_script_learns():
    sys.path.insert(0, str(REPO / "docs"))
    try:
        module = runpy.run_path(str(REPO / "docs" / "compose_your_own.py"))
        greedy = module["main"](total_frames=3_072, seed=0)
    finally:
        sys.path.pop(0)
    assert greedy > 35.0  # a random CartPole policy averages ~22
