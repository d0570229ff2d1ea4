"""The prepared GPU check: what a lent CUDA machine measures, in under 8 minutes, as one JSON file.

Run on the GPU machine from the repository root (``benchmarks/gpu_check.sh``
builds the C++ kernel first and calls this):

    python benchmarks/gpu_check.py --out "$OUT/gpu_check.json"

Three parts, each its own section of the JSON (a part that fails records its
error and the others still run):

* ``search``: the canonical search case (``benchmarks/test_search_bench.py``:
  a MuZero MLP with latent 64, hidden 64, 601-bin supports, 6 actions, 50
  simulations) at B = 64 / 256 / 1024 roots: the torch search path on the GPU
  (``backend="torch"``, the whole tree in tensor ops on the device) against
  the C++ kernel on the CPU (``backend="cpp"``: the fused search, network
  included), on one thread and on every core. searches/s = B / seconds per
  search (median of the rounds, CUDA synchronised).
* ``learner``: ``Learner.step()`` of the Atari ResNet (the shipped ``env=Pong``
  model and loss) at batch 256 on the GPU, its buffer filled with synthetic
  Pong frames (``benchmarks/test_atari_bench.py``'s ``SyntheticAtari``):
  updates/s (median), and the same on the CPU with every core for the ratio.
* ``pong``: ``muzero_async.py env=Pong device=cuda`` for ``--pong-seconds``
  of wall clock (collectors and evaluator as shipped, the learner on the
  GPU), then the run's ``summary.json``: env steps/s, updates/s, the
  learner's busy fraction, policy lag.

``--device cpu --quick`` runs every part small on the CPU: the harness's own
check (``benchmarks/test_gpu_check.py``), no GPU needed.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_seconds(fn, device: torch.device, rounds: int, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    _sync(device)
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ---------------------------------------------------------------------------------------------- search
def search_part(device: torch.device, batches: list[int], rounds: int) -> dict:
    from torchrl_muzero.mcts import MCTSConfig, search
    from torchrl_muzero.mcts import _cpp
    from torchrl_muzero.modules import MuZeroMLPModel

    torch.manual_seed(0)
    model = MuZeroMLPModel((8,), 6, latent_dim=64, hidden_dim=64, value_support_size=300,
                           reward_support_size=300, zero_init_heads=False).eval()
    kernel = _cpp.load_tree_ops() is not None
    rows = []
    for B in batches:
        obs = torch.randn(B, 8, generator=torch.Generator().manual_seed(B))
        row: dict = {"B": B}
        dev_model = model.to(device)
        dev_obs = obs.to(device)
        cfg = MCTSConfig(num_simulations=50, backend="torch")
        g = torch.Generator(device=device).manual_seed(0)
        sec = _median_seconds(lambda: search(dev_model, dev_obs, cfg, generator=g), device, rounds)
        row[f"torch_{device.type}_searches_per_s"] = round(B / sec, 1)
        model.to("cpu")
        if kernel:
            cfg = MCTSConfig(num_simulations=50, backend="cpp")
            cpu = torch.device("cpu")
            for threads in (1, os.cpu_count() or 1):
                torch.set_num_threads(threads)
                gc = torch.Generator().manual_seed(0)
                sec = _median_seconds(lambda: search(model, obs, cfg, generator=gc), cpu, rounds)
                row[f"cpp_cpu_{threads}t_searches_per_s"] = round(B / sec, 1)
            torch.set_num_threads(os.cpu_count() or 1)
            best_cpu = max(v for k, v in row.items() if k.startswith("cpp_cpu_"))
            row[f"torch_{device.type}_over_best_cpp_cpu"] = round(row[f"torch_{device.type}_searches_per_s"]
                                                                  / best_cpu, 3)
        rows.append(row)
        print(f"search B={B}: {row}", flush=True)
    return {"case": "MuZeroMLPModel((8,), 6, latent 64, hidden 64, supports 300), 50 simulations",
            "kernel": kernel, "rows": rows}


# --------------------------------------------------------------------------------------------- learner
def learner_part(device: torch.device, batch_size: int, transitions: int, rounds: int) -> dict:
    from test_atari_bench import NUM_ACTIONS, OBS_SHAPE, SyntheticAtari, _pong_config

    from torchrl_muzero.trainers.builders import build_buffer, build_model
    from torchrl_muzero.trainers.learner import Learner

    out = {"batch_size": batch_size, "transitions": transitions}
    for where in dict.fromkeys([device.type, "cpu"]):  # the GPU, then the CPU with every core for the ratio
        dev = device if where == device.type else torch.device("cpu")
        cfg = _pong_config(f"optim.batch_size={batch_size}", f"buffer.capacity={transitions + 2000}",
                           f"device={dev.type}")
        torch.manual_seed(0)
        model = build_model(cfg, OBS_SHAPE, NUM_ACTIONS)
        buffer = build_buffer(cfg)
        stream = SyntheticAtari(seed=1)
        for _ in range(max(1, transitions // (8 * 32))):
            buffer.extend(stream.rollout(32))
        learner = Learner(model, buffer, cfg, dev)
        sec = _median_seconds(learner.step, dev, rounds)
        out[f"{where}_updates_per_s"] = round(1 / sec, 3)
        out[f"{where}_seconds_per_update"] = round(sec, 4)
        print(f"learner on {where}: {1 / sec:.2f} updates/s at batch {batch_size}", flush=True)
    if device.type != "cpu":
        out[f"{device.type}_over_cpu"] = round(out[f"{device.type}_updates_per_s"] / out["cpu_updates_per_s"], 2)
    return out


# ------------------------------------------------------------------------------------------------ pong
def pong_part(device: torch.device, seconds: int, run_dir: Path, overrides: list[str]) -> dict:
    script = ROOT / "sota-implementations" / "muzero" / "muzero_async.py"
    cmd = [sys.executable, str(script), "env=Pong", f"device={device.type}", f"train.max_wall_time_s={seconds}",
           "train.stop_return=1000", f"run_dir={run_dir}", *overrides]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 240)
    wall = time.perf_counter() - t0
    summary_path = run_dir / "summary.json"
    if not summary_path.exists():
        raise RuntimeError(f"no summary.json (exit {proc.returncode}): {proc.stderr[-2000:]}")
    summary = json.loads(summary_path.read_text())
    run_wall = float(summary.get("wall_s") or wall)
    out = {"command": " ".join(cmd[1:]), "exit_code": proc.returncode, "process_wall_s": round(wall, 1),
           "summary": summary,
           "env_steps_per_s": round(summary.get("env_steps", 0) / max(run_wall, 1e-9), 1),
           "updates_per_s": round(summary.get("train_iter", 0) / max(run_wall, 1e-9), 3)}
    for key in ("learner_busy_fraction", "policy_lag_mean", "policy_lag_max", "learner_threads_mean"):
        if key in summary:
            out[key] = summary[key]
    print(f"pong: {out['env_steps_per_s']} env steps/s, {out['updates_per_s']} updates/s, "
          f"busy {out.get('learner_busy_fraction')}, lag {out.get('policy_lag_mean')}", flush=True)
    return out


# ------------------------------------------------------------------------------------------------ main
def machine() -> dict:
    info = {"python": platform.python_version(), "torch": torch.__version__, "cpus": os.cpu_count(),
            "platform": platform.platform()}
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    return info


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "gpu_check.json"))
    parser.add_argument("--device", default="cuda", help="cuda (the check) or cpu (--quick: the harness's test)")
    parser.add_argument("--quick", action="store_true", help="every part small (seconds, not minutes)")
    parser.add_argument("--parts", default="search,learner,pong")
    parser.add_argument("--pong-seconds", type=int, default=240)
    parser.add_argument("--pong-override", action="append", default=[],
                        help="an extra hydra override for the Pong run (repeatable)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; run it on a GPU machine, or --device cpu --quick for the "
              "harness's own check.", file=sys.stderr)
        return 2
    out_path = Path(args.out)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    report: dict = {"machine": machine(), "started": time.strftime("%Y-%m-%d %H:%M:%S"), "quick": args.quick}
    parts = [p.strip() for p in args.parts.split(",") if p.strip()]
    plans = {
        "search": lambda: search_part(device, [8, 16] if args.quick else [64, 256, 1024], 1 if args.quick else 5),
        "learner": lambda: learner_part(device, 8 if args.quick else 256, 600 if args.quick else 10240,
                                        1 if args.quick else 5),
        "pong": lambda: pong_part(device, 20 if args.quick else args.pong_seconds, out_path.parent / "pong_run",
                                  (["async_pipeline.num_evaluator_actors=0", "optim.batch_size=8",
                                    "train.train_start_after_envsteps=100", "buffer.capacity=2000"]
                                   if args.quick else []) + args.pong_override),
    }
    unknown = [p for p in parts if p not in plans]
    if unknown:
        print(f"gpu_check: --parts has {unknown}; allowed: {sorted(plans)}.", file=sys.stderr)
        return 2
    for name in parts:
        t0 = time.perf_counter()
        try:
            report[name] = plans[name]()
        except Exception as err:  # noqa: BLE001 - one part failing must not lose the others' figures
            report[name] = {"error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-3000:]}
            print(f"gpu_check: part {name} failed: {err}", file=sys.stderr, flush=True)
        report[name]["part_wall_s"] = round(time.perf_counter() - t0, 1)
        out_path.write_text(json.dumps(report, indent=2))  # after each part: a timeout keeps what finished
    print(f"gpu_check: wrote {out_path}")
    return 0 if all("error" not in report[p] for p in parts) else 1


if __name__ == "__main__":
    sys.exit(main())
