"""vllm-uma: a vLLM hardware plugin for unified-memory machines.

vLLM discovers the plugin through the ``vllm.platform_plugins`` entry point
(see pyproject.toml) and calls :func:`register` in every process that resolves
``vllm.platforms.current_platform``: the API server, the engine core and each
worker. Registration must therefore be cheap, import nothing heavy and be safe
to run many times.
"""

from __future__ import annotations

import sys

PLATFORM_QUALNAME = "vllm_uma.plugin.platform.UmaPlatform"


def register() -> str | None:
    """Return the platform class vLLM should use, or None to stay out.

    The plugin drives vLLM's CPU backend, which this package only supports on
    Linux (the memory accounting reads /proc). Elsewhere it declines, so vLLM
    falls back to its own platform detection.
    """
    if not sys.platform.startswith("linux"):
        return None
    from vllm_uma.lifeline import follow_api_server

    # In the engine core, vLLM's first call into us: from here on it stops
    # when its API server exits (lifeline.py). Elsewhere it does nothing.
    follow_api_server()
    return PLATFORM_QUALNAME
