#!/usr/bin/env bash
# What a lent GPU machine needs to run the GPU suite (benchmarks/gpu_suite.py) or the GLUE grid
# (scripts/reproduce_glue_table.py) from this checkout, in .gpu/ (ignored by git, small enough to travel with the
# working tree):
#   .gpu/wheels  the packages the GPU image lacks (entmax, omegaconf, subword-nmt and mock, sacremoses,
#                torch-optimizer and pytorch-ranger), for CPython 3.12 on x86-64, without dependencies (the
#                image has the rest; pycocoevalcap is left out: its wheel is 100 MB of Java jars, and
#                tests/gpu skips the captioning run without it or without java);
#   .gpu/data    the data the suite reads: planetoid/Cora (GAT) and mt/multi30k (MT); with --glue also glue/
#                MRPC, RTE, CoLA and STS-B;
#   .gpu/models  with --glue: all-MiniLM-L6-v2 with its weights rounded to float16 (45 MB instead of 91: the
#                full weights do not fit in what a call carries), loaded as float32 there (nlu.model). Its
#                directory name, all-MiniLM-L6-v2-fp16, is the encoder the GLUE table names for these runs.
#
#   bash scripts/gpu_bundle.sh [--glue] [DATA_ROOT]   # here: pack (DATA_ROOT defaults to $ATTN_DATA_ROOT)
#   bash scripts/gpu_bundle.sh --run [ARGS]           # there: install into /tmp/site, run the suite (ARGS: its
#                                                     # options, e.g. --budget-minutes 5 --parts dense-bam mcan),
#                                                     # copy its summary.md and suite.json to $OUT (or
#                                                     # ./gpu-results), also when the suite fails or is stopped
#   bash scripts/gpu_bundle.sh --run-glue [ARGS]      # there: the GLUE grid on the float16-rounded MiniLM into
#                                                     # runs/glue-gpu (ARGS: the grid's, e.g. --tasks CoLA --seeds 5
#                                                     # --jobs 10 --stop-after 5); a rerun resumes it. Its table and
#                                                     # the runs' small files (no checkpoints) go to $OUT
# There, export ATTN_SOURCE_COMMIT=<the commit here> first: the runs record it (the .git that travels with the
# tree can be an older commit's, and git then calls the tree that commit, dirty).
set -euo pipefail
cd "$(dirname "$0")/.."
install_wheels() {
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/wheels/*
  export PYTHONPATH="/tmp/site:$(pwd)"
}
if [ "${1:-}" = "--run" ]; then
  install_wheels
  out="${OUT:-gpu-results}"
  mkdir -p "$out"
  trap 'cp /tmp/gpu-suite/summary.md /tmp/gpu-suite/suite.json "$out"/ 2>/dev/null || true' EXIT
  python3 -m benchmarks.gpu_suite --out /tmp/gpu-suite --data-root .gpu/data "${@:2}"
  exit
fi
if [ "${1:-}" = "--run-glue" ]; then
  install_wheels
  out="${OUT:-gpu-results}" runs=runs/glue-gpu
  mkdir -p "$out" "$runs"
  trap 'cp "$runs"/table.md "$runs"/table.json "$out"/ 2>/dev/null || true
        tar czf "$out/glue-runs.tgz" --exclude="checkpoints" --exclude="*.pt" -C "$runs" . 2>/dev/null || true' EXIT
  python3 scripts/reproduce_glue_table.py --model .gpu/models/all-MiniLM-L6-v2-fp16 --data-root .gpu/data \
    --out "$runs" "${@:2}"
  exit
fi
glue=0
if [ "${1:-}" = "--glue" ]; then glue=1; shift; fi
data="$(cd "${1:-${ATTN_DATA_ROOT:?give the data root as the first argument or export ATTN_DATA_ROOT}}" && pwd)"
rm -rf .gpu
mkdir -p .gpu/wheels .gpu/data/planetoid .gpu/data/mt
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .gpu/wheels "entmax==1.3" "omegaconf>=2.4" "subword-nmt>=0.3.8" mock "sacremoses>=0.1" "torch-optimizer>=0.3" \
  "pytorch-ranger>=0.1.1"
cp -r "$data/planetoid/Cora" .gpu/data/planetoid/
cp -r "$data/mt/multi30k" .gpu/data/mt/
if [ "$glue" = 1 ]; then
  mkdir -p .gpu/data/glue .gpu/models
  for task in MRPC RTE CoLA STS-B; do cp -r "$data/glue/$task" .gpu/data/glue/; done
  "${PYTHON:-.venv/bin/python}" - <<'EOF'
import shutil
from safetensors.torch import load_file, save_file
from nlu.pretrained import WEIGHTS, resolve_model

source, target = resolve_model("minilm-l6"), ".gpu/models/all-MiniLM-L6-v2-fp16"
shutil.copytree(source, target, ignore=shutil.ignore_patterns(WEIGHTS))
weights = load_file(source / WEIGHTS)
save_file({k: v.half() if v.is_floating_point() else v for k, v in weights.items()}, f"{target}/{WEIGHTS}",
          metadata={"format": "pt"})
EOF
fi
du -sh .gpu
echo "carry .gpu and run: bash scripts/gpu_bundle.sh --run$([ "$glue" = 1 ] && echo " (or --run-glue GRID ARGS)")"
