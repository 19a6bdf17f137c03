#!/usr/bin/env bash
# Create ./.venv and install the attention suite into it, editable.
#
#   bash scripts/bootstrap.sh            # the default install
#   bash scripts/bootstrap.sh dev        # plus the test tools (any extras: "dev,mt")
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
.venv/bin/python -m pip install --quiet -e ".${extras:+[$extras]}"
echo "attention suite installed in $(pwd)/.venv"
