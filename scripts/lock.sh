#!/usr/bin/env bash
# Regenerate requirements.lock (make lock): pip's resolve of what
# scripts/install.sh installs, with the interpreter install.sh would choose
# (PYTHON, or scripts/choose_python.sh's choice). Needs PyPI and the torch
# wheel (pip's configuration, or VLLM_UMA_TORCH_WHEELS=DIR); installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=scripts/choose_python.sh
source scripts/choose_python.sh
python=$(choose_python) || exit 1
exec "$python" scripts/lock.py "$@"
