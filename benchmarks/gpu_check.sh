#!/usr/bin/env bash
# The prepared GPU check (benchmarks/gpu_check.py says what it measures): run it whenever a GPU machine is
# lent, from the repository root, and put its figures in docs/performance_gpu.md with the machine it names.
#   bash benchmarks/gpu_check.sh            # writes $OUT/gpu_check.json (OUT defaults to the temp folder)
# Needs torch with CUDA and the package's dependencies importable; builds the C++ kernel in place first (for
# the CPU side of the search comparison; without it that column is left out).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-${TMPDIR:-/tmp}/torchrl_muzero_gpu_check}"
mkdir -p "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
MAX_JOBS="$(nproc)" timeout 120 python setup.py build_ext --inplace > "$OUT/kernel_build.log" 2>&1 \
  || echo "gpu_check: the C++ kernel did not build (see $OUT/kernel_build.log); the CPU search column is left out"
timeout 440 python benchmarks/gpu_check.py --out "$OUT/gpu_check.json" "$@" 2>&1 | tee "$OUT/gpu_check.log"
