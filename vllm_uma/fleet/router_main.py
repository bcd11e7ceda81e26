"""vllm-router with the fleet's API key, read from a file rather than argv.

    python -m vllm_uma.fleet.router_main KEY_FILE [vllm-router flags]

vllm-router 0.1.17 sends its ``--api-key`` to the workers on its own calls
(the render endpoints kv_aware tokenizes with, worker discovery, the paths
it proxies as they are) and takes it from the command line only, where
every user of the host reads it (``/proc/PID/cmdline``). Its launcher is
Python (``vllm_router.launch_router``): this is that launcher, with
``RouterArgs.api_key`` set from the file after its own parser read the rest.
Nothing else changes: the same Rust router, flags and signals.
"""

from __future__ import annotations

import sys

from vllm_uma.fleet.api_key import ApiKeyError, read_key_file

PROG = "vllm_uma.fleet.router_main"


def main(argv: list[str]) -> int:
    if not argv:
        print(f"{PROG}: usage: KEY_FILE [vllm-router flags]", file=sys.stderr)
        return 2
    key_file, flags = argv[0], argv[1:]
    if "--api-key" in flags or any(f.startswith("--api-key=") for f in flags):
        print(f"{PROG}: error: the key comes from {key_file}: remove --api-key.", file=sys.stderr)
        return 2
    try:
        keys = read_key_file(key_file)
    except ApiKeyError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        return 2
    from vllm_router.launch_router import launch_router, parse_router_args

    router_args = parse_router_args(flags)
    router_args.api_key = keys.sent
    launch_router(router_args)  # until SIGTERM or SIGINT, as the vllm-router command
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
