"""The sampled peer harness itself (fast, no LightZero venv needed): the case, the rebuilt network, the table.

Run: python -m pytest -q benchmarks/peers/test_sampled_peers.py
"""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import peer_common as pc  # noqa: E402
import sampled_peers as sp  # noqa: E402


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    base = sp.build_base(**sp.SIZES)
    path = sp.export_sampled_case(tmp_path_factory.mktemp("sampled") / "case.npz", base)
    return path, pc.load_case(str(path))


def test_case_layout(case):
    _, c = case
    L, H, KL = int(c["latent_dim"]), int(c["hidden_dim"]), int(c["lstm_hidden_size"])
    assert (L, H, KL, int(c["action_dim"]), int(c["num_simulations"])) == (128, 256, 128, 1, 50)
    assert c["w.dynamics_net.0.weight"].shape == (H, L + 1)  # cat(latent, the continuous action)
    assert c["w.prediction_head.weight"].shape == (2 + 601, H)  # loc, raw scale, then the value bins
    assert c["w.value_prefix_head.4.weight"].shape == (601, H)
    for B in c["batches"]:
        np.testing.assert_array_equal(c[f"obs_B{B}"], c["obs_B64"][:B])
    assert np.allclose(np.hypot(c["obs_B64"][:, 0], c["obs_B64"][:, 1]), 1.0)  # cos, sin of Pendulum's angle
    assert (c["check_policy"][:, 1] > 0).all()  # the scale LightZero's tree reads as sigma
    assert (np.abs(c["check_actions"]) < 2.0).all()


def test_rebuilt_network_matches_ours(case):
    # the runner's torch network from the exported state_dict, checked without LightZero (our decode)
    path, _ = case
    code = f"""
import sys, json, numpy as np, torch
sys.path.insert(0, {str(HERE)!r})
import lightzero_sampled_search as lz, peer_common as pc
from torchrl_muzero.modules.support import CategoricalSupport
c = pc.load_case({str(path)!r})
net = lz.LZSampledEZMLP(c).eval()
support = CategoricalSupport(int(c["value_support_size"]))
print(json.dumps({{"check": lz.check_network(c, net, support.decode)}}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    checks = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert checks[0]["ok"] and checks[0]["max_abs_diff"] < 1e-5, checks[0]


def test_missing_lightzero_is_skipped(case):
    path, _ = case
    server = sp.LightZeroServer(path, python="/nonexistent/python")
    assert server.proc is None and "no python at /nonexistent/python" in server.reason


def test_table_medians_and_ratios():
    def rec(impl, B, K, v):
        return {"impl": impl, "B": B, "K": K, "searches_per_s": v, "cpu_seconds": B / (2 * v), "cpu_per_wall": 0.5}

    recs = [rec("ours-auto", 8, 20, v) for v in (100.0, 300.0, 200.0)] + [rec("lightzero", 8, 20, 50.0)]
    out = sp.table(recs, ["ours-auto", "lightzero"])
    row = [line for line in out.splitlines() if line.split()[:2] == ["8", "20"]]
    assert row[0].split() == ["8", "20", "200.0", "50.0", "4.00"]  # median 200 / 50
    assert row[1].split() == ["8", "20", "400.0", "100.0", "4.00"]  # per CPU-second: twice the wall rate


def test_bad_batches_are_one_line():
    out = subprocess.run([sys.executable, str(HERE / "sampled_peers.py"), "--batches", "2"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "the case holds observations for B in (1, 8, 64) only" in out.stderr
    assert "Traceback" not in out.stderr


def test_ratios_pair_the_rounds():
    def rec(impl, r, v):
        return {"impl": impl, "B": 64, "K": 5, "round": r, "searches_per_s": v, "cpu_seconds": 64 / v}

    # the load moves both sides together: the paired ratios are 2, 2, 3 (the medians alone: 300 / 100 = 3)
    recs = [rec("ours-auto", 0, 400.0), rec("lightzero", 0, 200.0), rec("ours-auto", 1, 100.0),
            rec("lightzero", 1, 50.0), rec("ours-auto", 2, 300.0), rec("lightzero", 2, 100.0)]
    row = [line for line in sp.table(recs, ["ours-auto", "lightzero"]).splitlines() if line.split()[:2] == ["64", "5"]]
    assert row[0].split() == ["64", "5", "300.0", "100.0", "2.00"]
