"""What every peer runner shares: numpy only, so it imports in any venv (numpy 1.x or 2.x).

* :func:`single_thread` sets the one-thread flags (OpenMP, MKL, OpenBLAS, XLA)
  and must run before torch / jax are imported; :func:`pin_to_one_core` keeps
  the process on one core.
* :func:`load_case` reads the .npz of ``export_case.py``.
* :class:`NumpyMLP` is the exported network in numpy, the reference the
  runners' own (torch / jax) forwards are checked against, itself checked
  against the exported outputs of our model.
* :func:`check_forward` prints one JSON line with the max abs differences.
* :func:`time_search` runs a search ``rounds`` times per batch size
  (:func:`time_searches` several searches, round-robin) and prints one JSON
  line per round: ``{"impl", "variant", "B", "round", "seconds",
  "searches_per_s", "cpu_per_wall"}``.
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Callable

import numpy as np

ONE_THREAD_ENV = {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1",
}


def threads_free() -> bool:
    """``run_peers.py --threads N`` (N > 1) sets ``TORCHRL_MUZERO_BENCH_THREADS``: nothing pinned,
    each implementation on its own default threading."""
    return os.environ.get("TORCHRL_MUZERO_BENCH_THREADS", "1") != "1"


def single_thread() -> None:
    """One compute thread for numpy / torch / XLA (call before importing them)."""
    if threads_free():
        return
    for key, value in ONE_THREAD_ENV.items():
        os.environ.setdefault(key, value)


def pin_to_one_core() -> int:
    """Pin this process (and the processes it starts later) to one core; returns the core.

    The one-thread flags alone do not keep every implementation on one core:
    jax 0.10's XLA CPU runtime still ran mctx's jitted searches on ~1.5 cores
    of this 2-core machine (process CPU time / wall clock 1.4-1.6 at B = 256
    with the flags set). Every runner therefore pins itself, to the lowest core
    it may use (``TORCHRL_MUZERO_BENCH_CORE`` picks another), and the peer
    runners that ``run_peers.py`` starts inherit its mask: every implementation
    runs on the same core, one after the other. Each timed round records
    ``cpu_per_wall``, which stays ~1 when this holds.
    """
    if threads_free():
        return -1
    allowed = sorted(os.sched_getaffinity(0))
    core = int(os.environ.get("TORCHRL_MUZERO_BENCH_CORE", allowed[0]))
    if core not in allowed:
        raise SystemExit(f"TORCHRL_MUZERO_BENCH_CORE is {core}, but this process may only use cores {allowed}")
    os.sched_setaffinity(0, {core})
    return core


def emit(record: dict) -> None:
    """One JSON line on stdout (what ``run_peers.py`` parses)."""
    print(json.dumps(record), flush=True)


def load_case(path: str) -> dict:
    with np.load(path) as data:
        return {k: data[k] for k in data.files}


def scale_latent(x: np.ndarray, eps: float = 1e-5) -> np.ndarray:
    low = x.min(-1, keepdims=True)
    high = x.max(-1, keepdims=True)
    return (x - low) / np.maximum(high - low, eps)


def inverse_h(y: np.ndarray, epsilon: float) -> np.ndarray:
    root = (np.sqrt(1 + 4 * epsilon * (np.abs(y) + 1 + epsilon)) - 1) / (2 * epsilon)
    return np.sign(y) * (root * root - 1)


def softmax(x: np.ndarray) -> np.ndarray:
    z = np.exp(x - x.max(-1, keepdims=True))
    return z / z.sum(-1, keepdims=True)


class NumpyMLP:
    """The exported MuZero MLP in float32 numpy (one hidden layer per network)."""

    def __init__(self, case: dict) -> None:
        self.w = {k: case[k].astype(np.float32) for k in case if k[:4] in ("repr", "dyn_", "rew_", "pred")}
        self.A = int(case["num_actions"])
        self.L = int(case["latent_dim"])
        self.eps = float(case["epsilon"])
        self.scale_eps = float(case["scale_eps"])
        self.value_bins = np.arange(-int(case["value_support_size"]), int(case["value_support_size"]) + 1,
                                    dtype=np.float32)
        self.reward_bins = np.arange(-int(case["reward_support_size"]), int(case["reward_support_size"]) + 1,
                                     dtype=np.float32)

    def _two(self, name: str, x: np.ndarray) -> np.ndarray:
        w = self.w
        h = np.maximum(x @ w[f"{name}_w1"].T + w[f"{name}_b1"], 0)
        return h @ w[f"{name}_w2"].T + w[f"{name}_b2"]

    def represent(self, obs: np.ndarray) -> np.ndarray:
        return scale_latent(self._two("repr", obs), self.scale_eps)

    def predict(self, latent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        out = self._two("pred", latent)
        return out[:, : self.A], out[:, self.A:]

    def decode(self, logits: np.ndarray, bins: np.ndarray) -> np.ndarray:
        return inverse_h(softmax(logits) @ bins, self.eps)

    def initial(self, obs: np.ndarray):
        """``obs [B, 8]`` -> ``(latent, policy_logits, value)``."""
        latent = self.represent(obs)
        policy, value_logits = self.predict(latent)
        return latent, policy, self.decode(value_logits, self.value_bins)

    def recurrent(self, latent: np.ndarray, action: np.ndarray):
        """``(latent [B, L], action [B])`` -> ``(next_latent, reward, policy_logits, value)``."""
        one_hot = np.eye(self.A, dtype=np.float32)[np.asarray(action).reshape(-1)]
        nxt = scale_latent(self._two("dyn", np.concatenate([latent, one_hot], -1)), self.scale_eps)
        reward = self.decode(self._two("rew", nxt), self.reward_bins)
        policy, value_logits = self.predict(nxt)
        return nxt, reward, policy, self.decode(value_logits, self.value_bins)


def stochastic_weight_keys(case: dict) -> list[str]:
    """The ``sto_*`` weight keys (not the roots nor the checks)."""
    return prefixed_weight_keys(case, "sto_")


class NumpyStochastic:
    """The exported Stochastic MuZero MLP (``sto_*`` keys) in float32 numpy."""

    def __init__(self, case: dict) -> None:
        self.w = {k[4:]: case[k].astype(np.float32) for k in stochastic_weight_keys(case)}
        self.A, self.C = int(case["num_actions"]), int(case["num_chance"])
        base = NumpyMLP(case)
        self.eps, self.scale_eps = base.eps, base.scale_eps
        self.value_bins, self.reward_bins = base.value_bins, base.reward_bins
        self.decode = base.decode

    def _two(self, name, x):
        w = self.w
        h = np.maximum(x @ w[f"{name}_w1"].T + w[f"{name}_b1"], 0)
        return h @ w[f"{name}_w2"].T + w[f"{name}_b2"]

    def afterstate(self, latent, action):
        """``(latent, action [B])`` -> ``(afterstate, chance_logits [B, C], q [B])``."""
        one_hot = np.eye(self.A, dtype=np.float32)[np.asarray(action).reshape(-1)]
        aft = scale_latent(self._two("as", np.concatenate([latent, one_hot], -1)), self.scale_eps)
        h = np.maximum(aft @ self.w["astrunk_w"].T + self.w["astrunk_b"], 0)
        sigma = h @ self.w["chance_w"].T + self.w["chance_b"]
        q = self.decode(h @ self.w["asvalue_w"].T + self.w["asvalue_b"], self.value_bins)
        return aft, sigma, q

    def chance(self, afterstate, code):
        """``(afterstate, code [B])`` -> ``(next_latent, reward, policy_logits, value)``."""
        one_hot = np.eye(self.C, dtype=np.float32)[np.asarray(code).reshape(-1)]
        nxt = scale_latent(self._two("dyn", np.concatenate([afterstate, one_hot], -1)), self.scale_eps)
        reward = self.decode(self._two("rew", nxt), self.reward_bins)
        out = self._two("pred", nxt)
        return nxt, reward, out[:, : self.A], self.decode(out[:, self.A:], self.value_bins)


def check_stochastic(impl: str, case: dict, afterstate: Callable, chance: Callable, tol: float = 1e-3) -> float:
    """Like :func:`check_forward` for the Stochastic MuZero network (``afterstate`` and ``chance`` steps)."""
    aft, sigma, q = (np.asarray(x) for x in afterstate(case["sto_latent_B256"], case["check_actions"]))
    nxt, reward, policy, value = (np.asarray(x) for x in chance(case["sto_check_afterstate"],
                                                                 case["sto_check_codes"]))
    diffs = {
        "afterstate": float(np.abs(aft - case["sto_check_afterstate"]).max()),
        "chance_logits": float(np.abs(sigma - case["sto_check_chance_logits"]).max()),
        "q": float(np.abs(q.reshape(-1) - case["sto_check_q"]).max()),
        "next_latent": float(np.abs(nxt - case["sto_check_next"]).max()),
        "reward": float(np.abs(reward.reshape(-1) - case["sto_check_reward"]).max()),
        "policy": float(np.abs(policy - case["sto_check_policy"]).max()),
        "value": float(np.abs(value.reshape(-1) - case["sto_check_value"]).max()),
    }
    worst = max(diffs.values())
    emit({"impl": impl, "check": "stochastic_network", "max_abs_diff": worst, "diffs": diffs, "ok": worst <= tol})
    if worst > tol:
        print(f"{impl}: the re-implemented stochastic network differs from ours by {worst:g} > {tol:g}",
              file=sys.stderr)
        sys.exit(3)
    return worst


def prefixed_weight_keys(case: dict, prefix: str) -> list[str]:
    """The ``{prefix}*`` weight keys of a case (not its roots nor its checks)."""
    return [k for k in case if k.startswith(prefix) and not k.startswith(
        tuple(f"{prefix}{x}" for x in ("latent_", "policy_logits_", "value_", "check_")))]


def check_efficientzero(impl: str, case: dict, step: Callable, tol: float = 1e-3) -> float:
    """Check an EfficientZero re-implementation: ``step(latent, h, c, action) -> (next, h, c, prefix, policy, value)``."""
    latent = case["ez_latent_B256"]
    zeros = np.zeros((latent.shape[0], int(case["lstm_hidden_size"])), dtype=np.float32)
    out = [np.asarray(x) for x in step(latent, zeros, zeros, case["check_actions"])]
    names = ("next", "h", "c", "prefix", "policy", "value")
    diffs = {n: float(np.abs(o.reshape(case[f"ez_check_{n}"].shape) - case[f"ez_check_{n}"]).max())
             for n, o in zip(names, out)}
    worst = max(diffs.values())
    emit({"impl": impl, "check": "efficientzero_network", "max_abs_diff": worst, "diffs": diffs, "ok": worst <= tol})
    if worst > tol:
        print(f"{impl}: the re-implemented EfficientZero network differs from ours by {worst:g} > {tol:g}",
              file=sys.stderr)
        sys.exit(3)
    return worst


def check_forward(impl: str, case: dict, recurrent: Callable, initial: Callable | None = None,
                  tol: float = 1e-3) -> float:
    """Compare a runner's network with the exported outputs of ours; print and return the max abs diff.

    ``recurrent(latent, action) -> (next_latent, reward, policy_logits, value)`` and
    ``initial(obs) -> (latent, policy_logits, value)`` take and return numpy arrays.
    Exits with status 3 when a difference exceeds ``tol`` (then the timings
    would compare different trees).
    """
    diffs = {}
    if initial is not None:
        latent, policy, value = initial(case["obs_B256"])
        diffs["initial_latent"] = float(np.abs(latent - case["latent_B256"]).max())
        diffs["initial_policy"] = float(np.abs(policy - case["policy_logits_B256"]).max())
        diffs["initial_value"] = float(np.abs(np.asarray(value).reshape(-1) - case["value_B256"]).max())
    state = case["latent_B256"]
    actions = case["check_actions"]
    A = int(case["num_actions"])
    for step, a in ((1, actions), (2, (actions + 1) % A)):
        state, reward, policy, value = (np.asarray(x) for x in recurrent(state, a))
        diffs[f"latent{step}"] = float(np.abs(state - case[f"check_latent{step}"]).max())
        diffs[f"reward{step}"] = float(np.abs(reward.reshape(-1) - case[f"check_reward{step}"]).max())
        diffs[f"policy{step}"] = float(np.abs(policy - case[f"check_policy{step}"]).max())
        diffs[f"value{step}"] = float(np.abs(value.reshape(-1) - case[f"check_value{step}"]).max())
    worst = max(diffs.values())
    emit({"impl": impl, "check": "network", "max_abs_diff": worst, "diffs": diffs, "ok": worst <= tol})
    if worst > tol:
        print(f"{impl}: the re-implemented network differs from ours by {worst:g} > {tol:g}", file=sys.stderr)
        sys.exit(3)
    return worst


def time_search(impl: str, variant: str, run: Callable[[int], object], batches, rounds: int = 3,
                warmup: int = 1, **extra) -> list[dict]:
    """Time ``run(B)`` (one whole search of ``B`` roots) ``rounds`` times per ``B``, after ``warmup`` calls."""
    return time_searches({impl: run}, variant, batches, rounds=rounds, warmup=warmup, **extra)


def time_searches(runs: dict[str, Callable[[int], object]], variant: str, batches, rounds: int = 3,
                  warmup: int = 1, **extra) -> list[dict]:
    """:func:`time_search` for several implementations ``{impl: run}`` of one variant, round-robin.

    B by B, every implementation warms up, then each round times one search of
    each in turn: on a machine whose load moves during a run, every
    implementation sees the same load, so ratios between them are measured
    side by side. With one implementation it is :func:`time_search`.
    """
    records = []
    for B in batches:
        for run in runs.values():
            for _ in range(warmup):
                run(B)
        for r in range(rounds):
            for impl, run in runs.items():
                start, cpu_start = time.perf_counter(), time.process_time()
                run(B)
                seconds = time.perf_counter() - start
                # the process's CPU time over the wall clock: ~1 for one thread; above 1 means the
                # implementation ran on more than one core despite the one-thread flags
                cpu_per_wall = (time.process_time() - cpu_start) / seconds
                rec = {"impl": impl, "variant": variant, "B": int(B), "round": r, "seconds": seconds,
                       "searches_per_s": B / seconds, "cpu_per_wall": round(cpu_per_wall, 3), **extra}
                emit(rec)
                records.append(rec)
    return records


def common_args(description: str):
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--case", required=True, help="the .npz written by export_case.py")
    parser.add_argument("--variants", default="muzero,gumbel_muzero,stochastic_muzero,efficientzero",
                        help="comma-separated search variants to time")
    parser.add_argument("--batches", default=None, help="comma-separated batch sizes (default: the case's)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--check-only", action="store_true", help="check the network, time nothing")
    return parser


def batches_of(args, case: dict) -> list[int]:
    if args.batches:
        return [int(b) for b in args.batches.split(",")]
    return [int(b) for b in case["batches"]]
