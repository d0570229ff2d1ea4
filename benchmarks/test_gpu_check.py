"""The GPU check's harness itself, on the CPU (no GPU needed): every part runs small and lands in the JSON.

Run: python -m pytest -q benchmarks/test_gpu_check.py
"""
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def test_quick_run_on_the_cpu_writes_every_part(tmp_path):
    out = tmp_path / "gpu_check.json"
    proc = subprocess.run([sys.executable, str(HERE / "gpu_check.py"), "--device", "cpu", "--quick",
                           "--parts", "search,learner", "--out", str(out)], capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    report = json.loads(out.read_text())
    assert [row["B"] for row in report["search"]["rows"]] == [8, 16]
    assert all(row["torch_cpu_searches_per_s"] > 0 for row in report["search"]["rows"])
    assert report["learner"]["cpu_updates_per_s"] > 0
    assert report["machine"]["torch"] == __import__("torch").__version__


def test_no_cuda_is_one_line_and_exit_2(tmp_path):
    import torch

    if torch.cuda.is_available():  # this check is about a machine without one
        return
    proc = subprocess.run([sys.executable, str(HERE / "gpu_check.py"), "--out", str(tmp_path / "x.json")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no CUDA device" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
