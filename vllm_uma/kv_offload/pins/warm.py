"""``vllm-uma serve --warm FILE``: pin a list of prefixes once the server answers.

Runs in the API server process (the ``vllm-uma serve`` command's own), on
a daemon thread started before vLLM's server: it waits for /health, then
POSTs each entry of FILE to the server's own ``/v1/uma/pins`` over
loopback (with the server's API key), one at a time, and logs each pin and
a last line. So /health answers as soon as vLLM is ready, whatever the
warm-up costs, and a warm-up is exactly the pin a user makes by hand: the
prompt prefilled where no tier holds it, its blocks stored and pinned.

FILE is a JSON list of pin requests, the body of POST /v1/uma/pins each:
``[{"name": "system", "prompt": "...", "ttl_s": 86400}, ...]``. It is read
and checked by the preflight, before vLLM loads (``read_warm_file``): a
file that cannot be read, is not such a list, or names a pin twice is
refused in one line. What only the engine can tell (a prompt too long for
the model, a pin over budget) is logged as a warning and the next entry
goes on.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from vllm_uma.kv_offload.pins import book
from vllm_uma.kv_offload.pins.api_requests import KNOWN_KEYS, PROMPT_KEYS
from vllm_uma.kv_offload.pins.metrics import WARM_UP_HEADER

MAX_FILE_BYTES = 64 << 20
READY_WAIT_S = 3600.0  # a first start that compiles takes minutes, never an hour
PIN_TIMEOUT_S = 1800.0  # one 30k-token prefill on a slow CPU


class WarmFileError(ValueError):
    """The --warm file cannot be used; the message names the entry and the fix."""


def read_warm_file(path: str) -> list[dict[str, Any]]:
    """The pins FILE asks for, checked as far as can be without the engine."""
    where = f"--warm {path}"
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise WarmFileError(f"{where}: cannot be read ({exc.strerror}).") from None
    if len(raw) > MAX_FILE_BYTES:
        raise WarmFileError(f"{where}: is over {MAX_FILE_BYTES >> 20} MiB; split it.")
    try:
        entries = json.loads(raw)
    except ValueError as exc:
        raise WarmFileError(f"{where}: is not JSON ({exc}).") from None
    if not isinstance(entries, list) or not entries:
        raise WarmFileError(
            f"{where}: must be a non-empty JSON list of pins, e.g. "
            f'[{{"name": "system", "prompt": "...", "ttl_s": 86400}}].'
        )
    names = set()
    for i, entry in enumerate(entries):
        at = f"{where}: entry {i}"
        if not isinstance(entry, dict):
            raise WarmFileError(f"{at} is {type(entry).__name__}, not an object.")
        unknown = sorted(set(entry) - KNOWN_KEYS)
        if unknown:
            raise WarmFileError(f"{at}: unknown key(s) {unknown}; known: {sorted(KNOWN_KEYS)}.")
        given = [key for key in PROMPT_KEYS if entry.get(key) is not None]
        if len(given) != 1:
            raise WarmFileError(f"{at}: give exactly one of {list(PROMPT_KEYS)}; got {given}.")
        try:
            book.check_name(entry.get("name"))
            book.check_ttl(entry.get("ttl_s"))
        except book.PinError as exc:
            raise WarmFileError(f"{at}: {exc}") from None
        if entry["name"] in names:
            raise WarmFileError(f"{at}: the name {entry['name']!r} is pinned twice.")
        names.add(entry["name"])
    return entries


def loopback_url(host: str | None, port: int, tls: bool) -> str:
    """The server's own address, from its --host: loopback for a wildcard."""
    if host in (None, "", "0.0.0.0"):
        host = "127.0.0.1"
    elif host == "::":
        host = "::1"
    if ":" in host:
        host = f"[{host}]"
    return f"{'https' if tls else 'http'}://{host}:{port}"


def start_warm_up(entries: list[dict], url: str, api_key: str | None, logger) -> threading.Thread:
    thread = threading.Thread(
        target=_warm_up, args=(entries, url, api_key, logger), name="uma-warm-up", daemon=True
    )
    thread.start()
    return thread


def _warm_up(entries: list[dict], url: str, api_key: str | None, logger) -> None:
    import requests

    headers = {WARM_UP_HEADER: "1"}  # counted apart (pins/metrics.py)
    if api_key is not None:
        headers["Authorization"] = f"Bearer {api_key}"
    # The server's own certificate, on loopback: there is nothing to verify
    # it against here (the CA is the user's), and nothing leaves the host.
    verify = not url.startswith("https")
    if not _wait_ready(requests, url, verify):
        logger.warning("Warm-up: %s/health never answered; no prefix was pinned.", url)
        return
    logger.info("Warm-up: pinning %d prefix(es) from the --warm file.", len(entries))
    done, started = 0, time.monotonic()
    for i, entry in enumerate(entries, 1):
        try:
            reply = requests.post(
                f"{url}/v1/uma/pins",
                json=entry,
                headers=headers,
                timeout=PIN_TIMEOUT_S,
                verify=verify,
            )
        except requests.RequestException as exc:
            logger.warning("Warm-up %d/%d %r: %s", i, len(entries), entry["name"], exc)
            continue
        body = _json(reply)
        if reply.status_code != 200:
            message = (body.get("error") or {}).get("message") if isinstance(body, dict) else None
            logger.warning(
                "Warm-up %d/%d %r not pinned (%d): %s",
                i, len(entries), entry["name"], reply.status_code, message or reply.text[:300],
            )  # fmt: skip
            continue
        done += 1
        logger.info(
            "Warm-up %d/%d: %r pinned, %d tokens, %d blocks, in %.1f s.",
            i, len(entries), entry["name"], body["tokens"], body["blocks"], body["seconds"],
        )  # fmt: skip
    logger.info(
        "Warm-up done: %d of %d prefix(es) pinned in %.1f s.",
        done,
        len(entries),
        time.monotonic() - started,
    )


def _wait_ready(requests, url: str, verify: bool) -> bool:
    deadline = time.monotonic() + READY_WAIT_S
    while time.monotonic() < deadline:
        try:
            if requests.get(f"{url}/health", timeout=5, verify=verify).status_code == 200:
                return True
        except requests.RequestException:
            pass
        time.sleep(1)
    return False


def _json(reply) -> Any:
    try:
        return reply.json()
    except ValueError:
        return None
