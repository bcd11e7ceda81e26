"""Test kit for signed KV values: the secret a test's tier signs with, and
settings that name it.

Tiers sign their values with ``SECRET`` from the variable ``SECRET_ENV``
(set in this process on first use) unless a test names another secret or
``unsigned``: as a user's tier must (settings.py refuses neither).
"""

from __future__ import annotations

import os

from vllm_uma.kv_offload.mac_keys import parse_keys

SECRET_ENV = "VLLM_UMA_TEST_KV_SECRET"
SECRET = "a3f1" * 16  # 64 characters, as `openssl rand -hex 32` gives
SIGNING = ("secret_file", "secret_env", "unsigned")
KEYS = parse_keys(SECRET, "the kit's secret")  # what a tier of the kit signs with


def signed(settings: dict) -> dict:
    """``settings`` with the kit's secret unless they say how to sign."""
    if any(k in settings for k in SIGNING):
        return settings
    os.environ.setdefault(SECRET_ENV, SECRET)
    return {**settings, "secret_env": SECRET_ENV}
