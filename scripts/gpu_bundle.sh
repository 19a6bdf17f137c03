#!/usr/bin/env bash
# What a lent GPU machine needs to run the GPU suite (benchmarks/gpu_suite.py) from this checkout, in .gpu/
# (ignored by git, small enough to travel with the working tree):
#   .gpu/wheels  the packages the GPU image lacks (entmax, omegaconf, subword-nmt and mock, sacremoses,
#                torch-optimizer and pytorch-ranger), for CPython 3.12 on x86-64, without dependencies (the
#                image has the rest; pycocoevalcap is left out: its wheel is 100 MB of Java jars, and
#                tests/gpu skips the captioning run without it or without java);
#   .gpu/data    the data the suite reads: planetoid/Cora (GAT) and mt/multi30k (MT).
#
#   bash scripts/gpu_bundle.sh [DATA_ROOT]     # here: pack (DATA_ROOT defaults to $ATTN_DATA_ROOT)
#   bash scripts/gpu_bundle.sh --run [ARGS]    # there: install into /tmp/site, run the suite (ARGS: its
#                                              # options, e.g. --budget-minutes 5 --parts dense-bam mcan), copy
#                                              # its summary.md and suite.json to $OUT (or ./gpu-results), also
#                                              # when the suite fails or is stopped
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--run" ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/wheels/*
  export PYTHONPATH="/tmp/site:$(pwd)"
  out="${OUT:-gpu-results}"
  mkdir -p "$out"
  trap 'cp /tmp/gpu-suite/summary.md /tmp/gpu-suite/suite.json "$out"/ 2>/dev/null || true' EXIT
  python3 -m benchmarks.gpu_suite --out /tmp/gpu-suite --data-root .gpu/data "${@:2}"
  exit
fi
data="$(cd "${1:-${ATTN_DATA_ROOT:?give the data root as the first argument or export ATTN_DATA_ROOT}}" && pwd)"
rm -rf .gpu
mkdir -p .gpu/wheels .gpu/data/planetoid .gpu/data/mt
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .gpu/wheels "entmax==1.3" "omegaconf>=2.4" "subword-nmt>=0.3.8" mock "sacremoses>=0.1" "torch-optimizer>=0.3" \
  "pytorch-ranger>=0.1.1"
cp -r "$data/planetoid/Cora" .gpu/data/planetoid/
cp -r "$data/mt/multi30k" .gpu/data/mt/
du -sh .gpu
echo "carry .gpu and run: bash scripts/gpu_bundle.sh --run"
