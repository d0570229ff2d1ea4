"""Today's MuZero search, frozen (fixtures from test/make_golden_search.py).

Restructuring the search loop (selection rules as arguments, variant data in
the tree) must not move a single MuZero visit count, on either backend.
"""
import json

import pytest

from make_golden_search import CASES, PATH, run_case
from torchrl_muzero.mcts import _cpp

with open(PATH) as f:
    GOLDEN = json.load(f)
HAVE_CPP = _cpp.load_tree_ops() is not None


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("backend", ["torch", "cpp"])
def test_muzero_search_matches_frozen_visit_counts(case, backend):
    if backend == "cpp" and not HAVE_CPP:
        pytest.skip("C++ tree kernel not built")
    got = run_case(case, backend)
    want = GOLDEN[case[0]]
    assert got["visit_counts"] == want["visit_counts"]
    assert got["action"] == want["action"]
    assert got["root_value"] == pytest.approx(want["root_value"], abs=1e-4)


@pytest.mark.skipif(not HAVE_CPP, reason="C++ tree kernel not built")
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_fused_search_matches_frozen_visit_counts(case):
    got = run_case(case, "cpp", num_layers=1)
    want = GOLDEN["fused"][case[0]]
    assert got["visit_counts"] == want["visit_counts"]
    assert got["action"] == want["action"]
