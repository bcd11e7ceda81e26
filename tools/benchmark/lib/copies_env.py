"""The environment a benchmark runs a process under, with or without the
engine core's streaming copies (vllm_uma/kv_offload/streaming_copies.py).

Any value of the tunable already in the environment (the user's, or ours)
is taken out first, so that "cached" means glibc's own threshold and
"streamed" means the engine core's.
"""

from __future__ import annotations

import os

from vllm_uma.kv_offload.streaming_copies import ENV, SETTING, TUNABLE


def copies_environment(streamed: bool) -> dict[str, str]:
    """A copy of this process's environment, GLIBC_TUNABLES set for
    ``streamed`` copies or glibc's own (the variable dropped if empty)."""
    env = dict(os.environ)
    others = [item for item in env.get(ENV, "").split(":") if item and not item.startswith(TUNABLE)]
    value = ":".join([*others, SETTING] if streamed else others)
    if value:
        env[ENV] = value
    else:
        env.pop(ENV, None)
    return env
