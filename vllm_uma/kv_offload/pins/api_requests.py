"""API server process: the pins API's requests, read and checked, and its errors.

Shared by the pins routes (http_api.py) and the bundle routes
(http_bundles.py); ``vllm-uma serve --warm`` checks its file with the same
keys (warm.py), before vLLM is imported: nothing here imports vLLM at
module level.
"""

from __future__ import annotations

import json
from typing import Any

from vllm_uma.kv_offload.pins import book
from vllm_uma.kv_offload.pins.request_keys import PIN_PARAM
from vllm_uma.log import human_size

PREFIX = "/v1/uma/pins"
PROMPT_KEYS = ("prompt", "messages", "prompt_token_ids")
KNOWN_KEYS = frozenset({"name", "ttl_s", "model", *PROMPT_KEYS})
MAX_BODY = 16 << 20  # a 32k-token prompt as JSON is well under 1 MiB


class ApiError(Exception):
    """An answer other than 200: its status and the message, sent in vLLM's
    error shape (``error_body``)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = status


def disk_settings(vllm_app):
    """The disk tier's settings from the server's plan (pins live in its
    ledger); ApiError 400 without one."""
    from vllm_uma.plugin.settings_plan import SettingsPlanError, read_plan

    try:
        plan = read_plan(vllm_app.state.vllm_config)
    except SettingsPlanError as exc:
        raise ApiError(400, f"pins need the vllm-uma platform: {exc}") from None
    disk = None if plan.offload is None else plan.offload.disk
    if disk is None:
        raise ApiError(
            400,
            "pins live in the disk KV tier's ledger, and this server has none: serve with an "
            "fs tier in 'secondary_tiers' (docs/sessions.md).",
        )
    return disk


async def json_body(receive) -> Any:
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ApiError(400, "the client went away before the body was read")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise ApiError(400, f"the body is over {human_size(MAX_BODY)}")
        chunks.append(chunk)
        if not message.get("more_body"):
            break
    try:
        return json.loads(b"".join(chunks))
    except ValueError as exc:
        raise ApiError(400, f"the body is not JSON ({exc})") from None


def pin_request(body: Any) -> dict:
    if not isinstance(body, dict):
        raise ApiError(
            400, f"the body must be a JSON object with a name and a prompt, not {body!r:.80}"
        )
    unknown = sorted(set(body) - KNOWN_KEYS)
    if unknown:
        raise ApiError(400, f"unknown key(s) {unknown}; the known keys are {sorted(KNOWN_KEYS)}.")
    given = [key for key in PROMPT_KEYS if body.get(key) is not None]
    if len(given) != 1:
        raise ApiError(
            400,
            f"give exactly one of {list(PROMPT_KEYS)} (the prefix to pin); got {given or 'none'}.",
        )
    return body


def warm_request(vllm_app, request: dict) -> tuple[str, dict]:
    """vLLM's endpoint and body for the prompt: one token out, the pin asked."""
    args = vllm_app.state.args
    model = request.get("model") or (args.served_model_name or [args.model])[0]
    common = {"model": model, "max_tokens": 1, "kv_transfer_params": {PIN_PARAM: True}}
    if request.get("messages") is not None:
        return "/v1/chat/completions", {**common, "messages": request["messages"]}
    prompt = request.get("prompt")
    return "/v1/completions", {
        **common,
        "prompt": request["prompt_token_ids"] if prompt is None else prompt,
    }


def namespace_arg(value: str | None) -> bytes | None:
    return book.namespace_arg(value, f"GET {PREFIX}")


def error_body(status: int, message: str) -> dict:
    kind = {
        400: "BadRequestError",
        404: "NotFoundError",
        405: "MethodNotAllowed",
        409: "ConflictError",
        413: "PayloadTooLargeError",
        503: "ServiceUnavailableError",
    }
    return {
        "error": {
            "message": message,
            "type": kind.get(status, "InternalServerError"),
            "code": status,
        }
    }
