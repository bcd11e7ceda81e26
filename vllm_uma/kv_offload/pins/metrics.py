"""API server process: the pins API's counters, on vLLM's /metrics.

The pins API runs in the API server (http_api.py), where vLLM serves
/metrics from prometheus_client's registry (its own multiprocess one when
``PROMETHEUS_MULTIPROC_DIR`` is set): these counters go there, beside
vLLM's. The disk tier's gauges of pinned blocks come from the engine core
with its other metrics (disk/reports.py).
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter

# How a pin was asked for: a request to the API, or `serve --warm FILE`.
VIA_API, VIA_WARM_UP = "api", "warm_up"
WARM_UP_HEADER = "x-vllm-uma-warm-up"


class PinMetrics:
    def __init__(self, registry: CollectorRegistry):
        self.requests = Counter(
            "vllm:kv_offload_pin_requests",
            "Pin requests (POST /v1/uma/pins, serve --warm) by outcome: pinned, "
            "over_budget (refused with the numbers), refused (a bad request).",
            labelnames=("outcome", "via"),
            registry=registry,
        )
        self.tokens = Counter(
            "vllm:kv_offload_pinned_prompt_tokens",
            "Prompt tokens of the pins made: each pin prefilled what no tier held "
            "(a warm-up) or restored the rest.",
            labelnames=("via",),
            registry=registry,
        )
