"""The peer harness itself (fast, no peer venv needed): the exported case, the numpy reference, skipping.

Run: python -m pytest -q benchmarks/peers/test_peers.py
"""
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))
import export_case  # noqa: E402
import peer_common as pc  # noqa: E402
import run_peers  # noqa: E402


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    path = export_case.export(tmp_path_factory.mktemp("peers") / "case.npz")
    return path, pc.load_case(str(path))


def test_case_layout(case):
    _, c = case
    A, L, H = int(c["num_actions"]), int(c["latent_dim"]), int(c["hidden_dim"])
    assert (A, L, H) == (6, 64, 64) and int(c["num_simulations"]) == 50
    assert c["dyn_w1"].shape == (H, L + A) and c["pred_w2"].shape == (A + 601, H) and c["rew_w2"].shape == (601, H)
    for B in c["batches"]:
        assert c[f"latent_B{B}"].shape == (B, L) and c[f"policy_logits_B{B}"].shape == (B, A)
        np.testing.assert_array_equal(c[f"obs_B{B}"], c["obs_B256"][:B])
    latent = c["latent_B256"]
    assert np.allclose(latent.min(-1), 0) and np.allclose(latent.max(-1), 1)  # scale_latent


def test_export_is_deterministic(case, tmp_path):
    _, c = case
    again = pc.load_case(str(export_case.export(tmp_path / "again.npz")))
    for k in c:
        np.testing.assert_array_equal(c[k], again[k])


def test_numpy_reference_matches_our_network(case, capsys):
    _, c = case
    net = pc.NumpyMLP(c)
    worst = pc.check_forward("numpy", c, net.recurrent, net.initial)
    assert worst < 1e-3 and '"ok": true' in capsys.readouterr().out


def test_check_forward_refuses_a_different_network(case):
    _, c = case
    net = pc.NumpyMLP(c)

    def off(latent, action):
        nxt, reward, policy, value = net.recurrent(latent, action)
        return nxt, reward + 0.1, policy, value

    with pytest.raises(SystemExit) as err:
        pc.check_forward("off", c, off)
    assert err.value.code == 3


def test_missing_peer_is_skipped(case, monkeypatch, capsys):
    path, _ = case
    monkeypatch.setenv("TORCHRL_MUZERO_LZ_PYTHON", "/nonexistent/python")
    assert run_peers.run_peer("lightzero", path, ["muzero"], [1], 1, timeout=60) == []
    assert "skipped, no python at /nonexistent/python" in capsys.readouterr().err


@pytest.mark.parametrize("argv, line", [
    (["--peers", "mctx,none"], "--peers='mctx,none': unknown peer 'none'; known: lightzero, mctx"),
    (["--batches", "2,8"], "--batches='2,8': the exported case holds roots for B in 1, 8, 64, 256 only"),
])
def test_bad_arguments_are_one_line_before_anything_runs(argv, line):
    out = subprocess.run([sys.executable, str(Path(run_peers.__file__)), *argv],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2
    assert line in out.stderr
    assert "Traceback" not in out.stderr and out.stdout == ""


def test_table_lays_out_medians():
    recs = [{"impl": "a", "variant": "muzero", "B": 1, "searches_per_s": v} for v in (1.0, 3.0, 2.0)]
    recs += [{"impl": "b", "variant": "muzero", "B": 1, "searches_per_s": 10.0},
             {"impl": "a", "check": "network", "max_abs_diff": 0.0}]
    out = run_peers.table(recs)
    assert "2.0" in out and "10.0" in out and "network check" in out


def test_ratio_table_divides_ours_by_the_best_peer_pass_by_pass():
    def rec(impl, p, v):
        return {"impl": impl, "variant": "gumbel_muzero", "B": 64, "pass": p, "searches_per_s": v}

    recs = [rec("ours-cpp", 0, 400.0), rec("ours-cpp", 0, 600.0), rec("mctx", 0, 200.0), rec("lightzero", 0, 100.0),
            rec("ours-cpp", 1, 300.0), rec("mctx", 1, 250.0), rec("lightzero", 1, 50.0),
            rec("ours-cpp", 2, 900.0)]  # pass 2: no peer figure, left out
    out = run_peers.ratio_table(recs)
    # pass 0: median(400, 600) / max(200, 100) = 2.5; pass 1: 300 / 250 = 1.2
    assert "cpp: 2.50 1.20 | median 1.85 min 1.20" in out


def test_table_warns_about_an_implementation_on_more_than_one_core():
    recs = [{"impl": "a", "variant": "muzero", "B": 1, "searches_per_s": 1.0, "cpu_per_wall": 1.0},
            {"impl": "b", "variant": "muzero", "B": 1, "searches_per_s": 2.0, "cpu_per_wall": 1.6}]
    out = run_peers.table(recs)
    assert "WARNING: b used more than one core in 1 rounds" in out and "WARNING: a" not in out
    assert "searches per CPU-second" in out and "1.2" in out  # b: 2.0 searches/s on 1.6 cores


def test_runners_are_pinned_to_one_core():
    # every runner pins itself (run_peers.py in main(), before it starts the peers' runners)
    code = ("import os, sys; sys.path.insert(0, %r); import peer_common as pc; pc.pin_to_one_core(); "
            "print(len(os.sched_getaffinity(0)))" % str(Path(run_peers.__file__).parent))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "1"


def test_stochastic_case_and_numpy_reference(case, capsys):
    _, c = case
    if "num_chance" not in c:
        pytest.skip("no Stochastic MuZero model in this checkout")
    A, C, L = int(c["num_actions"]), int(c["num_chance"]), int(c["latent_dim"])
    assert C == 32 and c["sto_as_w1"].shape == (64, L + A) and c["sto_dyn_w1"].shape == (64, L + C)
    assert c["sto_chance_w"].shape == (C, 64) and c["sto_policy_logits_B8"].shape == (8, A)
    net = pc.NumpyStochastic(c)
    assert pc.check_stochastic("numpy", c, net.afterstate, net.chance) < 1e-3
    assert '"ok": true' in capsys.readouterr().out


def test_efficientzero_case_layout(case):
    _, c = case
    if "lstm_hidden_size" not in c:
        pytest.skip("no EfficientZero model in this checkout")
    K, L, A = int(c["lstm_hidden_size"]), int(c["latent_dim"]), int(c["num_actions"])
    assert (K, int(c["lstm_horizon_len"])) == (64, 5)
    assert c["ez_lstm_w_ih"].shape == (4 * K, L) and c["ez_lstm_w_hh"].shape == (4 * K, K)
    assert c["ez_vp_w2"].shape == (601, 64) and c["ez_check_h"].shape == (256, K)
    assert c["ez_dyn_w1"].shape == (64, L + A) and "ez_rew_w1" not in c  # the LSTM replaces the reward head
    assert sorted(pc.prefixed_weight_keys(c, "ez_"))[:3] == ["ez_dyn_b1", "ez_dyn_b2", "ez_dyn_w1"]
