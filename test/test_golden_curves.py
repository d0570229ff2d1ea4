"""Seeded sync training runs give today's results bit for bit (fixtures/golden_curves.json).

Guards refactors that mean to change no behaviour (issue 38): per algorithm, the
same evaluation returns at the same env steps, the same number of updates and
the same final weights (a hash) as the frozen run of ``make_golden_curves.py``.
"""
from __future__ import annotations

import json
import os

import pytest
import torch

import make_golden_curves as golden

with open(golden.PATH) as _f:
    FROZEN = json.load(_f)


@pytest.mark.parametrize("algo", golden.ALGOS)
def test_a_seeded_sync_run_trains_as_it_did(algo):
    if torch.backends.cpu.get_cpu_capability() != FROZEN["cpu_capability"]:
        pytest.skip(f"frozen on a {FROZEN['cpu_capability']} CPU, this one is "
                    f"{torch.backends.cpu.get_cpu_capability()}: torch's kernels may round differently")
    assert os.environ.get("OMP_NUM_THREADS") == "1" or torch.get_num_threads() == 1  # conftest's one thread
    got = golden.run(algo)
    want = FROZEN[algo]
    assert got["evals"] == want["evals"]
    assert (got["env_steps"], got["train_iter"]) == (want["env_steps"], want["train_iter"])
    assert got["weights_sha256"] == want["weights_sha256"]
