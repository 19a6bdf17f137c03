#!/usr/bin/env bash
# Create ./.venv and install the attention suite into it, editable.
#
#   bash scripts/bootstrap.sh            # the default install
#   bash scripts/bootstrap.sh dev        # plus the test tools (any extras: "dev,mt")
#   bash scripts/bootstrap.sh dev,sampler   # plus PyG's neighbour sampler (torch-sparse, a source build)
#
# TORCH_SPEC chooses the torch build (default torch==2.13.0; e.g. TORCH_SPEC=torch for the
# newest release from PyPI, or a CUDA wheel of your choice). torch is installed first so
# that the project's range (torch>=2.2,<3) is satisfied by it and nothing else is pulled.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-}"
python="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$python" -m venv .venv
.venv/bin/python -m pip install --quiet --upgrade pip
.venv/bin/python -m pip install --quiet "${TORCH_SPEC:-torch==2.13.0}"
# scatter and sampler are source builds that need the installed torch: a second install without build isolation
plain=() built=()
IFS=, read -ra names <<< "$extras"
for name in "${names[@]}"; do
    case "$name" in scatter|sampler) built+=("$name") ;; *) plain+=("$name") ;; esac
done
plain_list=$(IFS=,; echo "${plain[*]}")
.venv/bin/python -m pip install --quiet -e ".${plain_list:+[$plain_list]}"
if [ ${#built[@]} -gt 0 ]; then
    built_list=$(IFS=,; echo "${built[*]}")
    echo "building ${built_list} against the installed torch (several minutes per package on 2 cores, once per pip cache)"
    .venv/bin/python -m pip install --quiet "setuptools>=77" wheel  # the build backend, outside isolation
    .venv/bin/python -m pip install --quiet --no-build-isolation -e ".[$built_list]"
fi
echo "attention suite installed in $(pwd)/.venv"
